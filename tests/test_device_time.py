"""The shared device-time model (tuning.device_time): the roofline's figures at the simulator's arguments, the
measured graphs of a timings file where it has them, a JSON round trip (the emulator rebuilds it in vLLM's
subprocess) and the declared toy model the hand-worked schedules use."""

from __future__ import annotations

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.memory.calibration import decoder_key, model_key
from qwenvl_rbln.planning.catalogue.devices import REBEL100_COMPUTE
from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_2B
from qwenvl_rbln.tuning.device_time import DeviceTimeModel, linear_model, time_model_for
from qwenvl_rbln.tuning.measured import write_entry
from qwenvl_rbln.tuning.roofline import Roofline

MODEL = "Qwen/Qwen3-VL-2B-Instruct"


def test_roofline_kind_is_the_rooflines_figures_at_the_simulators_arguments():
    m = time_model_for(model=MODEL, chunk=512, block=8192)
    roof = Roofline(QWEN3_VL_2B, REBEL100_COMPUTE, chunk=512)
    assert m.name == f"roofline {MODEL} on RBLN-CR13"
    assert m.vit(4096) == roof.vit_call(4096)
    assert m.prefill(512, 512) == roof.prefill_chunk(0, 8192)  # context = tokens in the cache after the chunk
    assert m.prefill(512, 2048) == roof.prefill_chunk(1536, 8192)
    assert m.decode(4, 3000) == roof.decode_step(4, 4, 3000, 8192)
    assert m.decode(4, 3000, rows=1) == roof.decode_step(4, 1, 3000, 8192)
    assert m.prompt(1000, 512) == pytest.approx(roof.prefill(1000, 8192))
    with pytest.raises(InputError, match="prefill chunk 256 is not the compiled prefill_chunk_size 512"):
        m.prefill(256, 256)


def test_json_round_trip_gives_the_same_figures():
    m = time_model_for(model=MODEL, chunk=512, block=8192)
    back = DeviceTimeModel.from_json(m.to_json())
    assert back == m and back.name == m.name
    assert [back.vit(1024), back.prefill(512, 1024), back.decode(2, 100)] == [m.vit(1024), m.prefill(512, 1024),
                                                                            m.decode(2, 100)]  # fmt: skip


def test_timings_kind_uses_the_measured_graph_and_scales_the_others(tmp_path):
    roof = Roofline(QWEN3_VL_2B, REBEL100_COMPUTE, chunk=512)
    pts = [(n, 2.0 * roof.decode_step(4, 4, n, 8192)) for n in (0, 4096, 8192)]
    entry = {"model_key": model_key(QWEN3_VL_2B), "npu": "RBLN-CR13", "profiled_at": "2026-12-03T10:00:00+00:00",
             "graphs": {decoder_key(4, 8192): {"points": [{"context": n, "median_s": t, "p10_s": t, "p90_s": t}
                                                           for n, t in pts]}}}  # fmt: skip
    path = tmp_path / "timings.json"
    write_entry("k", entry, emulated=False, path=path)
    m = time_model_for(model=MODEL, chunk=512, block=8192, timings=path)
    assert m.name == f"timings {path}"
    assert m.decode(4, 4096) == pytest.approx(2.0 * roof.decode_step(4, 4, 4096, 8192))  # measured point
    assert m.decode(2, 4096) == pytest.approx(2.0 * roof.decode_step(2, 2, 4096, 8192))  # scaled bound
    assert m.prefill(512, 512) == roof.prefill_chunk(0, 8192)  # nothing measured of the kind: the bound
    assert DeviceTimeModel.from_json(m.to_json()).decode(4, 4096) == m.decode(4, 4096)
    emulated = time_model_for(model=MODEL, chunk=512, block=8192, timings=path, emulated=True)
    assert emulated.decode(4, 4096) == roof.decode_step(4, 4, 4096, 8192)  # the real section is never read for it


def test_linear_model_and_refusals():
    m = linear_model(vit=(0.1, 0.001), prefill=(0.2, 0.0, 0.0001), decode=(0.01, 0.002, 0.0))
    assert m.vit(100) == pytest.approx(0.2)
    assert m.prefill(512, 1000) == pytest.approx(0.3)
    assert m.decode(4, 10) == pytest.approx(0.018)
    assert DeviceTimeModel.from_json(m.to_json()).decode(4, 10) == m.decode(4, 10)
    with pytest.raises(InputError, match="kind 'nope' is not one of roofline, timings, linear"):
        DeviceTimeModel.from_json({"kind": "nope"})
    with pytest.raises(InputError, match=r"decode=\[-1, 0, 0\] has a negative"):
        DeviceTimeModel.from_json({"kind": "linear", "vit": [0, 0], "prefill": [0, 0, 0], "decode": [-1, 0, 0]})
