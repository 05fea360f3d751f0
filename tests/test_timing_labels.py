"""Every time tune prints says where it came from: a measured timing (timings.json, real section) changes tune's
choice, its rows say "measured (NPU, date, +-spread)", "fitted (..., fit +-err)" or "roofline bound", the rows
that rest on estimates are counted, the plot labels its points, and an emulated timing changes nothing."""

from __future__ import annotations

import json

import pytest

from qwenvl_rbln.memory.calibration import decoder_key, model_key, prefill_key
from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_2B
from qwenvl_rbln.tuning.fit import fit_quadratic
from qwenvl_rbln.tuning.measured import visual_call_key, write_entry
from qwenvl_rbln.tuning.search import PARTITIONS, Needs
from qwenvl_rbln.tuning.tune import run_tune

WHEN = "2026-12-03T10:00:00+00:00"


def _point(context: int, seconds: float, spread: float = 0.0) -> dict:
    return {"context": context, "median_s": seconds, "p10_s": seconds * (1 - spread),
            "p90_s": seconds * (1 + spread), "min_s": seconds, "max_s": seconds}  # fmt: skip


SLOW = 4  # the batch tune picks for this workload on bounds alone at a load of SLOW in flight (asserted below)


def _slow_batch() -> dict:
    """decoder_batch_SLOW measured at 1 s a step (at two contexts, with a fit), and decoder batches 1 and 2 at twice
    their bound, at every partition tune tries; the prefill chunk and the ViT buckets measured too (prefill at
    context 0 only: a measured point there, extrapolated past it; each ViT bucket at twice its bound)."""
    from qwenvl_rbln.planning.catalogue.devices import REBEL100_COMPUTE
    from qwenvl_rbln.tuning.roofline import Roofline

    roof = Roofline(QWEN3_VL_2B, REBEL100_COMPUTE)
    graphs = {}
    fit = {"c0_s": 1.0, "a_s_per_token": 0.0, "b_s_per_token2": 0.0, "rms_rel_error": 0.02, "max_rel_error": 0.03,
           "points": 2, "context_range": [0, 262143]}  # fmt: skip
    for p in PARTITIONS:
        graphs[decoder_key(SLOW, p)] = {"points": [_point(0, 1.0, 0.05), _point(262143, 1.0, 0.05)], "fit": fit}
        for b in (1, 2):
            pts = [(n, 2 * roof.decode_step(b, b, n, p)) for n in (0, 262143)]
            graphs[decoder_key(b, p)] = {"points": [_point(n, t, 0.02) for n, t in pts],
                                         "fit": {**fit_quadratic(pts).to_dict(), "rms_rel_error": 0.02}}  # fmt: skip
        graphs[prefill_key(512, p)] = {"points": [_point(0, 0.02, 0.04)], "fit": None}
    for bucket in (1200, 3520):  # the workload's two buckets
        graphs[visual_call_key(bucket)] = {"points": [_point(0, 2 * roof.vit_call(bucket), 0.03)], "fit": None}
    return {"model_key": model_key(QWEN3_VL_2B), "npu": "RBLN-CR13", "profiled_at": WHEN, "graphs": graphs}


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    path = tmp_path_factory.mktemp("labels") / "wl.jsonl"
    path.write_text('{"width": 1280, "height": 720, "count": 3}\n{"width": 640, "height": 480, "count": 2}\n')
    return path


def _tune(workload):
    # the load is declared: without it tune ranks at half the largest batch, and the bound would not favour SLOW
    return run_tune(Needs(model=None, context=262144, devices=1, concurrency=SLOW), workload)[0]


@pytest.fixture(scope="module")
def baseline(workload, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("QVL_HOME", str(tmp_path_factory.mktemp("empty-home")))
    try:
        return _tune(workload)
    finally:
        mp.undo()


def test_without_measurements_every_row_is_a_roofline_bound(baseline):
    assert baseline["best"]["batch_size"] == SLOW  # the largest batch that fits: the bound favours it
    assert baseline["best"]["timing"]["label"] == "roofline bound"
    assert all(r["timing"]["rests_on_estimates"] for r in baseline["candidates"])
    assert baseline["cost_model"]["measured_graphs"] == []


def test_a_measured_timing_changes_tunes_choice_and_every_source_is_labelled(workload, baseline, tmp_path,
                                                                             monkeypatch):  # fmt: skip
    monkeypatch.setenv("QVL_HOME", str(tmp_path))
    write_entry("RBLN-CR13 | rebel 0.12.0 | optimum-rbln 0.12.0 | h", _slow_batch(), emulated=False)
    doc = _tune(workload)
    assert doc["best"]["batch_size"] != SLOW  # its measured 1 s a step loses to a smaller batch's scaled bound
    rows = {r["batch_size"]: r for r in doc["candidates"]}
    sources = rows[SLOW]["timing"]["sources"]
    labels = " | ".join(sources.values())
    assert "measured (RBLN-CR13, 2026-12-03, +-" in labels  # the ViT buckets: measured points
    assert "fitted (RBLN-CR13, 2026-12-03, fit +-2%)" in labels  # the slow batch at the mean context: the fit
    assert "extrapolated (RBLN-CR13, 2026-12-03, outside its one measured context 0" in labels  # prefill past 0
    assert "emulated" not in labels
    best = doc["best"]["timing"]
    scaled = [s for s in best["sources"].values() if s.startswith("scaled bound (x2.00")]
    assert best["rests_on_estimates"] and scaled  # its unmeasured decoder graph: the bound x the measured ratio
    assert "roofline bound" not in best["sources"].values()  # every kind was measured: one footing
    assert doc["cost_model"]["rows_on_estimates"] >= 1 and doc["cost_model"]["ranked_by"].startswith("one footing")
    assert doc["cost_model"]["scaled_by"]["decode step"] == pytest.approx(2.0)


def test_tune_output_and_plot_say_where_each_figure_came_from(workload, tmp_path, monkeypatch):
    from qwenvl_rbln.views.plots.tune import from_tune_report
    from tests.helpers_cli import run_qvl

    monkeypatch.setenv("QVL_HOME", str(tmp_path))
    write_entry("k", _slow_batch(), emulated=False)
    res = run_qvl("tune", "-w", str(workload), "--context", "262144", "--concurrency", str(SLOW))
    assert res.exit_code == 0, res.stderr
    assert "figures #1 mixed:" in res.stdout and "rest partly on bounds" in res.stdout
    assert "ranked on one footing: measured figures" in res.stdout and "extrapolated" in res.stdout
    assert "measured (RBLN-CR13, 2026-12-03" in res.stdout and "fitted (RBLN-CR13" in res.stdout
    assert "The figures in the description are mixed" in res.stdout  # the preset's header
    shape = from_tune_report(_tune(workload))
    assert any("[mixed]" in c["label"] for c in shape["candidates"])
    assert "row(s) partly on bounds" in shape["throughput_unit"]


def test_an_emulated_timing_never_changes_tune(workload, baseline, tmp_path, monkeypatch):
    monkeypatch.setenv("QVL_HOME", str(tmp_path))
    write_entry("emu", {**_slow_batch(), "rebel": "0.12.0+qvl.emulated"}, emulated=True)
    doc = _tune(workload)
    assert json.dumps(doc["candidates"]) == json.dumps(baseline["candidates"])
    assert doc["best"]["timing"]["label"] == "roofline bound"


def test_the_nearest_configurations_say_where_their_figures_came_from(workload, tmp_path, monkeypatch):
    monkeypatch.setenv("QVL_HOME", str(tmp_path))
    write_entry("k", _slow_batch(), emulated=False)
    doc, error = run_tune(Needs(model=None, context=262144, min_batch=64, devices=1), workload)
    assert error is not None and doc["nearest"]
    costed = [r for r in doc["nearest"] if r.get("estimate")]
    assert costed and all(r["timing"]["label"].startswith(("mixed", "measured", "roofline")) for r in costed)
