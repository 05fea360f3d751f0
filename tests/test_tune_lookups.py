"""tune's measured lookups do their bookkeeping once: a graph's label is built when its least sure figure changes
(not on every lookup, which the serving simulator makes per step), the measured contexts are sorted once per graph,
and the scale factors are computed once per tune."""

from __future__ import annotations

from qwenvl_rbln.memory.calibration import decoder_key
from qwenvl_rbln.planning.catalogue.devices import REBEL100_COMPUTE
from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_2B
from qwenvl_rbln.tuning import measured
from qwenvl_rbln.tuning.measured import GraphTiming, Measured
from qwenvl_rbln.tuning.measured_roofline import MeasuredRoofline


def _roof() -> MeasuredRoofline:
    key = decoder_key(4, 8192)
    pts = {n: {"median_s": 0.01 + n * 1e-7, "p10_s": 0.01, "p90_s": 0.02} for n in (0, 4096, 8192)}
    timing = GraphTiming(key, pts, None, "RBLN-CR13", "2026-12-03", False)
    return MeasuredRoofline(QWEN3_VL_2B, REBEL100_COMPUTE, measured=Measured({key: timing}), scale_unmeasured=True)


def test_a_label_is_built_once_per_kind_of_figure_not_per_lookup(monkeypatch):
    calls: list[str] = []
    real = GraphTiming.label
    monkeypatch.setattr(GraphTiming, "label", lambda self, how: calls.append(how) or real(self, how))
    roof = _roof()
    for _ in range(50):
        roof.decode_step(4, 4, 4096, 8192)  # measured
    assert calls == ["measured"]
    for n in range(1, 50):
        roof.decode_step(4, 4, 4096 + n, 8192)  # interpolated between measured points
    assert calls == ["measured", "interpolated"]
    assert roof.sources[decoder_key(4, 8192)].startswith("interpolated (RBLN-CR13")


def test_the_contexts_are_sorted_once_per_graph(monkeypatch):
    roof = _roof()
    timing = roof.measured.get(decoder_key(4, 8192))
    seen = []
    real = sorted
    monkeypatch.setattr(measured, "sorted", lambda xs, **kw: seen.append(1) or real(xs, **kw), raising=False)
    for n in range(20):
        timing.seconds(100.0 + n)
    assert len(seen) <= 1


def test_tune_computes_the_scale_factors_once(tmp_path, monkeypatch):
    from qwenvl_rbln.memory.calibration import model_key
    from qwenvl_rbln.tuning.measured import write_entry
    from qwenvl_rbln.tuning.roofline import Roofline
    from qwenvl_rbln.tuning.search import Needs
    from qwenvl_rbln.tuning.tune import run_tune

    monkeypatch.setenv("QVL_HOME", str(tmp_path))
    bound = Roofline(QWEN3_VL_2B, REBEL100_COMPUTE)
    pts = [{"context": n, "median_s": t, "p10_s": t, "p90_s": t}
           for n in (0, 4096, 8191) for t in [2 * bound.decode_step(1, 1, n, 8192)]]  # fmt: skip
    write_entry("k", {"model_key": model_key(QWEN3_VL_2B), "npu": "RBLN-CR13", "profiled_at": "2026-12-03",
                      "graphs": {decoder_key(1, 8192): {"points": pts}}}, emulated=False)  # fmt: skip
    calls = []
    real = MeasuredRoofline.scales
    monkeypatch.setattr(MeasuredRoofline, "scales", lambda self: calls.append(1) or real(self))
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"width": 640, "height": 480, "count": 2}\n')
    doc, error = run_tune(Needs(model=None, context=8192), workload)
    assert error is None and doc["cost_model"]["measured_graphs"] and len(calls) == 1
