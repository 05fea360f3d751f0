"""Qwen3-VL-MoE end to end, emulated: optimum-rbln 0.12's real MoE compile, load and generate on qvl's CPU emulator.

The tiny Qwen3-VL-MoE (qvl tiny-model --moe: 4 experts, top 2, layer 1 dense) compiles through
``RBLNAutoModelForImageTextToText`` into ``RBLNQwen3VLMoeForConditionalGeneration``, whose expert layers call
``rbln_custom_ops.custom_moe_glu`` (emulated in ``qwenvl_rbln/backends/emulator/moe.py``). Its greedy tokens must
equal the reference backend's (transformers' ``Qwen3VLMoeForConditionalGeneration``) for an image, a video and text,
and its logits agree within 1e-4 in fp32; a wrong routing renormalisation compiled into the graphs must fail that.
"""

from __future__ import annotations

import json
from importlib import util
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(util.find_spec("optimum.rbln") is None, reason="optimum-rbln is not installed")

from tests.emulated_rbln import emulated_model, generate_logits, image_prompt_inputs  # noqa: E402
from tests.fake_media import write_sweep_video  # noqa: E402
from tests.fakes_rbln import run_main  # noqa: E402

N = 6  # new tokens per request
PRESET = "cpu-tiny-moe-rbln"


@pytest.fixture(scope="module", autouse=True)
def emulator_scope():
    from tests.emulated_rbln import emulator_on

    with emulator_on():
        yield


@pytest.fixture(scope="module")
def tiny_moe() -> Path:
    from qwenvl_rbln.backends.tiny.model import ensure_tiny_model

    return ensure_tiny_model(moe=True)


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import numpy as np
    from PIL import Image

    d = tmp_path_factory.mktemp("moe-media")
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 255, (384, 512, 3), dtype=np.uint8)).save(d / "img.png")
    return {"image": d / "img.png", "video": write_sweep_video(d / "clip.mp4"), "dir": d}


def _compile(out: Path, *, use_cache: bool = True) -> Path:
    from qwenvl_rbln.jobs.compile_job import run_compile
    from qwenvl_rbln.memory.planner import estimate_plan
    from qwenvl_rbln.planning.plan import build_plan

    plan = build_plan(PRESET, [], output_dir=str(out))
    run_compile(plan, estimate_plan(plan), use_cache=use_cache, heartbeat_s=0)
    return out


@pytest.fixture(scope="module")
def art(tiny_moe: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _compile(tmp_path_factory.mktemp("moe") / "art")


@pytest.fixture(scope="module")
def art_wrong_routing(tiny_moe: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same compile with the router's top-k weights left un-renormalised (softmax over all experts, then top-k:
    ``renormalize=False``), although Qwen3-VL-MoE renormalises them: the negative control."""
    from optimum.rbln.transformers.models.qwen3_vl_moe import qwen3_vl_moe_architecture as arch

    real = arch.compute_masked_routing_weight_softmax_first

    def wrong(router_logits: Any, top_k: int, renormalize: bool) -> Any:
        return real(router_logits, top_k=top_k, renormalize=False)

    arch.compute_masked_routing_weight_softmax_first = wrong
    try:
        return _compile(tmp_path_factory.mktemp("moe") / "wrong", use_cache=False)
    finally:
        arch.compute_masked_routing_weight_softmax_first = real


def _infer(capsys: Any, *args: str) -> dict:
    code, out, err = run_main(["infer", *args, "--json", "--max-new-tokens", str(N)], capsys)
    assert code == 0, err
    return json.loads(out)


def test_compile_uses_the_moe_class_and_the_expert_op(art: Path):
    from qwenvl_rbln.artifacts.emulated import read_metadata
    from qwenvl_rbln.artifacts.layout import check_layout, read_artifact_config
    from qwenvl_rbln.artifacts.manifest import read_manifest

    kind, cfg = read_artifact_config(art)
    assert cfg["cls_name"] == "RBLNQwen3VLMoeForConditionalGenerationConfig"
    assert cfg["visual"]["cls_name"] == "RBLNQwen3VLMoeVisionModelConfig"
    assert check_layout(art, kind, cfg, read_manifest(art))["ok"]
    for graph in ("prefill", "decoder_batch_1"):
        header = read_metadata(art / f"{graph}.rbln")["header"]
        # 2 sparse layers (0 and 2) call the expert op; layer 1 (mlp_only_layers) stays a dense MLP
        assert header.count('"rbln_custom_ops::custom_moe_glu.default"') == 2, graph


def test_the_planner_counts_the_weights_the_compiled_graph_holds(art: Path):
    """Every expert of every sparse layer, the routers, the dense layer's MLP, attention, norms and lm_head: the
    planner's lm.weights for the tiny MoE (fp32) equals the tensors of the emulated prefill graph (0-d constants,
    the attention scales, aside)."""
    from qwenvl_rbln.backends.emulator.graph import load_file
    from qwenvl_rbln.memory.params import lm_params
    from qwenvl_rbln.planning.catalogue.modelinfo import load_geometry

    header, tensors = load_file(art / "prefill.rbln")
    aliases = header.get("aliases") or {}
    held = sum(t.numel() * t.element_size() for k, t in tensors.items() if k not in aliases and t.dim() > 0)
    geometry, _ = load_geometry(str(art))
    assert geometry.text.moe is not None
    assert held == lm_params(geometry.text)["device"] * 4


def test_load_check_accepts_the_moe_artifact(art: Path, capsys):
    code, out, err = run_main(["load-check", str(art), "--emulate", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["ok"] is True and d["runtime"]["ok"] is True and d["emulated"] is True


def test_tokens_equal_the_reference_for_image_video_and_text(art, tiny_moe, media, capsys):
    requests = [
        {"id": "image", "prompt": "Describe this image.", "images": [str(media["image"])]},
        {"id": "video", "prompt": "What happens in the video?", "video": str(media["video"])},
        {"id": "text", "prompt": "Say hello to the user.", "system": "Be brief."},
    ]
    batch = media["dir"] / "requests.jsonl"
    batch.write_text("".join(json.dumps(r) + "\n" for r in requests))
    emu = _infer(capsys, str(art), "--emulate", "--batch-file", str(batch))
    ref = _infer(capsys, str(tiny_moe), "--batch-file", str(batch))
    assert emu["backend"] == "rbln" and emu["emulated"] is True and ref["backend"] == "torch"
    got = {r["id"]: r["token_ids"] for r in emu["requests"]}
    want = {r["id"]: r["token_ids"] for r in ref["requests"]}
    assert got == want and all(len(t) == N for t in got.values())
    assert len({tuple(t) for t in got.values()}) == 3  # three different continuations: the inputs matter


# -------------------------------------------------------------------------------- logits vs transformers


@pytest.fixture(scope="module")
def logits_inputs(tiny_moe, media):
    return image_prompt_inputs(tiny_moe, media["image"])


@pytest.fixture(scope="module")
def reference_logits(tiny_moe, logits_inputs):
    from transformers import Qwen3VLMoeForConditionalGeneration

    model = Qwen3VLMoeForConditionalGeneration.from_pretrained(str(tiny_moe)).eval()
    return generate_logits(model, logits_inputs, N)


def _emulated_logits(art: Path, inputs: Any) -> tuple[list[int], Any]:
    model = emulated_model(art)
    assert type(model).__name__ == "RBLNQwen3VLMoeForConditionalGeneration"
    return generate_logits(model, inputs, N)


def test_logits_agree_with_transformers_in_fp32(art, logits_inputs, reference_logits):
    tokens, logits = _emulated_logits(art, logits_inputs)
    ref_tokens, ref_logits = reference_logits
    assert tokens == ref_tokens
    assert (logits - ref_logits).abs().max().item() < 1e-4


def test_negative_control_wrong_routing_renormalisation_fails(art_wrong_routing, logits_inputs, reference_logits):
    """Top-k weights that do not sum to 1 change every sparse layer's output: the comparison above must catch it."""
    _, logits = _emulated_logits(art_wrong_routing, logits_inputs)
    _, ref_logits = reference_logits
    assert (logits - ref_logits).abs().max().item() > 1e-2


# ------------------------------------------------------------------------------------- the op on its own


def test_custom_moe_glu_equals_transformers_sparse_moe_block():
    """The emulated op, called as optimum-rbln calls it, against transformers' Qwen3VLMoeTextSparseMoeBlock."""
    import torch
    from optimum.rbln.transformers.utils.moe import compute_masked_routing_weight_softmax_first, split_fused_experts
    from transformers.models.qwen3_vl_moe.configuration_qwen3_vl_moe import Qwen3VLMoeTextConfig
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextSparseMoeBlock

    cfg = Qwen3VLMoeTextConfig(hidden_size=32, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16)
    torch.manual_seed(0)
    block = Qwen3VLMoeTextSparseMoeBlock(cfg).eval()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(1, 7, 32)
    with torch.no_grad():
        want = block(x)[0]
        logits = torch.nn.functional.linear(x[0], block.gate.weight)
        gate, up, down = split_fused_experts(block.experts)
        routing = compute_masked_routing_weight_softmax_first(logits, top_k=2, renormalize=True)
        got = torch.ops.rbln_custom_ops.custom_moe_glu(
            hidden_states=x[0],
            gate_proj_weight=gate,
            up_proj_weight=up,
            down_proj_weight=down,
            masked_routing_weight=routing,
            hidden_act="silu",
        )
        assert (got - want).abs().max().item() < 1e-5
        assert ((routing > 0).sum(dim=0) == 2).all()  # top-2 of 6 experts per token
        wrong = compute_masked_routing_weight_softmax_first(logits, top_k=2, renormalize=False)
        off = torch.ops.rbln_custom_ops.custom_moe_glu(x[0], gate, up, down, wrong, "silu")
        assert (off - want).abs().max().item() > 1e-2
        with pytest.raises(NotImplementedError, match="gelu"):
            torch.ops.rbln_custom_ops.custom_moe_glu(x[0], gate, up, down, routing, "gelu")
