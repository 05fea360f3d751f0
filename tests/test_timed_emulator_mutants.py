"""The timed emulator's accounting (backends/emulator/timed.py) where the call-line tests leave it open (audit
2026-12-06, mutants T03, T07, T08, T09, T11, T12, T13, T14): the floor and the real rows of a hold, the scale's
refusal, a forked child's own call file, and ``read_stats`` over hand-written call lines (an overrun, two-chunk
prompts, skewed host gaps). No torch, no engine. Emulated: no NPU ran."""

from __future__ import annotations

import os
import time

import pytest

from qwenvl_rbln.backends.emulator import timed
from qwenvl_rbln.tuning.device_time import linear_model

# decode = 1 ms x real rows x context: a decode's time depends on its real rows, not its graph's
BY_ROWS = linear_model(decode=(0.0, 0.0, 1e-3), name="rows x context")


def _lines(path, rows):
    """Call lines as the timer writes them: WALL_END KIND SIZE CONTEXT DEVICE_S CPU_S HOLD_S."""
    path.write_text("".join(" ".join(str(x) for x in row) + "\n" for row in rows), encoding="utf-8")


def _recorded(stats_dir):
    """Every call line the timer wrote, split (one file per process)."""
    return {p.name: [ln.split() for ln in p.read_text().splitlines()] for p in stats_dir.glob("calls-*.tsv")}


def test_a_decode_holds_for_its_real_rows_and_at_least_the_floor(tmp_path):
    """T07: one real row of a graph of 4 is priced at one row (10 ms, not 40); T03: the floor holds longer."""
    timer = timed.Timer(BY_ROWS, scale=1.0, stats_dir=tmp_path)
    call = timed.Call("decode", 4, 10, rows=1)
    assert timed.device_seconds(BY_ROWS, call) == pytest.approx(0.01)
    timer.hold(0.0, call)  # started long ago: the CPU "took" longer than any hold, nothing to sleep
    start = time.perf_counter()
    timer.hold(start, call, floor_s=0.25)  # the floor (the emulated graph's own minimum) is above 10 ms
    assert time.perf_counter() - start >= 0.25
    (lines,) = _recorded(tmp_path).values()
    assert [float(line[4]) for line in lines] == pytest.approx([0.01, 0.01])  # device seconds: the real row
    assert float(lines[1][6]) == pytest.approx(0.25)  # the hold is the floor


@pytest.mark.parametrize("scale", ["0", "-1", "nan", "inf", "fast"])
def test_a_time_scale_that_is_not_a_positive_number_is_refused(monkeypatch, tmp_path, scale):
    """T12: 0 wall s per device s would hold nothing and call it device time."""
    monkeypatch.setattr(timed, "_cache", {})
    monkeypatch.setenv(timed.MODEL_ENV, str(tmp_path / "model.json"))
    monkeypatch.setenv(timed.SCALE_ENV, scale)
    monkeypatch.delenv(timed.STATS_ENV, raising=False)
    with pytest.raises(RuntimeError, match=f"QVL_EMULATE_TIME_SCALE='{scale}' is not a positive number"):
        timed.configured()


def test_a_forked_child_writes_its_own_call_file(tmp_path):
    """T14: vLLM forks its engine core after the parent has called a graph: the child's lines go to
    calls-<child pid>.tsv, never into the parent's open file."""
    timer = timed.Timer(BY_ROWS, scale=1.0, stats_dir=tmp_path)
    timer.hold(0.0, timed.Call("vit", 64, 0))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            timer.hold(0.0, timed.Call("decode", 2, 5, rows=2))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    files = _recorded(tmp_path)
    assert sorted(files) == sorted([f"calls-{os.getpid()}.tsv", f"calls-{pid}.tsv"])
    assert [line[1] for line in files[f"calls-{os.getpid()}.tsv"]] == ["vit"]
    assert [line[1] for line in files[f"calls-{pid}.tsv"]] == ["decode"]


def test_host_step_time_is_the_median_gap_before_each_step_and_an_overrun_counts_its_cpu_time(tmp_path):
    """T08, T11, T13: a step's wall time is the longer of its hold and its CPU time (an overrun ran past its hold),
    so the host gap before the next step and ``hold_s`` / ``cpu_share`` count the overrun's CPU time; the host
    step is the median gap (one slow gap does not move it)."""
    _lines(tmp_path / "calls-1.tsv", [
        (100.00, "decode", 4, 10, 0.004, 0.01, 0.05),
        (101.15, "decode", 4, 11, 0.004, 1.00, 0.04),  # an overrun: ran 100.15-101.15; gap 0.15
        (101.35, "decode", 4, 12, 0.004, 0.01, 0.05),  # gap 101.30 - 101.15 = 0.15
        (102.00, "decode", 4, 13, 0.004, 0.01, 0.05),  # gap 101.95 - 101.35 = 0.60 (one slow step)
    ])  # fmt: skip
    stats = timed.read_stats(tmp_path)
    assert (stats.calls, stats.overruns, stats.overruns_by_kind) == (4, 1, {"decode": 1})
    assert stats.host_step_s == pytest.approx(0.15)
    assert stats.hold_s == pytest.approx(0.05 + 1.00 + 0.05 + 0.05)
    assert stats.cpu_share == pytest.approx(1.03 / 1.15)
    assert stats.to_dict()["cpu_share"] == pytest.approx(1.03 / 1.15)


def test_a_prompts_first_chunk_starts_a_step_and_its_later_chunks_do_not(tmp_path):
    """T09: a two-chunk prompt is one engine step; the host gap is the one before its first chunk (context ==
    chunk), never the 20 ms between its chunks."""
    _lines(tmp_path / "calls-1.tsv", [
        (100.00, "vit", 1024, 0, 0.001, 0.001, 0.01),
        (100.40, "prefill", 128, 128, 0.002, 0.01, 0.10),  # step start: gap 100.30 - 100.00 = 0.30
        (100.52, "prefill", 128, 256, 0.002, 0.01, 0.10),  # the same step's second chunk
        (100.92, "prefill", 128, 128, 0.002, 0.01, 0.10),  # the next prompt: gap 100.82 - 100.52 = 0.30
        (101.04, "prefill", 128, 256, 0.002, 0.01, 0.10),
    ])  # fmt: skip
    stats = timed.read_stats(tmp_path)
    assert stats.by_kind == {"vit": 1, "prefill": 4}
    assert stats.host_step_s == pytest.approx(0.30)
