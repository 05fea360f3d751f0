"""Measured figures are checked before use (audit 2026-12-04-new-user H3, H10): finite, 1 us .. 1 h, never ten
times under their roofline bound, from the artifact asked about; past the measured contexts a fit is marked
extrapolated and never goes below the last measured time; a time of 0 is never divided by; NaN never ranks first in
tune, deploy (which reads through tuning/measured.py) never crashes on them, and a refusal names file, key and value.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from qwenvl_rbln.errors import EXIT_BAD_INPUT, InputError
from qwenvl_rbln.memory.calibration import model_key
from qwenvl_rbln.planning.catalogue.devices import REBEL100_COMPUTE
from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_2B
from qwenvl_rbln.tuning.fit import fit_quadratic
from qwenvl_rbln.tuning.measured import load_measured
from qwenvl_rbln.tuning.measured_roofline import MeasuredRoofline
from tests.helpers_cli import run_qvl

MK = model_key(QWEN3_VL_2B)
WHEN = "2026-12-03T10:00:00+00:00"
SATURATING = [(0, 0.00100), (8191, 0.00140), (16383, 0.00170), (24575, 0.00185), (32767, 0.00190)]


def _pt(context: int, seconds: float) -> dict:
    return {"context": context, "median_s": seconds, "p10_s": seconds * 0.98, "p90_s": seconds * 1.02}


def _file(path: Path, graphs: dict, **entry) -> Path:
    """A v2 timings file with one real entry for the 2B on RBLN-CR13 (the audit's repro helpers, in-process)."""
    e = {"npu": "RBLN-CR13", "model_key": MK, "graph_hash": "abc", "profiled_at": WHEN, "graphs": graphs, **entry}
    path.write_text(json.dumps({"format": "qvl-timings", "version": 2, "entries": {"k": e}, "emulated": {}}))
    return path


def _saturating(path: Path) -> Path:
    """audit repro saturating_timings.py: decode measured to 32767 on a 32k artifact, flattening, fitted by qvl."""
    fit = fit_quadratic(SATURATING)
    return _file(path, {"decoder_batch_1/block8192": {"points": [_pt(c, t) for c, t in SATURATING],
                                                      "fit": fit.to_dict()}})  # fmt: skip


def _nan(path: Path, value: float = float("nan")) -> Path:
    """audit repro nan_timings.py: NaN medians for the decoder graphs of block 8192 and the prefill chunk."""

    def pt(c):
        return {"context": c, "median_s": value, "p10_s": value, "p90_s": value, "min_s": value, "max_s": value}

    graphs = {f"decoder_batch_{b}/block8192": {"points": [pt(0), pt(8192)]} for b in range(1, 40)}
    graphs["prefill/chunk512/block8192"] = {"points": [pt(0), pt(8192)]}
    return _file(path, graphs)


def _workload(tmp_path: Path) -> Path:
    w = tmp_path / "w.jsonl"
    w.write_text('{"width": 1280, "height": 720, "count": 10}\n{"width": 640, "height": 480, "count": 30}\n')
    return w


# --- H3: extrapolation ----------------------------------------------------------------------------------------------


def test_a_fit_past_its_measured_contexts_is_extrapolated_and_never_below_the_last_point(tmp_path):
    timing = load_measured(MK, "RBLN-CR13", _saturating(tmp_path / "t.json")).get("decoder_batch_1/block8192")
    assert timing.fit is not None and timing.fit(65536) < 0.0019 and timing.fit(131072) < 0  # the fit turns down
    for context in (32768, 65536, 100_000, 131072, 262143):
        seconds, how = timing.seconds(context)
        assert how == "extrapolated" and seconds == pytest.approx(0.0019)  # held at the last measured time
    assert "outside measured contexts 0-32767" in timing.label("extrapolated")
    assert timing.seconds(8191) == (pytest.approx(0.0014), "measured")
    seconds, how = timing.seconds(20000)  # between two points: the fit, held between their times
    assert how == "fitted" and 0.0017 <= seconds <= 0.00185


def test_a_fit_below_zero_inside_the_range_is_held_between_its_neighbours(tmp_path):
    fit = {
        "c0_s": -5.0,
        "a_s_per_token": 0.0,
        "b_s_per_token2": 0.0,
        "rms_rel_error": 0.0,
        "max_rel_error": 0.0,
        "points": 2,
        "context_range": [0, 32767],
    }  # the audit's constructed fit with c0 < 0
    path = _file(tmp_path / "t.json", {"decoder_batch_1/block8192": {"points": [_pt(0, 0.001), _pt(32767, 0.002)],
                                                                     "fit": fit}})  # fmt: skip
    timing = load_measured(MK, "RBLN-CR13", path).get("decoder_batch_1/block8192")
    assert timing.seconds(16000) == (pytest.approx(0.001), "fitted")  # never 0 nor negative
    roof = MeasuredRoofline(QWEN3_VL_2B, REBEL100_COMPUTE, measured=load_measured(MK, "RBLN-CR13", path))
    assert roof.decode_step(1, 1, 16000, 8192) == pytest.approx(0.001)


def test_tune_at_100k_tokens_with_a_32k_profile_runs_and_says_extrapolated(tmp_path, monkeypatch):
    from qwenvl_rbln.tuning.search import Needs
    from qwenvl_rbln.tuning.tune import run_tune

    monkeypatch.setenv("QVL_HOME", str(tmp_path))
    _saturating(tmp_path / "timings.json")
    doc, error = run_tune(Needs(model=None, context=262144, devices=1), _workload(tmp_path), prompt_tokens=100_000)
    assert error is None  # the audit: ZeroDivisionError here (a fit clamped to 0, then divided by)
    sources = doc["cost_model"]["sources"]
    assert sources["decoder_batch_1/block8192"].startswith("extrapolated (RBLN-CR13, 2026-12-03, outside measured")
    rows = [r for r in doc["candidates"] if "decoder_batch_1/block8192" in r["timing"]["sources"]]
    assert rows and all(r["timing"]["extrapolated"] == ["decoder_batch_1/block8192"] for r in rows)
    assert all("extrapolated past the measured contexts" in r["timing"]["label"] for r in rows)
    assert doc["cost_model"]["rows_extrapolated"] >= 1
    for row in doc["candidates"]:
        for graph in row["estimate"]["decode_graphs"]:
            assert graph["step_s"] > 0 and math.isfinite(graph["tokens_per_s"])


# --- H10: values that are not figures -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (float("nan"), "median_s=nan"),
        (float("inf"), "median_s=inf"),
        (0.0, "median_s=0.0"),
        (-1.0, "median_s=-1.0"),
        (1e-300, "median_s=1e-300"),
        (1e9, "median_s=1000000000.0"),
    ],
)
def test_a_value_no_graph_call_can_have_refuses_the_file_naming_file_key_and_value(tmp_path, value, shown):
    path = _nan(tmp_path / "t.json", value)
    with pytest.raises(InputError) as err:
        load_measured(MK, "RBLN-CR13", path)
    message = err.value.message
    assert str(path) in message and "entry 'k', graph 'decoder_batch_1/block8192'" in message and shown in message
    assert "\n" not in message and "mv " in (err.value.hint or "") and "qvl profile" in (err.value.hint or "")


_FIT = {"c0_s": 0.001, "a_s_per_token": 0.0, "b_s_per_token2": 0.0, "rms_rel_error": 0.0, "max_rel_error": 0.0,
        "points": 2, "context_range": [0, 8192]}  # fmt: skip


def _bent(point: dict | None = None, **fit) -> dict:
    """A sound decoder record with one point (the second) or one fit value replaced."""
    points = [_pt(0, 0.001), point if point is not None else _pt(8192, 0.002)]
    return {"decoder_batch_1/block8192": {"points": points, "fit": {**_FIT, **fit}}}


@pytest.mark.parametrize(
    ("graphs", "says"),
    [
        (_bent({"context": 8192, "median_s": 0.002, "p10_s": 0.003, "p90_s": 0.004}), "p10_s=0.003 <= median_s"),
        (_bent({"context": 8192, "median_s": 0.002, "p10_s": 0.001, "p90_s": 0.0015}), "<= p90_s=0.0015 does not"),
        (_bent(max_rel_error=-0.1), "max_rel_error=-0.1: an error is never negative"),
        (_bent(context_range=[8192, 0]), "fit.context_range=[8192, 0] runs backwards"),
        (_bent(_pt(0, 0.002)), "context 0 is measured twice"),
        (_bent({**_pt(8192, 0.002), "context": True}), "points[1].context=True is not a token position"),
        (_bent({**_pt(8192, 0.002), "median_s": True}), "median_s=True is not a number"),
        (_bent(points=0), "fit.points=0 is not a positive whole number"),
    ],
    ids=[
        "p10-over-median",
        "median-over-p90",
        "negative-error",
        "range-backwards",
        "context-twice",
        "context-true",
        "seconds-true",
        "zero-points",
    ],  # fmt: skip
)
def test_a_record_that_is_no_sound_measurement_refuses_the_file_naming_the_value(tmp_path, graphs, says):
    path = _file(tmp_path / "t.json", graphs)
    with pytest.raises(InputError) as err:
        load_measured(MK, "RBLN-CR13", path)
    assert says in err.value.message and "graph 'decoder_batch_1/block8192'" in err.value.message, err.value.message
    assert "mv " in (err.value.hint or "")


def test_a_figure_ten_times_under_its_roofline_bound_is_refused(tmp_path):
    path = _file(tmp_path / "t.json", {"prefill/chunk512/block8192": {"points": [_pt(0, 1e-5)], "fit": None}})
    roof = MeasuredRoofline(QWEN3_VL_2B, REBEL100_COMPUTE, measured=load_measured(MK, "RBLN-CR13", path))
    with pytest.raises(InputError, match=r"graph 'prefill/chunk512/block8192': context 0 median_s=1e-05 is [\d,]+x "
                                         r"below the roofline bound"):  # fmt: skip
        roof.prefill_chunk(0, 8192)


def test_tune_refuses_nan_timings_in_one_line_and_never_ranks_them(tmp_path):
    _nan(tmp_path / "timings.json")
    res = run_qvl("tune", "--workload", str(_workload(tmp_path)), "--context", "32768", env={"QVL_HOME": str(tmp_path)})
    assert res.exit_code == EXIT_BAD_INPUT, res.stdout
    assert "median_s=nan" in res.stderr and "timings.json" in res.stderr and "move it aside" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "internal error" not in res.stderr
    assert "nan" not in res.stdout  # no table with tok/s nan


def test_nan_never_ranks_first():
    from qwenvl_rbln.tuning.estimate import score

    nan = float("nan")
    assert score({"latency_s": nan}, "latency") == math.inf
    assert score({"output_tokens_per_s": nan, "lighter_load": None}, "throughput") == math.inf
    assert score({"latency_s": 1.0}, "latency") < score({"latency_s": nan}, "latency")


@pytest.mark.parametrize("value", [float("nan"), 1e-300])
def test_deploy_never_crashes_on_bad_timings_and_never_writes_an_absurd_figure(tmp_path, monkeypatch, value):
    from qwenvl_rbln.deploy.sizing import prefill_throughput
    from qwenvl_rbln.planning.plan import build_plan
    from tests.fakes_rbln import write_artifact

    art = write_artifact(tmp_path / "art", build_plan("rebel100-1npu"))
    cfg, model_config = (json.loads((art / f).read_text()) for f in ("rbln_config.json", "config.json"))
    monkeypatch.setenv("QVL_HOME", str(tmp_path))
    _nan(tmp_path / "timings.json", value)
    out = prefill_throughput(model_config, cfg, "RBLN-CR13")  # audit: ValueError: cannot convert float NaN
    assert out["tokens_per_s"] is None and "timings.json" in out["reason"] and "median_s=" in out["reason"]


def test_deploy_reads_only_the_artifacts_own_entries_when_given_its_graph_hash(tmp_path):
    path = _file(tmp_path / "t.json", {"prefill/chunk512/block8192": {"points": [_pt(0, 0.05)], "fit": None}})
    assert load_measured(MK, "RBLN-CR13", path, graph_hash="abc").get("prefill/chunk512/block8192") is not None
    assert load_measured(MK, "RBLN-CR13", path, graph_hash="another artifact").graphs == {}
