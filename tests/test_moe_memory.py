"""Qwen3-VL-MoE in the planner: geometry from config.json or built in, weight and KV bytes pinned against
transformers' own Qwen3VLMoeForConditionalGeneration built on the meta device (no weights, no downloads), the
custom_moe_glu workspace range, quantization (a bound in bf16 terms; refused in 0.12), and the verdicts of 30B-A3B
and 235B-A22B."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qwenvl_rbln.errors import DoesNotFit, InputError
from qwenvl_rbln.memory.kv import kv_block_bytes_per_tensor, kv_tensor_count
from qwenvl_rbln.memory.params import lm_params, vision_params
from qwenvl_rbln.memory.planner import estimate_plan
from qwenvl_rbln.memory.verdicts import ensure_fits
from qwenvl_rbln.planning.catalogue.devices import GiB, MiB
from qwenvl_rbln.planning.catalogue.modelinfo import (
    QWEN3_VL_30B_A3B,
    QWEN3_VL_235B_A22B,
    QWEN3_VL_TINY_MOE,
    geometry_from_config,
    load_geometry,
)
from qwenvl_rbln.planning.plan import build_plan
from tests.helpers_cli import run_qvl
from tests.moe_configs import config_json

ID_30B = "Qwen/Qwen3-VL-30B-A3B-Instruct"
ID_235B = "Qwen/Qwen3-VL-235B-A22B-Instruct"


def meta_model(geometry: Any) -> Any:
    """transformers' own Qwen3VLMoeForConditionalGeneration for this geometry, on the meta device."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    cfg = config_json(geometry)
    text = {k: v for k, v in cfg["text_config"].items() if k not in ("model_type", "rope_scaling", "rope_theta")}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20]}
    vision = {k: v for k, v in cfg["vision_config"].items() if k != "model_type"}
    config = tf.Qwen3VLMoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=cfg["tie_word_embeddings"])
    with torch.device("meta"):
        return tf.Qwen3VLMoeForConditionalGeneration(config)


def _count(params: Any) -> int:
    return sum(p.numel() for p in params)


def _item(report: Any, name: str, device: int = 0) -> Any:
    dev = next(d for d in report.devices if d.device == device)
    return next(i for i in dev.items if i.name == name)


# --- geometry --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("geometry", [QWEN3_VL_30B_A3B, QWEN3_VL_235B_A22B, QWEN3_VL_TINY_MOE], ids=lambda g: g.name)
def test_a_local_config_json_gives_the_built_in_geometry(geometry, tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(config_json(geometry)))
    got, _ = load_geometry(str(tmp_path))
    assert got.text == geometry.text and got.text.moe is not None
    assert got.vision == geometry.vision


def test_the_built_in_table_covers_instruct_and_thinking():
    for size, geom in (("30B-A3B", QWEN3_VL_30B_A3B), ("235B-A22B", QWEN3_VL_235B_A22B)):
        for variant in ("Instruct", "Thinking"):
            got, _ = load_geometry(f"Qwen/Qwen3-VL-{size}-{variant}")
            assert got.text == geom.text and "built-in" in got.source
    assert QWEN3_VL_30B_A3B.vision.depth == 27 and QWEN3_VL_30B_A3B.vision.out_hidden_size == 2048
    assert QWEN3_VL_235B_A22B.vision.out_hidden_size == 4096


def test_transformers_5_spelling_num_local_experts_is_read():
    cfg = config_json(QWEN3_VL_TINY_MOE)
    cfg["text_config"]["num_local_experts"] = cfg["text_config"].pop("num_experts")
    assert geometry_from_config(cfg, "t", "x").text.moe == QWEN3_VL_TINY_MOE.text.moe


def test_the_mlp_only_layers_and_sparse_step_decide_which_layers_are_sparse():
    m = QWEN3_VL_TINY_MOE.text.moe
    assert [m.is_sparse(i) for i in range(3)] == [True, False, True]
    stepped = type(m)(8, 2, 16, decoder_sparse_step=2, mlp_only_layers=(3,))
    assert [stepped.is_sparse(i) for i in range(6)] == [False, True, False, False, False, True]


# --- weights and KV against transformers' model on the meta device -------------------------------------------


@pytest.mark.parametrize("geometry", [QWEN3_VL_30B_A3B, QWEN3_VL_235B_A22B, QWEN3_VL_TINY_MOE], ids=lambda g: g.name)
def test_param_counts_match_transformers_moe_model(geometry):
    model = meta_model(geometry)
    lm, vis = model.model.language_model, model.model.visual
    lp, vp = lm_params(geometry.text), vision_params(geometry.vision)
    named = dict(lm.named_parameters())
    assert _count(lm.layers.parameters()) == lp["layers"]
    assert _count(p for n, p in named.items() if ".mlp.experts." in n) == lp["experts"]
    assert _count(p for n, p in named.items() if ".mlp.gate." in n) == lp["router"]
    dense = [n for n in named if n.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"))]
    assert _count(named[n] for n in dense) == lp["dense_mlp"]
    assert model.lm_head.weight.numel() == lp["lm_head"] and _count(lm.norm.parameters()) == lp["norm"]
    assert _count(lm.embed_tokens.parameters()) == lp["embed_tokens_host"]
    assert vp["device"] + vp["patch_embed_host"] + vp["pos_embed_host"] == _count(vis.parameters())


def test_30b_a3b_weight_and_kv_bytes_are_pinned_to_transformers():
    """lm.weights = every device-resident LM parameter (layers incl. all experts, final norm, untied lm_head) in
    bf16; KV per 8192-token block = 2 x attention layers x k_proj outputs x 8192 x 2 B, both read off the model."""
    model = meta_model(QWEN3_VL_30B_A3B)
    lm = model.model.language_model
    device_params = _count(lm.layers.parameters()) + _count(lm.norm.parameters()) + model.lm_head.weight.numel()
    kv_width = sum(layer.self_attn.k_proj.out_features for layer in lm.layers)  # layers x kv heads x head_dim
    report = estimate_plan(build_plan("rebel100-30b-a3b"))
    weights = _item(report, "lm.weights")
    assert weights.exact and weights.bytes == device_params * 2 == 60_441_915_392  # about 60.4 GB
    per_block = kv_tensor_count(QWEN3_VL_30B_A3B) * kv_block_bytes_per_tensor(QWEN3_VL_30B_A3B, 8192)
    assert per_block == 2 * kv_width * 8192 * 2 == 768 * MiB
    kv = _item(report, "lm.kv_cache")
    assert kv.exact and kv.bytes == 96 * 768 * MiB  # batch 3 x 32 blocks of the full 262144 context
    assert _item(report, "visual.weights").bytes == 534_206_576 * 2  # 27 blocks + mergers, out_hidden 2048


def test_235b_weights_are_pinned_to_transformers():
    model = meta_model(QWEN3_VL_235B_A22B)
    lm = model.model.language_model
    device_params = _count(lm.layers.parameters()) + _count(lm.norm.parameters()) + model.lm_head.weight.numel()
    assert lm_params(QWEN3_VL_235B_A22B.text)["device"] * 2 == device_params * 2 == 468_942_609_408  # ~469 GB


def test_tiny_moe_weights_equal_what_optimum_rbln_put_in_the_graph():
    """The device weights of the tiny MoE as counted here = the bytes of optimum-rbln 0.12's wrapped LM's
    parameters and buffers (split gate/up/down expert buffers, the router Linear, the dense layer's MLP)."""
    from tests.emulated_rbln import emulator_on, optimum_rbln_installed

    if not optimum_rbln_installed():
        pytest.skip("optimum-rbln is not installed")
    with emulator_on():
        from optimum.rbln.transformers.models.qwen3_vl_moe.qwen3_vl_moe_architecture import Qwen3VLMoeLayer

        model = meta_model(QWEN3_VL_TINY_MOE)
        lm = model.model.language_model
        wrapped = [Qwen3VLMoeLayer(layer, layer.self_attn) for layer in lm.layers]
    held = {id(t): t for w in wrapped for t in list(w.parameters()) + list(w.buffers())}
    lp = lm_params(QWEN3_VL_TINY_MOE.text)
    assert sum(t.numel() for t in held.values()) == lp["layers"]
    assert [type(w.mlp).__name__ for w in wrapped] == ["Qwen3VLMoeSparseMoeBlock", "Qwen3VLMoeTextMLP"] + [
        "Qwen3VLMoeSparseMoeBlock"
    ]


# --- verdicts --------------------------------------------------------------------------------------------------


def test_30b_a3b_preset_fits_at_the_high_end_and_the_vit_on_npu1_variant_too():
    for preset in ("rebel100-30b-a3b", "rebel100-30b-a3b-vit-npu1"):
        report = estimate_plan(build_plan(preset))
        assert report.verdict == "fits", preset
        assert all(d.usable_bytes - d.total_high_bytes > 5 * GiB for d in report.devices), preset
        assert report.kv["outcome"] == "full" and report.kv["num_blocks"] == 96
        ensure_fits(report)  # exit 0
    # one more row, or the full 16384-patch bucket beside the LM, no longer fits at the high end
    bigger = estimate_plan(build_plan("rebel100-30b-a3b", ["batch_size=4", "decoder_batch_sizes=[1,2,4]"]))
    assert bigger.verdict != "fits"
    vit = estimate_plan(build_plan("rebel100-30b-a3b", ["visual.max_seq_len=[1024,4096,16384]"]))
    assert vit.verdict != "fits"


def test_moe_workspace_range_and_assumption_are_stated():
    report = estimate_plan(build_plan("rebel100-30b-a3b"))
    ws = _item(report, "lm.moe_workspace")
    assert not ws.exact and ws.low_bytes < ws.high_bytes
    # high: every expert for every token of the 512-row prefill chunk + decoder rows 1, 2, 3
    rows = 512 + 1 + 2 + 3
    assert ws.high_bytes == rows * 128 * (3 * 768 + 2048) * 2
    assert "rebel-compiler decides" in ws.note and "qwen3_vl_moe_architecture.py" in ws.note


def test_the_moe_note_says_quantization_grows_the_weights_in_0_12():
    """W1.9: the bf16-terms saving is only a bound (0.84 GiB int8, 1.26 GiB int4); 0.12 loads in float32 and
    cannot load Qwen's fused experts, and the note says so."""
    report = estimate_plan(build_plan("rebel100-30b-a3b"))
    note = next(n for n in report.notes if n.startswith("Qwen3-VL-MoE"))
    assert "28.99 B expert parameters" in note and "unquantized" in note and "1.5 %" in note
    assert "862.69 MiB" in note and "1.26 GiB with int4" in note  # 0.8425 GiB int8, 1.264 GiB int4
    assert "float32" in note and "110.05 GiB" in note and "transpose" in note and "refuses" in note


def test_a_quantized_moe_is_refused_before_compile_with_both_reasons():
    """W2: 0.12 copies the fused experts without transformers' transpose (the load raises), and its float32 load
    takes the 30B LM weights from 56.29 to 110.05 GiB: refused (exit 2) in the dry run and the compile alike."""
    with pytest.raises(InputError) as exc:
        build_plan("rebel100-30b-a3b", ['quantization={"weights":"int8"}'])
    line = exc.value.one_line()
    assert "Qwen3-VL-30B-A3B" in line and "transpose" in line and "size mismatch" in line
    assert "56.29 GiB in bf16 to 110.05 GiB" in line and "--set quantization=null" in line
    for dry in (["--dry-run"], []):
        res = run_qvl("compile", *dry, "-p", "rebel100-30b-a3b", "--set", 'quantization={"weights":"int8"}')
        assert res.exit_code == 2, res.stderr
        assert "transpose" in res.stderr and "110.05 GiB" in res.stderr and "Traceback" not in res.stderr
    ok = run_qvl(
        "compile",
        "--dry-run",
        "-p",
        "rebel100-30b-a3b",
        "--set",
        'quantization={"weights":"int8"}',
        "--set",
        "quantization=null",
    )
    assert ok.exit_code == 0, ok.stderr  # the fix the hint gives works


def test_the_tiny_moe_note_prints_readable_units():
    """D27: a tiny model's note gave '0.00 B expert parameters ... 0.00 GiB'."""
    report = estimate_plan(build_plan("cpu-tiny-moe"))
    note = next(n for n in report.notes if n.startswith("Qwen3-VL-MoE"))
    experts = lm_params(QWEN3_VL_TINY_MOE.text)["experts"]
    assert f"the {experts:,} expert parameters" in note and "0.00" not in note and "KiB" in note


def test_235b_does_not_fit_names_what_it_needs_and_suggests_nothing():
    report = estimate_plan(build_plan("rebel100-1npu", model=ID_235B))
    assert report.verdict == "does_not_fit" and report.suggestions == []
    note = next(n for n in report.notes if n.startswith("the LM weights alone"))
    assert "436.74 GiB" in note and "at least 4 cards" in note and "30B-A3B" in note
    with pytest.raises(DoesNotFit) as exc:
        ensure_fits(report)
    assert "rebel100-30b-a3b" in exc.value.one_line() and "--set" not in exc.value.one_line()


def test_235b_dry_run_exits_4_without_a_suggestion():
    res = run_qvl("compile", "--dry-run", "--json", "-p", "rebel100-1npu", "--model", ID_235B)
    assert res.exit_code == 4
    data = json.loads(res.stdout)
    assert data["memory"]["verdict"] == "does_not_fit" and data["memory"]["suggestions"] == []
    assert "LM weights alone exceed one card" in data["error"]["hint"]
    quant = run_qvl(
        "compile",
        "--dry-run",
        "--json",
        "-p",
        "rebel100-1npu",
        "--model",
        ID_235B,
        "--set",
        'quantization={"weights":"int8"}',
    )
    assert quant.exit_code == 2 and "transpose" in json.loads(quant.stdout)["error"]["message"]


def test_the_reason_235b_cannot_span_cards_is_rebel100s_not_optimum_rbln():
    """W3: optimum-rbln 0.12 passes num_devices to the compiler for this model; Rebel100 has no RSD."""
    report = estimate_plan(build_plan("rebel100-1npu", model=ID_235B))
    note = next(n for n in report.notes if n.startswith("the LM weights alone"))
    assert "does not offer" not in note and "RSD" in note and "not supported on Rebel100" in note


def test_more_rebel100s_do_not_make_235b_fit():
    """One model spans one Rebel100 in optimum-rbln 0.12: num_devices=4 does not split the experts in the plan."""
    plan = build_plan("rebel100-1npu", ["num_devices=4", "placement.visual_device=4"], model=ID_235B)
    report = estimate_plan(plan)
    assert report.verdict == "does_not_fit" and report.suggestions == []
    weights = _item(report, "lm.weights")
    assert weights.bytes == lm_params(QWEN3_VL_235B_A22B.text)["device"] * 2 and "one Rebel100" in weights.note


def test_30b_a3b_dry_run_exits_0():
    for preset in ("rebel100-30b-a3b", "rebel100-30b-a3b-vit-npu1"):
        res = run_qvl("compile", "--dry-run", "--json", "-p", preset)
        assert res.exit_code == 0, res.stderr
        data = json.loads(res.stdout)
        assert data["memory"]["verdict"] == "fits" and data["memory"]["suggestions"] == []
