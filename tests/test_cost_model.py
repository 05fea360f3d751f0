"""The corrected cost model (docs/tuning.md, "The cost model"): a prefill chunk computes lm_head for one row, a MoE's
decode is a range from the routed experts to every expert (ranked by the high end unless measured), and without a
batch trace tune states its full-batch assumption and ranks throughput at a lighter load, not the largest batch.

Expected figures are derived here from the geometry and checked against the audit of optimum-rbln 0.12
(``shared/audits/2026-12-03-library-sources.md``, W1 and W6), never by calling the function under test twice."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from qwenvl_rbln.planning.catalogue.devices import REBEL100_COMPUTE
from qwenvl_rbln.planning.catalogue.modelinfo import BUILTIN, QWEN3_VL_2B
from qwenvl_rbln.planning.catalogue.params import lm_params
from qwenvl_rbln.tuning.estimate import estimate
from qwenvl_rbln.tuning.host_time import HOST_FREE
from qwenvl_rbln.tuning.roofline import SAMPLER_LAUNCH_S, Roofline
from qwenvl_rbln.tuning.search import Config, Needs
from qwenvl_rbln.tuning.tune import _setup, run_tune
from qwenvl_rbln.tuning.workload import Work
from tests.helpers_cli import run_qvl

A3B = BUILTIN["qwen/qwen3-vl-30b-a3b-instruct"]
A3B_LM_BYTES = 60_441_915_392  # the audit's 1.7: 30,220,957,696 params on the device, bf16
PEAK_FLOPS, PEAK_HBM = 1e15, 4.8e12


def _text_only(prompt_tokens: int) -> Work:
    """A workload of text requests: no ViT calls, ``prompt_tokens`` each, 256 output tokens."""
    return Work(path="text", requests=1, lines=1, distinct=1, errors=0, first_error=None, vit_buckets=[1024],
                vit_section={}, groups={}, prompt_tokens=prompt_tokens)  # fmt: skip


def _estimate(roof: Roofline, work: Work, batch: int = 1, **kw) -> dict:
    """The roofline's arithmetic: no host time (``HOST_FREE``); the sampler's call is still charged every step."""
    return estimate(work, roof, batch=batch, graphs=[batch], vit_buckets=[1024], block=8192, shared=True,
                    host=HOST_FREE, **kw)  # fmt: skip


def _sampler(rows: int, vocab: int) -> float:
    """roofline.SAMPLER_ASSUMPTION by hand: the launch plus the rows' bf16 logits read at the peak bandwidth."""
    return SAMPLER_LAUNCH_S + rows * vocab * 2 / PEAK_HBM


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cost") / "wl.jsonl"
    path.write_text(json.dumps({"width": 1280, "height": 720, "count": 5}) + "\n")
    return path


# --- W1: prefill logits for one row --------------------------------------------------------------------------------


def test_prefill_chunk_computes_lm_head_for_one_row_so_2b_ttft_drops_by_the_audits_21_6_percent():
    t = QWEN3_VL_2B.text
    params, head = lm_params(t)["device"], t.vocab_size * t.hidden_size
    attention = 4 * t.num_hidden_layers * t.num_attention_heads * t.head_dim * 512 * 256  # causal, first chunk
    one_row = (2 * (params - head) * 512 + 2 * head + attention) / PEAK_FLOPS
    every_row = (2 * params * 512 + attention) / PEAK_FLOPS  # what qvl printed before the audit
    assert (params * 2 + 512 * 2 * 28 * 8 * 128 * 2) / PEAK_HBM < one_row  # compute-bound: FLOPs decide
    assert one_row == pytest.approx(1.474e-3, rel=2e-3) and every_row == pytest.approx(1.792e-3, rel=2e-3)
    assert every_row / one_row - 1 == pytest.approx(0.216, abs=0.002)  # the audit's overstatement
    roof = Roofline(QWEN3_VL_2B, REBEL100_COMPUTE)
    assert roof.prefill_chunk(0, 8192) == pytest.approx(one_row, rel=1e-9)
    # a 512-token text request prefills in that one chunk; its TTFT adds the prefill step's sampler call (no host)
    est = _estimate(roof, _text_only(512))
    assert est["prefill_s_per_request"] == pytest.approx(one_row, rel=1e-9)
    assert est["ttft_s"] == pytest.approx(one_row + _sampler(1, t.vocab_size), rel=1e-9)


# --- W6: MoE decode as a range ---------------------------------------------------------------------------------------


def test_30b_a3b_decode_ranges_from_routed_experts_to_every_expert():
    roof = Roofline(A3B, REBEL100_COMPUTE)
    low, high = roof.decode_step(1, 1, 0, 8192), roof.high_end().decode_step(1, 1, 0, 8192)
    assert low == pytest.approx(1.267e-3, rel=3e-3)  # the figure qvl printed: the routed experts only
    assert high == pytest.approx(A3B_LM_BYTES / PEAK_HBM, rel=1e-6) and high >= 12.59e-3  # every expert read
    est = _estimate(roof, _text_only(128))
    graph = est["decode_graphs"][0]
    kv_per_token = 2 * 48 * 4 * 128 * 2  # the audit's 1.8: 768 MiB per 8,192 tokens
    context = 128 + 256 / 2  # each row attends to its prompt and, on average, half its output
    # the headline (what ranks) is the high end: every expert's weights and the KV read, bandwidth-bound
    assert graph["step_s"] == pytest.approx((A3B_LM_BYTES + context * kv_per_token) / PEAK_HBM)
    sampler = _sampler(1, A3B.text.vocab_size)  # one row: the same at both ends
    assert graph["sampler_s"] == pytest.approx(sampler) and graph["host_s"] == 0.0
    assert est["tpot_s"] == pytest.approx(graph["step_s"] + sampler)
    assert graph["step_s_range"]["high"] == pytest.approx(graph["step_s"])
    assert graph["step_s_range"]["low"] < 0.2 * graph["step_s_range"]["high"]  # about 10x apart at G=1
    span = {k: v + sampler for k, v in graph["step_s_range"].items()}
    assert est["moe_range"]["tpot_s"] == pytest.approx(span)
    tok = est["moe_range"]["output_tokens_per_s"]
    assert tok["low"] == pytest.approx(est["output_tokens_per_s"]) and tok["high"] > tok["low"]


def test_a_measured_decode_graph_is_the_same_at_both_ends_and_a_dense_model_has_no_range():
    from qwenvl_rbln.tuning.measured import GraphTiming, Measured
    from qwenvl_rbln.tuning.measured_roofline import MeasuredRoofline

    key = "decoder_batch_1/block8192"
    point = {"median_s": 0.004, "p10_s": 0.004, "p90_s": 0.004}
    timing = GraphTiming(key, {0: point}, None, "RBLN-CR13", "2026-12-03", False)
    roof = MeasuredRoofline(A3B, REBEL100_COMPUTE, measured=Measured({key: timing}))
    est = _estimate(roof, _text_only(128))
    assert est["decode_graphs"][0]["step_s"] == 0.004 and est["decode_graphs"][0]["step_s_range"] is None
    assert est["tpot_s"] == pytest.approx(0.004 + _sampler(1, A3B.text.vocab_size))
    assert "tpot_s" not in est["moe_range"]  # prefill is still a roofline range; the measured decode is not
    assert key in roof.label()
    assert roof.high_end().decode_step(1, 1, 128, 8192) == 0.004  # the high end answers from the measurement too
    assert roof.sources[key].startswith("extrapolated (RBLN-CR13")  # measured at context 0 only, asked past it
    dense = _estimate(Roofline(QWEN3_VL_2B, REBEL100_COMPUTE), _text_only(128))
    assert dense["moe_range"] is None and dense["decode_graphs"][0]["step_s_range"] is None


def test_tune_prints_a_moe_range_and_ranks_by_its_high_end(workload):
    from rich.console import Console

    from qwenvl_rbln.views.tune import print_human

    doc, error = run_tune(Needs(model="Qwen/Qwen3-VL-30B-A3B-Instruct", context=32768, devices=2), workload)
    assert error is None
    best = doc["best"]
    tpot = best["estimate"]["moe_range"]["tpot_s"]
    # the range is the roofline's alone (every expert read at the high end, the routed ones at the low end): host
    # time and the sampler are the same at both ends, so they add to each and leave the width as it was
    assert best["estimate"]["tpot_s"] == tpot["high"] and tpot["high"] - tpot["low"] == pytest.approx(
        4.894e-3, rel=1e-3
    )
    light = best["estimate"]["lighter_load"]["output_tokens_per_s"]
    assert best["score"] == pytest.approx(1 / light)  # the high end (fewest tokens/s) is what ranks
    assert light == best["estimate"]["moe_range"]["lighter"]["output_tokens_per_s"]["low"]
    out = io.StringIO()
    print_human(Console(file=out, width=250, no_color=True), doc)
    text = out.getvalue()
    assert f"{tpot['low'] * 1000:.2f}–{tpot['high'] * 1000:.2f}" in text  # the TPOT column
    assert "custom_moe_glu" in text and "ranked by the high end" in text
    assert f"MoE range {tpot['low'] * 1000:.2f}-{tpot['high'] * 1000:.2f} ms" in doc["preset"]["description"]


# --- without a batch trace: the full-batch assumption and a lighter load ------------------------------------------


def test_without_a_trace_tune_ranks_at_half_the_largest_batch_not_the_largest(workload):
    doc, error = run_tune(Needs(model=None, context=32768), workload)
    assert error is None
    largest = max(f["largest_batch"] for f in doc["frontier"])
    load = doc["cost_model"]["load"]
    assert load["lighter_load"] == math.ceil(largest / 2) and "full compiled batch" in load["assumption"]
    best = doc["best"]
    assert best["batch_size"] == load["lighter_load"] < largest  # the documented rule: the smallest that carries it
    checker = _setup(Needs(model=None, context=32768), workload, None, 128, 256)
    at_largest = checker.describe(Config(False, 8192, 32768, largest))["estimate"]
    # at the full batch the largest is faster; at the lighter load it is no faster, so the smaller batch wins
    assert at_largest["output_tokens_per_s"] > best["estimate"]["output_tokens_per_s"]
    # (a touch slower: its sampler pads the same rows to a larger bucket)
    assert at_largest["lighter_load"]["output_tokens_per_s"] == pytest.approx(1 / best["score"], rel=1e-3)
    assert at_largest["lighter_load"]["output_tokens_per_s"] <= 1 / best["score"]
    # a declared load as large as the largest batch: then the largest batch is the answer
    doc, _ = run_tune(Needs(model=None, context=32768, concurrency=largest), workload)
    assert doc["best"]["batch_size"] == largest and doc["cost_model"]["load"]["lighter_from"] == "--concurrency"


def test_tune_states_the_load_it_assumed_and_refuses_two_loads(workload, tmp_path):
    res = run_qvl("tune", "-w", str(workload), "--context", "32768", "--concurrency", "3")
    assert res.exit_code == 0, res.stderr
    flat = " ".join(res.stdout.split())
    assert "every decode step is assumed to run the full compiled batch" in flat
    assert "lighter load of 3 running requests (--concurrency)" in flat and "tok/s at 3" in flat
    trace = tmp_path / "trace.txt"
    trace.write_text("2\n3\n")
    res = run_qvl("tune", "-w", str(workload), "--context", "32768", "--concurrency", "3", "--batch-trace", str(trace))
    assert res.exit_code == 2 and "--concurrency and --batch-trace both describe the load" in res.stderr
    assert "Traceback" not in res.stderr
