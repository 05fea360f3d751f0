"""tune ranks every row on one footing: an unmeasured graph of a kind qvl profile measured is its bound times that
kind's measured/bound ratio (a "scaled bound"), so a row is never ranked first only because nothing of it was
measured; deploy's reader keeps bare bounds."""

from __future__ import annotations

import pytest

from qwenvl_rbln.memory.calibration import decoder_key, model_key, prefill_key
from qwenvl_rbln.planning.catalogue.devices import REBEL100_COMPUTE
from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_2B
from qwenvl_rbln.tuning.fit import fit_quadratic
from qwenvl_rbln.tuning.measured import GraphTiming, Measured, write_entry
from qwenvl_rbln.tuning.measured_roofline import MeasuredRoofline
from qwenvl_rbln.tuning.roofline import Roofline

BOUND = Roofline(QWEN3_VL_2B, REBEL100_COMPUTE)
SLOWER = 3.0  # every measured graph: three times its bound


def _record(pts: list[tuple[int, float]]) -> dict:
    return {"points": [{"context": n, "median_s": t, "p10_s": t, "p90_s": t} for n, t in pts],
            "fit": fit_quadratic(pts).to_dict()}  # fmt: skip


def _partition_8192_measured() -> dict:
    """The 8192 partition's decoder graphs (1, 2, 4, 8) and prefill chunk measured at SLOWER x their bound; the
    other partitions and the ViT never profiled (as after `qvl profile` of one artifact)."""
    graphs = {}
    for b in (1, 2, 4, 8):
        graphs[decoder_key(b, 8192)] = _record(
            [(n, SLOWER * BOUND.decode_step(b, b, n, 8192)) for n in (0, 16384, 32767)]
        )
    graphs[prefill_key(512, 8192)] = _record([(n, SLOWER * BOUND.prefill_chunk(n, 8192)) for n in (0, 16384, 32256)])
    return {"model_key": model_key(QWEN3_VL_2B), "npu": "RBLN-CR13", "profiled_at": "2026-12-03T10:00:00+00:00",
            "graphs": graphs}  # fmt: skip


def test_an_unmeasured_graph_of_a_measured_kind_is_its_bound_times_the_kinds_ratio():
    key = decoder_key(1, 8192)
    t = SLOWER * BOUND.decode_step(1, 1, 1000, 8192)
    timing = GraphTiming(key, {1000: {"median_s": t, "p10_s": t, "p90_s": t}}, None, "RBLN-CR13", "2026-12-03", False)
    tune_roof = MeasuredRoofline(QWEN3_VL_2B, REBEL100_COMPUTE, measured=Measured({key: timing}), scale_unmeasured=True)
    assert tune_roof.decode_step(2, 2, 1000, 8192) == pytest.approx(SLOWER * BOUND.decode_step(2, 2, 1000, 8192))
    assert tune_roof.sources[decoder_key(2, 8192)].startswith("scaled bound (x3.00: the median measured/bound ratio")
    assert tune_roof.prefill_chunk(0, 8192) == BOUND.prefill_chunk(0, 8192)  # no prefill measured: the bare bound
    assert tune_roof.sources[prefill_key(512, 8192)] == "roofline bound"
    deploy_roof = MeasuredRoofline(QWEN3_VL_2B, REBEL100_COMPUTE, measured=Measured({key: timing}))
    assert deploy_roof.decode_step(2, 2, 1000, 8192) == BOUND.decode_step(2, 2, 1000, 8192)  # never labelled measured
    assert deploy_roof.sources[decoder_key(2, 8192)] == "roofline bound"


def test_a_partition_nobody_profiled_no_longer_outranks_the_measured_one(tmp_path, monkeypatch):
    from qwenvl_rbln.tuning.search import Needs
    from qwenvl_rbln.tuning.tune import run_tune

    monkeypatch.setenv("QVL_HOME", str(tmp_path))
    write_entry("k", _partition_8192_measured(), emulated=False)
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"width": 1280, "height": 720, "count": 3}\n{"width": 640, "height": 480, "count": 2}\n')
    doc, error = run_tune(Needs(model=None, context=32768, devices=1), workload)
    assert error is None
    # before: 4096 (its bare bounds looked 3x faster than 8192's measured figures); now the tie goes to 8192
    assert doc["best"]["kvcache_partition_len"] == 8192
    (other,) = [n for n in doc["neighbours"] if n["change"] == "kvcache_partition_len 4096"]
    assert other["why"].startswith("no faster")
    assert doc["cost_model"]["ranked_by"].startswith("one footing: measured figures where timings.json has them")
    assert "ViT call: nothing measured" in doc["cost_model"]["ranked_by"]
    assert doc["cost_model"]["scaled_by"]["decode step"] == pytest.approx(SLOWER)
