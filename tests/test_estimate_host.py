"""The analytic estimate (``tuning.estimate``) charges every step what the serving simulator charges it: the host's
own time (``host_time.HostTimeModel``: a prefill step by its tokens and ViT calls, a decode step by its running
rows) and the sampler's NPU call (one row for a prefill, the running rows padded to vllm-rbln's bucket for a decode),
and tune names the host-time source and the sampler assumption once, in the table's footer and in --json.

The expected figures are worked out here by hand from a small workload and trace; the graph calls come from the
roofline (not under test), the host and sampler seconds from their formulas."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from qwenvl_rbln.planning.catalogue.devices import REBEL100_COMPUTE
from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_2B
from qwenvl_rbln.tuning.estimate import estimate
from qwenvl_rbln.tuning.host_time import DEFAULT, HOST_FREE, HostTimeModel
from qwenvl_rbln.tuning.roofline import SAMPLER_LAUNCH_S, Roofline
from qwenvl_rbln.tuning.search import Needs
from qwenvl_rbln.tuning.tune import run_tune
from qwenvl_rbln.tuning.workload import Work
from tests.helpers_cli import run_qvl

HOST = HostTimeModel(4e-3, 1e-5, 2e-3, 3e-3, 5e-4, source="test host")
VOCAB, PEAK_HBM, BLOCK = 151_936, 4.8e12, 8192
TRACE = {1: 2, 3: 1, 6: 1}  # running rows -> steps: 4 steps, 11 rows


def _work() -> Work:
    """Four requests of 256 image tokens + 128 prompt tokens (384 each), 256 output tokens; three one-image
    requests (one ViT call of 1024 patches) and one with two images (two calls): 1.25 calls per request."""
    groups = {(1024, 1): 3, (1024, 2): 1}
    return Work(path="w", requests=4, lines=2, distinct=2, errors=0, first_error=None, vit_buckets=[1024],
                vit_section={}, groups=groups, chunks_hist={256: 4}, trace=dict(TRACE))  # fmt: skip


def _sampler(rows: int) -> float:
    return SAMPLER_LAUNCH_S + rows * VOCAB * 2 / PEAK_HBM


def _est(host: HostTimeModel) -> dict:
    roof = Roofline(QWEN3_VL_2B, REBEL100_COMPUTE)
    return estimate(_work(), roof, batch=8, graphs=[8], vit_buckets=[1024], block=BLOCK, shared=True, host=host)


def test_host_time_and_the_sampler_are_added_where_the_simulator_adds_them():
    roof = Roofline(QWEN3_VL_2B, REBEL100_COMPUTE)
    est = _est(HOST)
    vit = 1.25 * roof.vit_call(1024)
    prefill = roof.prefill(384, BLOCK)
    host_prefill = 4e-3 + 1e-5 * 384 + 2e-3 * 1.25  # one prefill step per request: its tokens and its ViT calls
    assert est["prefill_host_s"] == pytest.approx(host_prefill) and est["vit_calls_per_request"] == 1.25
    assert est["prefill_sampler_s"] == pytest.approx(_sampler(1))
    ttft = vit + prefill + _sampler(1) + host_prefill
    assert est["ttft_s"] == pytest.approx(ttft, rel=1e-12)
    # one decoder graph of 8: the sampler pads to get_bucket_sizes(8) = 1, 2, 4, 8 (1 row stays 1, 3 -> 4, 6 -> 8)
    context = 384 + 256 / 2
    graph = {r: roof.decode_step(8, r, context, BLOCK) for r in TRACE}
    sampler = {1: _sampler(1), 3: _sampler(4), 6: _sampler(8)}
    host = {r: 3e-3 + 5e-4 * r for r in TRACE}  # by the running rows, not the graph's 8
    total = sum(n * (graph[r] + sampler[r] + host[r]) for r, n in TRACE.items())
    assert est["tpot_s"] == pytest.approx(total / 4, rel=1e-12)
    assert est["decode_host_s_per_step"] == pytest.approx(sum(n * host[r] for r, n in TRACE.items()) / 4)
    assert est["decode_sampler_s_per_step"] == pytest.approx(sum(n * sampler[r] for r, n in TRACE.items()) / 4)
    assert est["latency_s"] == pytest.approx(ttft + 256 * total / 4, rel=1e-12)
    card = vit + prefill + _sampler(1) + host_prefill + 256 * total / 11  # the ViT on the LM's card
    assert est["requests_per_s"] == pytest.approx(1 / card, rel=1e-12)
    assert est["output_tokens_per_s"] == pytest.approx(256 / card, rel=1e-12)
    device = vit + prefill + _sampler(1) + 256 * sum(n * (graph[r] + sampler[r]) for r, n in TRACE.items()) / 11
    idle = host_prefill + 256 * sum(n * host[r] for r, n in TRACE.items()) / 11
    assert est["npu_busy_share"] == pytest.approx(device / (device + idle), rel=1e-12)
    # the graph figures stay the graph calls alone; the per-graph throughput counts the sampler and host too
    g = est["decode_graphs"][0]
    assert g["step_s"] == pytest.approx(roof.decode_step(8, 8, context, BLOCK)) and g["host_s"] == 7e-3
    assert g["tokens_per_s"] == pytest.approx(8 / (g["step_s"] + _sampler(8) + 7e-3))


def test_host_free_leaves_the_roofline_and_the_sampler_and_host_time_never_defaults_to_zero():
    free, charged = _est(HOST_FREE), _est(HOST)
    assert free["host_s_per_request"] == 0 and free["npu_busy_share"] == 1.0
    assert charged["ttft_s"] - free["ttft_s"] == pytest.approx(charged["prefill_host_s"])
    assert charged["prefill_s_per_request"] == free["prefill_s_per_request"]  # the graphs are the same
    assert charged["output_tokens_per_s"] < free["output_tokens_per_s"]
    with pytest.raises(TypeError, match="host"):  # no silent 0: the caller names its host-time model
        estimate(_work(), Roofline(QWEN3_VL_2B, REBEL100_COMPUTE), batch=8, graphs=[8], vit_buckets=[1024],
                 block=BLOCK, shared=True)  # fmt: skip


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("est-host") / "wl.jsonl"
    path.write_text(json.dumps({"width": 1280, "height": 720, "count": 5}) + "\n")
    return path


def test_tune_names_the_default_host_time_and_the_sampler_once_and_charges_them(workload, own_qvl_home):
    from rich.console import Console

    from qwenvl_rbln.views.tune import print_human

    doc, error = run_tune(Needs(model=None, context=32768), workload)
    assert error is None
    cm = doc["cost_model"]
    assert cm["host_time"]["measured"] is False and cm["host_time"]["source"] == DEFAULT.source
    assert cm["host_time"]["seconds"]["decode_base_s"] == DEFAULT.decode_base_s > 0
    assert cm["sampler"].startswith("assumed, not measured")
    est = doc["best"]["estimate"]
    assert est["decode_host_s_per_step"] == pytest.approx(DEFAULT.decode(est["mean_running_batch"]))
    tokens = doc["workload"]["mean_input_tokens"]  # rounded to 0.1 in the document
    assert est["prefill_host_s"] == pytest.approx(DEFAULT.prefill(tokens, est["vit_calls_per_request"]), rel=1e-3)
    assert 0 < est["npu_busy_share"] < 1
    out = io.StringIO()
    print_human(Console(file=out, width=250, no_color=True), doc)
    text = out.getvalue()
    assert text.count("host time default: this machine's measurement") == 1
    assert text.count("sampler assumed, not measured") == 1
    host = f"host {est['prefill_host_s'] * 1e3:.2f} ms (prefill) / {est['decode_host_s_per_step'] * 1e3:.2f} ms"
    assert host in text and "NPU busy" in text
    assert "(host time: this machine's default; sampler assumed)" in doc["preset"]["description"]


def test_a_measured_host_time_is_the_estimates_too(workload, tmp_path):
    from qwenvl_rbln.tuning.host_time import SECTION
    from qwenvl_rbln.tuning.measured import EMULATED, FORMAT, REAL, VERSION

    slow = {"prefill_base_s": 0.02, "decode_base_s": 0.02, "decode_per_row_s": 1e-3, "source": "measured on host-x",
            "measured_at": "2026-12-06T05:00:00Z", "host": {"cpu": "test cpu"}}  # fmt: skip
    doc = {"format": FORMAT, "version": VERSION, REAL: {}, EMULATED: {}, SECTION: {"host-x": slow}}
    (tmp_path / "timings.json").write_text(json.dumps(doc))
    res = run_qvl("tune", "-w", str(workload), "--context", "32768", "--json", env={"QVL_HOME": str(tmp_path)})
    assert res.exit_code == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["cost_model"]["host_time"]["measured"] is True
    assert got["cost_model"]["host_time"]["source"] == "measured on host-x"
    est = got["best"]["estimate"]
    running = est["mean_running_batch"]  # no trace: the full batch on every step
    assert est["decode_host_s_per_step"] == pytest.approx(0.02 + 1e-3 * running)
    assert "measured" in got["preset"]["description"]


def test_with_slo_the_host_time_and_sampler_are_named_once_for_the_estimate_and_the_simulation(workload, tmp_path):
    """One source: the capacity table's footer names the same host time as the estimate, and it is not repeated."""
    res = run_qvl("tune", "-w", str(workload), "--context", "32768", "--slo", "ttft_p90=2s", "--sim-requests", "20",
                  env={"QVL_HOME": str(tmp_path), "COLUMNS": "250"})  # fmt: skip
    assert res.exit_code == 0, res.stderr
    flat = " ".join(res.stdout.split())
    assert flat.count("host time default: this machine's measurement") == 1
    assert flat.count("sampler assumed, not measured") == 1
    res = run_qvl("tune", "-w", str(workload), "--context", "32768", "--slo", "ttft_p90=2s", "--sim-requests", "20",
                  "--json", env={"QVL_HOME": str(tmp_path)})  # fmt: skip
    doc = json.loads(res.stdout)
    assert doc["capacity"]["host_time"] == doc["cost_model"]["host_time"]
