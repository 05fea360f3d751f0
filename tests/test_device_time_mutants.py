"""The device-time model (tuning/device_time.py) where its tests leave it open (audit 2026-12-06, mutants D01,
D05, D06, D07): a prompt of an exact multiple of the chunk, the declared model's decode by real rows, a MoE through
the roofline kind (its high end, every expert computed), and ``--time-model timings:FILE``. Roofline bounds of
the catalogue's geometries; nothing is a measured device figure."""

from __future__ import annotations

import json

import pytest

from qwenvl_rbln.planning.catalogue.devices import compute_spec
from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_30B_A3B
from qwenvl_rbln.tuning.device_time import linear_model, model_for_flag, time_model_for
from qwenvl_rbln.tuning.roofline import Roofline

MOE = "Qwen/Qwen3-VL-30B-A3B-Instruct"


@pytest.mark.parametrize("tokens, chunks", [(1, 1), (127, 1), (128, 1), (129, 2), (256, 2), (257, 3)])
def test_a_prompt_is_ceil_tokens_over_chunk_calls_at_growing_contexts(tokens, chunks):
    """D01: 256 tokens in chunks of 128 are two calls (contexts 128 and 256), not three."""
    m = linear_model(prefill=(0.0, 0.0, 1e-3))  # a chunk costs 1 ms x its context
    assert m.prompt(tokens, 128) == pytest.approx(sum(m.prefill(128, 128 * (i + 1)) for i in range(chunks)))


def test_the_declared_decode_is_by_real_rows_and_the_graph_by_its_batch():
    """D05: d0 + d1 x batch + d2 x rows x context: one real row of a graph of 4 at context 10."""
    m = linear_model(decode=(0.5, 0.01, 1e-3))
    assert m.decode(4, 10, rows=1) == pytest.approx(0.5 + 0.04 + 0.01)
    assert m.decode(4, 10) == pytest.approx(0.5 + 0.04 + 0.04)  # rows default to the graph's batch


def test_a_moe_through_the_roofline_kind_is_at_its_high_end():
    """D06: tune ranks a MoE by its high end (every expert computed); the simulator and the timed emulator use the
    same figure, well above the routed (low) end at a small decode."""
    m = time_model_for(model=MOE, chunk=512, block=8192)
    roof = Roofline(QWEN3_VL_30B_A3B, compute_spec("RBLN-CR13"), chunk=512)
    assert m.decode(4, 3000, rows=1) == roof.high_end().decode_step(4, 1, 3000.0, 8192)
    assert m.decode(4, 3000, rows=1) > 2 * roof.decode_step(4, 1, 3000.0, 8192)
    assert m.prefill(512, 1024) == roof.high_end().prefill_chunk(512, 8192)


def test_the_time_model_flag_reads_each_of_its_three_forms(tmp_path):
    """D07: roofline:MODEL, timings:FILE (this artifact's graphs in qvl profile's file) and a model's JSON file."""
    from qwenvl_rbln.artifacts.manifest import write_manifest
    from qwenvl_rbln.planning.plan import build_plan
    from tests.fakes_rbln import write_artifact

    plan = build_plan("rebel100-1npu")
    art = write_artifact(tmp_path / "art", plan)
    write_manifest(art, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": MOE}})
    timings = tmp_path / "timings.json"
    m = model_for_flag(f"timings:{timings}", art)
    assert (m.spec["kind"], m.spec["path"], m.name) == ("timings", str(timings), f"timings {timings}")
    assert m.spec["graph_hash"] and m.spec["model"] == str(art)
    r = model_for_flag(f"roofline:{MOE}", art)
    assert (r.spec["kind"], r.spec["model"]) == ("roofline", MOE)
    assert (r.spec["chunk"], r.spec["block"]) == (plan.resolved.prefill_chunk_size, plan.resolved.kvcache_partition_len)
    declared = linear_model(decode=(0.5, 0.0, 0.0), name="declared")
    (tmp_path / "m.json").write_text(json.dumps(declared.to_json()))
    back = model_for_flag(str(tmp_path / "m.json"), art)
    assert back.name == "declared" and back.decode(1, 1) == 0.5
