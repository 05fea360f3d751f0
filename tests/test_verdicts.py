"""Issue 12: memory verdicts CI can gate on. Each test pins one item with a case the old planner got wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qwenvl_rbln.cli import app
from qwenvl_rbln.errors import DoesNotFit, InputError
from qwenvl_rbln.memory.kv import align_up, kv_tensor_bytes
from qwenvl_rbln.memory.params import lm_params
from qwenvl_rbln.memory.planner import estimate_plan
from qwenvl_rbln.planning.catalogue.devices import GiB, MiB, parse_optimum_byte_size
from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.views import render
from tests.helpers_cli import run_qvl

NO_CAL: dict = {}
VERDICTS = {"fits", "does_not_fit", "uncertain"}

# Qwen3-VL-32B-Instruct's shape (dense); any dense Qwen3-VL size is planned from its own config.json.
CFG_32B = {
    "model_type": "qwen3_vl",
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "tie_word_embeddings": False,
    "text_config": {
        "hidden_size": 5120,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 25600,
        "vocab_size": 151936,
        "max_position_embeddings": 262144,
    },
    "vision_config": {
        "depth": 27,
        "hidden_size": 1152,
        "num_heads": 16,
        "intermediate_size": 4304,
        "out_hidden_size": 5120,
        "deepstack_visual_indexes": [8, 16, 24],
    },
}


def est(preset: str, sets: list[str] | None = None, **kw):
    plan = build_plan(preset, sets or [], model=kw.pop("model", None))
    return estimate_plan(plan, calibration=NO_CAL, **kw)


def item(report, name: str, device: int = 0):
    return next(i for i in report.device(device).items if i.name == name)


def invoke(*args: str):
    render.reset_consoles()
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", "NO_COLOR": "1"})
    render.reset_consoles()
    return result


def refused(preset: str, sets: list[str], *needles: str) -> str:
    with pytest.raises(InputError) as exc:
        build_plan(preset, sets)
    line = exc.value.one_line()
    assert exc.value.exit_code == 2 and "\n" not in line
    for needle in needles:
        assert needle in line, line
    return line


# --- 1. model size ---------------------------------------------------------------------------------


def test_a_model_without_config_or_cited_numbers_is_refused_not_planned_with_2b_numbers():
    r = run_qvl("compile", "--dry-run", "-p", "rebel100-1npu", "--model", "Qwen/Qwen3-VL-9B-Instruct")
    assert r.exit_code == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    assert "--model='Qwen/Qwen3-VL-9B-Instruct'" in line and "config.json" in line and "directory" in line
    assert "fits" not in r.stdout


def test_a_preset_model_key_without_config_names_the_key(tmp_path: Path):
    preset = tmp_path / "p.yaml"
    preset.write_text("extends: rebel100-1npu\nmodel: acme/Qwen3-VL-8B-Custom\n")
    line = refused(str(preset), [], "model='acme/Qwen3-VL-8B-Custom'", "config.json")
    assert str(preset) in line or "p.yaml" in line


def test_dense_32b_from_its_config_json_is_planned_with_its_own_numbers(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(CFG_32B))
    r = est("rebel100-1npu", model=str(tmp_path))
    lp = lm_params(build_plan("rebel100-1npu", model=str(tmp_path)).geometry.text)
    weights = item(r, "lm.weights")
    assert weights.bytes == lp["device"] * 2 and weights.exact and weights.bytes > 55 * GiB
    assert item(r, "lm.kv_cache").bytes == 64 * GiB  # 2 x 64 layers x 8 kv heads x 128 x 2 B x 262144
    assert r.verdict != "fits"  # the 2B numbers said "fits, 82 GiB free"
    res = run_qvl("compile", "--dry-run", "--json", "-p", "rebel100-1npu", "--model", str(tmp_path))
    assert res.exit_code == 4 and json.loads(res.stdout)["memory"]["verdict"] in ("does_not_fit", "uncertain")


def test_qwen3_vl_moe_without_expert_fields_is_refused_rather_than_counted_dense(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({**CFG_32B, "model_type": "qwen3_vl_moe"}))
    with pytest.raises(InputError) as exc:
        build_plan("rebel100-1npu", model=str(tmp_path))
    assert "num_experts" in exc.value.one_line() and "config.json" in exc.value.one_line()


# --- 2. quantization -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "needles"),
    [
        ('{"format":"rbln"}', ["cannot be both fp16"]),
        ('{"weights":"int3"}', ["quantization.weights='int3'", "int4, int8, fp8, fp16"]),
        ('{"bogus":1}', ["quantization.bogus", "format, weights, activations, kv_caches"]),
        ('{"format":"gguf","weights":"int8"}', ["quantization.format='gguf'", "rbln"]),
        ('{"weights":"int8","activations":"int4"}', ["activations='int4'", "int8, fp8, fp16"]),
        ('{"weights":"int8","kv_caches":"int8"}', ["kv_caches='int8'", "fp8, fp16"]),
        ('{"kv_caches":"fp8"}', ["cannot be both fp16"]),
        ('{"weights":"fp16","activations":"fp8"}', ["Invalid quantization weights: fp16"]),
        ('{"precision":"w8a8"}', ["precision='w8a8'"]),
    ],
)
def test_quantization_is_validated_as_rbln_quantization_config(value, needles):
    refused("rebel100-1npu", [f"quantization={value}"], "rbln_config.quantization", *needles)


def test_quantization_accepted_spellings_resolve_as_optimum_rbln():
    r = build_plan("rebel100-1npu", ['quantization={"precision":"w4a16"}']).resolved
    assert r.quantization == {
        "format": "rbln",
        "weights": "int4",
        "activations": "fp16",
        "kv_caches": "fp16",
        "dynamic": False,
    }


def test_fp8_kv_halves_the_kv_and_quantized_weights_shrink():
    base = est("rebel100-1npu")
    q = est("rebel100-1npu", ['quantization={"weights":"int8","kv_caches":"fp8"}'])
    assert item(q, "lm.kv_cache").bytes == item(base, "lm.kv_cache").bytes // 2 == 14 * GiB
    assert q.kv["dtype_bytes"] == 1 and q.kv["num_blocks"] == 32
    assert item(q, "lm.weights").bytes < item(base, "lm.weights").bytes
    assert not item(q, "lm.weights").exact  # modelled from optimum-rbln's source
    int4 = est("rebel100-1npu", ['quantization={"weights":"int4","kv_caches":"fp8"}'])
    assert item(int4, "lm.weights").bytes < item(q, "lm.weights").bytes
    assert any("float32" in n for n in q.notes)


def test_fp8_kv_block_count_follows_optimum_rbln_search():
    """Batch 16 at 262144 with fp8 KV: the automatic count is the largest n with 14 x align_2MiB(n x 8 MiB) plus the
    LM's non-KV share fitting one 35 GiB chiplet (optimum-rbln's _search_num_kvcache_blocks)."""
    r = est("rebel100-1npu", ["batch_size=16", 'quantization={"weights":"int8","kv_caches":"fp8"}'])
    nonkv = item(r, "lm.weights").bytes + item(r, "lm.workspace").bytes
    per_chiplet = 35 * GiB - -(-nonkv // 4)

    def fits(n: int) -> bool:
        return 14 * align_up(n * 8 * MiB) <= per_chiplet

    n = r.kv["num_blocks"]
    assert r.kv["outcome"] == "partial" and fits(n) and not fits(n + 1)
    assert item(r, "lm.kv_cache").bytes == 56 * align_up(n * 8 * MiB)


# --- 3. memory_budget ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["100GiB", "1.5GB", "100G", "100 GiB", "0.5GB"])
def test_memory_budget_spellings_parse_byte_size_refuses_are_refused(value):
    line = refused("rebel100-1npu", [f'memory_budget="{value}"'], f"memory_budget='{value}'")
    assert "parse_byte_size" in line and "'100GB'" in line


@pytest.mark.parametrize(("value", "expected"), [('"100GB"', 100 * GiB), ('"512MB"', 512 * MiB), ('"80%"', 0.8)])
def test_memory_budget_spellings_optimum_rbln_accepts(value, expected):
    assert build_plan("rebel100-1npu", [f"memory_budget={value}"]).resolved.memory_budget == expected


def test_memory_budget_hints_only_suggest_accepted_spellings():
    for sets in (["memory_budget=200GB"], ["memory_budget=3"], ['memory_budget="1.5GB"']):
        with pytest.raises(InputError) as exc:
            build_plan("rebel100-1npu", sets)
        hint = exc.value.hint or ""
        for token in hint.replace(",", " ").split():
            token = token.strip("'\"()")
            if token and token[0].isdigit() and token[-1] in "BbKMGT":
                assert parse_optimum_byte_size(token) is not None, (sets, token)
    assert parse_optimum_byte_size("100GiB") is None and parse_optimum_byte_size("140GB") == 140 * GiB
    # the planner's own memory_budget suggestion goes back through the validator unchanged
    r = est("rebel100-1npu-batch4", ["max_seq_len=262144"])
    (sug,) = [s for s in r.suggestions if s["kind"] == "memory_budget"]
    build_plan("rebel100-1npu-batch4", ["max_seq_len=262144", *sug["set"]])


def test_a_byte_budget_applies_per_device_with_num_devices_2():
    """optimum-rbln resolves memory_budget against one device's DRAM: 70GB on each of 2 devices = 0.5 of each."""
    sets = ["batch_size=8", "num_devices=2"]
    by_bytes = est("rebel100-1npu-batch4", [*sets, "max_seq_len=262144", 'memory_budget="70GB"'])
    by_share = est("rebel100-1npu-batch4", [*sets, "max_seq_len=262144", "memory_budget=0.5"])
    assert by_bytes.kv["num_blocks"] == by_share.kv["num_blocks"]
    assert by_bytes.kv["budget_bytes"] == 70 * GiB


# --- 4. missing or wrong items ---------------------------------------------------------------------


def test_use_attention_mask_counts_the_prefill_mask_input():
    base = est("rebel100-1npu")
    masked = est("rebel100-1npu", ["use_attention_mask=true"])
    mask = item(masked, "lm.attention_mask")
    assert mask.bytes == 512 * 262144 * 2 + 1 * 262144 * 2  # prefill 256 MiB + decoder_batch_1
    assert masked.device(0).total_bytes == base.device(0).total_bytes + mask.bytes


def test_the_vit_score_buffer_is_placed_whole_on_one_chiplet():
    r = est("rebel100-1npu")
    chip = r.device(0).chiplets
    kv_share = 14 * kv_tensor_bytes(build_plan("rebel100-1npu").geometry, 8192, 32)
    assert chip["fullest_bytes"] >= kv_share + 16 * GiB  # the 16 x 16384^2 fp32 scores are one tensor
    even = (r.device(0).total_bytes + 3) // 4
    assert chip["fullest_bytes"] > even


def test_no_unsourced_rsd_warning():
    plan = build_plan("rebel100-1npu", ["num_devices=2"])
    text = " ".join(plan.warnings)
    assert "RSD unsupported" not in text and "does not shard" not in text
    assert "version_matrix" in text and "accepts it" in text


# --- 5. honest margins -----------------------------------------------------------------------------


def test_every_item_has_a_range_and_modelled_ranges_are_wide():
    r = est("rebel100-1npu")
    for it in r.device(0).items:
        assert it.low_bytes <= it.bytes <= it.high_bytes
        if it.exact:
            assert it.low_bytes == it.bytes == it.high_bytes
        else:
            assert it.low_bytes < it.bytes < it.high_bytes
    d = r.to_dict()["devices"][0]
    assert d["total_low_bytes"] < d["total_bytes"] < d["total_high_bytes"]


def test_verdict_field_on_report_devices_and_suggestions():
    d = est("rebel100-1npu-batch4", ["max_seq_len=262144"]).to_dict()
    assert d["verdict"] == "does_not_fit"
    assert all(dev["verdict"] in VERDICTS for dev in d["devices"])
    assert d["suggestions"] and all(s["verdict"] == "fits" for s in d["suggestions"])
    assert all(dev["verdict"] in VERDICTS for s in d["suggestions"] for dev in s["devices"])


def test_a_margin_inside_the_range_is_uncertain_and_the_gate_exits_4_unless_uncertain_ok():
    r = est("rebel100-1npu-batch4", ["max_seq_len=253952"])  # the old planner: fits by 1.71 GiB
    assert r.verdict == "uncertain" and r.fits is None
    assert any(n.startswith("uncertain:") for n in r.device(0).notes)
    res = invoke("compile", "--dry-run", "--json", "-p", "rebel100-1npu-batch4", "--set", "max_seq_len=253952")
    assert isinstance(res.exception, DoesNotFit) and "uncertain" in res.exception.message
    assert json.loads(res.stdout)["memory"]["verdict"] == "uncertain"
    ok = invoke(
        "compile", "--dry-run", "--json", "--uncertain-ok", "-p", "rebel100-1npu-batch4", "--set", "max_seq_len=253952"
    )
    assert ok.exit_code == 0, ok.output


def test_the_documents_cases_keep_their_observed_verdicts_and_cite_them():
    cases = [
        ("rebel100-1npu", [], "fits", 32),
        ("rebel100-1npu-batch4", ["max_seq_len=262144"], "does_not_fit", 128),
        ("rebel100-1npu-batch4", [], "fits", 16),
        ("rebel100-2npu-batch4", [], "fits", 128),
    ]
    for preset, sets, verdict, blocks in cases:
        r = est(preset, sets)
        assert r.verdict == verdict and r.kv["num_blocks"] == blocks, (preset, sets)
        for dev in r.devices:
            assert dev.verdict == verdict and dev.verdict_source.startswith("observed: the product document")


def test_a_suggestion_is_offered_only_with_margin_to_spare():
    """The old planner offered visual.max_seq_len=[15792], 2.9 MB from the limit, as a fix."""
    r = est("rebel100-1npu-batch4", ["max_seq_len=262144"])
    (vit,) = [s for s in r.suggestions if s["kind"] == "visual.max_seq_len"]
    assert vit["vit_buckets"][-1] < 15792
    assert est("rebel100-1npu-batch4", ["max_seq_len=262144", "visual.max_seq_len=[15792]"]).verdict != "fits"
    for sug in r.suggestions:
        assert sug["margin_low_bytes"] >= 0 and sug["chiplet_margin_low_bytes"] >= 0


# --- 6. every planner answer agrees with the planner -----------------------------------------------


def test_bucket_plan_exits_4_when_the_plan_does_not_fit():
    r = run_qvl("bucket-plan", "-p", "rebel100-1npu-batch4", "--set", "max_seq_len=262144", "--size", "512x512")
    assert r.exit_code == 4, r.stdout + r.stderr
    assert "will not fit" in r.stderr and "--set max_seq_len=" in r.stderr


def test_optimize_decoder_does_not_recommend_what_the_dry_run_refuses(tmp_path: Path):
    trace = tmp_path / "trace.txt"
    trace.write_text("4\n4\n1\n1\n2\n")
    res = invoke("bucket-plan", "-p", "rebel100-1npu", "--batch-trace", str(trace), "--optimize-decoder", "2")
    opt_set = None
    for line in res.stdout.splitlines():
        if line.startswith("use:"):
            opt_set = line
    assert opt_set is None, opt_set  # batch 4 at 262144 beside the ViT: no plain "use:"
    assert "not recommended as is" in res.stdout and "does not fit in its own dry run" in res.stdout
    res = invoke("bucket-plan", "--json", "-p", "rebel100-1npu", "--batch-trace", str(trace), "--optimize-decoder", "2")
    mem = json.loads(res.stdout)["decoder"]["optimized"]["memory"]
    assert mem["verdict"] == "does_not_fit" and mem["fix"]
    fixed = est("rebel100-1npu", [*mem["set"], *[x.strip() for x in mem["fix"].split("--set") if x.strip()]])
    assert fixed.verdict == "fits"


def test_optimize_buckets_recommendation_is_checked_by_its_own_dry_run():
    res = invoke("bucket-plan", "--json", "-p", "rebel100-1npu", "--size", "1920x1080", "--size", "512x512", "-k", "2")
    assert res.exit_code == 0, res.output
    mem = json.loads(res.stdout)["optimized"]["memory"]
    assert mem["verdict"] == "fits" and mem["set"][0].startswith("visual.max_seq_len=")


# --- 7. placement and units ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "needle"),
    [("120", "has no unit"), ("1TiB", "more than the 144.00 GiB of DRAM"), ("150GB", "more than the 144.00 GiB")],
)
def test_device_memory_without_unit_or_above_the_card_is_refused(value, needle):
    r = run_qvl("compile", "--dry-run", "-p", "rebel100-1npu", "--device-memory", value)
    assert r.exit_code == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    assert "--device-memory" in line and value in line and needle in line and "GiB" in line


# --- 8. true descriptions --------------------------------------------------------------------------


def test_every_shipped_preset_description_is_true_under_the_planner():
    from qwenvl_rbln.planning.presets import list_preset_files

    for name in sorted(list_preset_files()):  # every shipped preset loads in the planner's eyes
        plan = build_plan(name)
        assert estimate_plan(plan, calibration=NO_CAL).verdict == "fits", name
    desc = build_plan("rebel100-1npu-batch4").description
    assert "32768" in desc and "262144 does not fit" in desc and "so ViT + LM + KV cache fit" not in desc
    assert est("rebel100-1npu-batch4", ["max_seq_len=262144"]).verdict == "does_not_fit"
    assert "ViT moved to device 1" in build_plan("rebel100-2npu-batch4").description
    assert est("rebel100-2npu-batch4").device(1).verdict == "fits"


@pytest.mark.parametrize(
    ("preset", "sets", "blocks"),
    [
        ("rebel100-1npu", [], 32),
        ("rebel100-1npu-batch4", ["max_seq_len=262144"], 128),
        ("rebel100-1npu-batch4", [], 16),
        ("rebel100-2npu-batch4", [], 128),
        ("rebel100-1npu-batch4", ["max_seq_len=262144", "memory_budget=0.8"], 123),
        ("rebel100-1npu-batch4", ["max_seq_len=262144", "memory_budget=0.5"], 75),
        ("rebel100-1npu-batch4", ["max_seq_len=262144", 'memory_budget="100GB"'], 110),
        ("rebel100-1npu", ["batch_size=8"], 155),
    ],
)
def test_automatic_kv_block_counts_stay_exact(preset, sets, blocks):
    """optimum-rbln's _search_num_kvcache_blocks, reproduced in the estimate scenario (kept through issue 12)."""
    r = estimate_plan(build_plan(preset, sets), calibration=NO_CAL, suggest=False)
    assert r.kv["mode"] == "auto" and r.kv["num_blocks"] == blocks
