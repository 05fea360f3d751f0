"""Killing tests for the profile and tuning survivors of the mutation audit (2026-12-04-mutations.md, P2 P4 P5 P6 P7
P8): the newest record of a graph wins whatever the file order, a newer format version is refused and left alone,
the printed spread is half the p10-p90 band, the prefill chunk is never timed past the compiled length, --check
fails a graph far faster than its bound, and the fit's RMS and worst errors are each what they say."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.tuning.measured import GraphTiming, load_measured, read_file, write_entry


def _entry(seconds: float, when: str) -> dict:
    point = {"context": 1000, "median_s": seconds, "p10_s": seconds, "p90_s": seconds}
    return {"model_key": "m", "npu": "RBLN-CR13", "profiled_at": when, "graphs": {"g": {"points": [point]}}}


def test_p2_the_newest_record_of_a_graph_wins_whatever_the_file_order(tmp_path):
    path = tmp_path / "timings.json"
    write_entry("rebel 0.12.1", _entry(0.1, "2026-06-01T00:00:00+00:00"), emulated=False, path=path)  # newer, first
    write_entry("rebel 0.12.0", _entry(0.9, "2026-01-01T00:00:00+00:00"), emulated=False, path=path)
    timing = load_measured("m", "RBLN-CR13", path).get("g")
    assert timing.points[1000]["median_s"] == 0.1 and timing.date.startswith("2026-06-01")
    assert "2026-06-01" in timing.label("measured")


def test_p4_a_newer_format_version_is_refused_and_profile_leaves_it_as_it_was(tiny_rbln, tmp_path, monkeypatch):
    from qwenvl_rbln.profiling.run import ProfileOptions, run_profile
    from tests.emulated_rbln import emulator_on

    path = tmp_path / "timings.json"
    path.write_text(json.dumps({"format": "qvl-timings", "version": 3, "entries": {}, "emulated": {}}))
    before = path.read_bytes()
    with pytest.raises(InputError, match="format version 3; this qvl reads version 2"):
        read_file(path)
    monkeypatch.setenv("QVL_HOME", str(tmp_path))
    with emulator_on(), pytest.raises(InputError, match="format version 3"):
        run_profile(ProfileOptions(tiny_rbln, emulate=True, only=("visual/call256",), repeats=1, warmup=0))
    assert path.read_bytes() == before


def test_p5_the_spread_is_half_the_p10_p90_band():
    timing = GraphTiming("k", {0: {"median_s": 1.0, "p10_s": 0.95, "p90_s": 1.05}}, None, "RBLN-CR13", "2026-12-03",
                         False)  # fmt: skip
    assert timing.spread() == pytest.approx(0.05)
    assert "+-5% p10-p90" in timing.label("measured")


def test_p6_the_prefill_chunk_is_never_timed_past_the_compiled_length():
    from qwenvl_rbln.profiling.graphs import Graph, Shapes, contexts

    prefill = Graph("prefill/chunk512/block1024", "prefill", "prefill.rbln", 0, (), 512)
    shapes = Shapes(max_seq_len=4096, chunk=512, block=1024, num_blocks=1)
    ctx = contexts(prefill, shapes, 3)
    assert ctx == [0, 2048, 3584] and max(ctx) + shapes.chunk <= shapes.max_seq_len


def test_p7_check_fails_a_graph_far_faster_than_its_bound():
    from qwenvl_rbln.profiling.compare import compare

    g = {"key": "g", "points": [{"median_s": 0.2, "roofline_s": 1.0}, {"median_s": 1.2, "roofline_s": 1.0}]}
    res = compare([g], 0.5)
    assert res["failing"] == ["g"] and res["ok"] is False
    assert g["worst_ratio"] == pytest.approx(0.2) and g["within_tol"] is False


def test_p8_the_fits_rms_and_worst_errors_are_each_what_they_say():
    from qwenvl_rbln.tuning.fit import fit_quadratic

    pts = [(0, 1.0), (100, 1.3), (200, 0.9), (300, 1.4), (400, 1.0)]
    fit = fit_quadratic(pts)
    rel = [(fit(n) - t) / t for n, t in pts]
    assert fit.rms_rel_error == pytest.approx(math.sqrt(sum(r * r for r in rel) / len(rel)))
    assert fit.max_rel_error == pytest.approx(max(abs(r) for r in rel))
    assert fit.rms_rel_error < fit.max_rel_error  # 0.175 and 0.324: apart, so a swap shows


def test_p4_file_check_reads_version_2_only(tmp_path: Path):
    path = tmp_path / "timings.json"
    for version in (1, 3, "2", None):
        path.write_text(json.dumps({"format": "qvl-timings", "version": version, "entries": {}, "emulated": {}}))
        with pytest.raises(InputError, match="format version"):
            read_file(path)
