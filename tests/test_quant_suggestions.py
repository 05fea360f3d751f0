"""The memory planner's fixes when quantization is what breaks a plan (optimum-rbln 0.12 loads a quantized model
in float32), and the wording of the memory_budget trade."""

from __future__ import annotations

from qwenvl_rbln.memory.planner import estimate_plan
from qwenvl_rbln.planning.plan import build_plan
from tests.helpers_cli import run_qvl

INT8 = 'quantization={"weights":"int8"}'


def test_dropping_quantization_is_the_first_fix_and_it_fits_when_applied():
    """D26: int8 on rebel100-8b is not a fit (the float32 load doubles the ViT and KV); bf16 fits, so the first
    suggestion is to drop the quantization, re-estimated like every suggestion."""
    report = estimate_plan(build_plan("rebel100-8b", [INT8]), calibration={})
    assert report.verdict != "fits"
    first = report.suggestions[0]
    assert first["kind"] == "quantization" and first["set"] == ["quantization=null"]
    assert first["verdict"] == "fits" and "float32" in first["text"]
    applied = estimate_plan(build_plan("rebel100-8b", [INT8, *first["set"]]), calibration={})
    assert applied.verdict == "fits" and applied.margin_bytes == first["margin_bytes"]
    res = run_qvl("compile", "--dry-run", "-p", "rebel100-8b", "--set", INT8)
    assert res.exit_code == 4 and "fix: try --set quantization=null" in res.stderr


def test_no_quantization_suggestion_without_quantization():
    report = estimate_plan(build_plan("rebel100-8b", ["max_seq_len=262144", "batch_size=2"]), calibration={})
    assert report.verdict != "fits" and all(s["kind"] != "quantization" for s in report.suggestions)


def test_the_memory_budget_trade_says_both_rows_for_a_batch_of_two():
    """D27: 'when all 2 rows run long'."""
    sets = ["batch_size=2", "decoder_batch_sizes=[1,2]", "max_seq_len=262144"]
    report = estimate_plan(build_plan("rebel100-8b", sets), calibration={})
    budget = next(s for s in report.suggestions if s["kind"] == "memory_budget")
    assert "when both rows run long" in budget["text"] and "all 2 rows" not in budget["text"]
