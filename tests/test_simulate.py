"""The serving simulator against schedules worked out by hand from vllm-rbln 0.11.1a1's optimum scheduler, with a
declared toy time model: every prefill chunk 1 s, every decode step 0.1 s, no ViT (unless a test says so)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.tuning.device_time import DeviceTimeModel, linear_model
from qwenvl_rbln.tuning.simulate import Engine, Request, simulate

TOY = linear_model(prefill=(1.0, 0.0, 0.0), decode=(0.1, 0.0, 0.0))


@dataclass
class _Recorder:
    """The toy times, recording every graph call the simulator asks for."""

    calls: list[tuple] = field(default_factory=list)

    def vit(self, bucket: int) -> float:
        self.calls.append(("vit", bucket))
        return 0.5

    def prefill(self, chunk: int, context: int) -> float:
        self.calls.append(("prefill", chunk, context))
        return 1.0

    def decode(self, batch: int, context: float, rows: int) -> float:
        self.calls.append(("decode", batch, context, rows))
        return 0.1

    def sampler(self, rows: int) -> float:
        self.calls.append(("sampler", rows))
        return 0.0

    sampler_source = "none"


def _recorded() -> tuple[DeviceTimeModel, _Recorder]:
    rec = _Recorder()
    return DeviceTimeModel("recorder", {"kind": "test"}, rec), rec


def _engine(**kw) -> Engine:
    base = dict(batch=2, chunk=512, block_size=4096, num_blocks=4, max_model_len=8192)
    return Engine(**{**base, **kw})


def _times(trace):
    return [t for r in trace.records for t in (r.first_token, r.finish)]


def test_two_requests_arriving_together_at_batch_2_the_second_waits_for_the_firsts_prefill():
    trace = simulate(_engine(), TOY, [Request(0.0, 10, 3), Request(0.0, 10, 3)], keep_steps=True)
    # t=0 prefill A (1 s) -> A's first token at 1; t=1 prefill B -> 2; then two decode steps of both rows
    assert _times(trace) == pytest.approx([1.0, 2.2, 2.0, 2.2])
    assert [(k, round(t, 6), n) for k, t, _, n in trace.steps] == [
        ("prefill", 0.0, 1),
        ("prefill", 1.0, 1),
        ("decode", 2.0, 2),
        ("decode", 2.1, 2),
    ]
    a, b = trace.records
    assert (a.ttft, b.ttft) == pytest.approx((1.0, 2.0))
    assert (a.tpot, b.tpot) == pytest.approx(((2.2 - 1.0) / 2, 0.1))  # (latency - TTFT) / (output - 1)


def test_a_decode_stalls_while_a_long_prompt_prefills_in_chunks():
    model, rec = _recorded()
    reqs = [Request(0.0, 10, 5), Request(1.05, 1500, 5)]  # 1500 tokens: three chunks of 512
    trace = simulate(_engine(graphs=(1, 2)), model, reqs, keep_steps=True)
    # A: prefill 0-1, one decode 1-1.1; B arrives at 1.05 and its three chunks (1.1-4.1) hold A's decode for 3 s
    assert [(k, round(t, 6)) for k, t, _, _ in trace.steps] == [
        ("prefill", 0.0),
        ("decode", 1.0),
        ("prefill", 1.1),
        ("decode", 4.1),
        ("decode", 4.2),
        ("decode", 4.3),
        ("decode", 4.4),
    ]
    assert _times(trace) == pytest.approx([1.0, 4.4, 4.1, 4.5])
    assert trace.records[1].ttft == pytest.approx(3.05)
    prefills = [c for c in rec.calls if c[0] == "prefill"]
    assert prefills == [("prefill", 512, 512), ("prefill", 512, 512), ("prefill", 512, 1024), ("prefill", 512, 1536)]
    decodes = [c for c in rec.calls if c[0] == "decode"]
    # graph 1 for A alone at context 11; then graph 2 for both at the longer row's context (B: 1500 + 1)
    assert decodes[0] == ("decode", 1, 11, 1)
    assert decodes[1] == ("decode", 2, 1501, 2)
    assert decodes[-1] == ("decode", 1, 1504, 1)  # A finished at 4.4: B decodes alone on graph 1


def test_a_full_kv_pool_holds_a_request_back():
    # 3 blocks of 16 that cannot hold 2 rows x 32 tokens: vLLM keeps one for its null block, 2 usable
    eng = _engine(block_size=16, num_blocks=3, max_model_len=32)
    assert eng.usable_blocks() == 2
    trace = simulate(eng, TOY, [Request(0.0, 20, 3), Request(0.0, 10, 3)], keep_steps=True)
    # A takes both blocks; B waits (its one block is not free) while A decodes, and prefills when A finishes
    assert [(k, round(t, 6)) for k, t, _, _ in trace.steps] == [
        ("prefill", 0.0),
        ("decode", 1.0),
        ("decode", 1.1),
        ("prefill", 1.2),
        ("decode", 2.2),
        ("decode", 2.3),
    ]
    assert trace.records[1].ttft == pytest.approx(2.2)
    full = _engine(block_size=16, num_blocks=4, max_model_len=32)  # a full pool: every block usable
    assert full.usable_blocks() == 4
    assert simulate(full, TOY, [Request(0.0, 20, 3), Request(0.0, 10, 3)]).records[1].ttft == pytest.approx(2.0)


def test_a_decode_that_needs_a_block_preempts_the_last_running_request_which_is_recomputed():
    model, rec = _recorded()
    eng = _engine(block_size=4, num_blocks=4, max_model_len=12, graphs=(1, 2))  # not full: 3 usable blocks
    trace = simulate(eng, model, [Request(0.0, 3, 4, vit=(64,)), Request(0.0, 3, 4, vit=(64,))], keep_steps=True)
    a, b = trace.records
    # each prefill: one ViT call (0.5 s) + one chunk (1 s). A 0-1.5, B 1.5-3, both decode 3-3.1; at 3.1 A's 5th
    # token needs a 2nd block (the last free one) and B's too: B (the last running) is preempted, A decodes alone,
    # B's recompute (5 tokens, 2 blocks) waits for A to finish at 3.3, then runs 3.3-4.8 (ViT again), decode to 4.9
    assert [(k, round(t, 6), n) for k, t, _, n in trace.steps] == [
        ("prefill", 0.0, 1),
        ("prefill", 1.5, 1),
        ("decode", 3.0, 2),
        ("decode", 3.1, 1),
        ("decode", 3.2, 1),
        ("prefill", 3.3, 1),
        ("decode", 4.8, 1),
    ]
    assert (a.preemptions, b.preemptions) == (0, 1)
    assert (b.first_token, b.finish) == pytest.approx((3.0, 4.9))  # the first token is kept from the first prefill
    assert [round(s, 6) for k, _, s, _ in trace.steps if k == "prefill"] == [1.5, 1.5, 1.5]
    assert ("vit", 64) in rec.calls


def test_graph_selection_is_the_smallest_compiled_graph_that_holds_the_running_rows():
    model, rec = _recorded()
    simulate(_engine(batch=4, graphs=(2, 4)), model, [Request(0.0, 10, 2) for _ in range(3)])
    assert [c[1] for c in rec.calls if c[0] == "decode"] == [4]  # 3 rows -> graph 4


def test_requests_the_engine_would_refuse_are_refused_naming_them():
    with pytest.raises(InputError, match="longer than max_seq_len 8192"):
        simulate(_engine(), TOY, [Request(0.0, 8000, 500)])
    with pytest.raises(InputError, match="needs 3 KV blocks; the pool has 2"):
        simulate(_engine(block_size=16, num_blocks=3, max_model_len=64), TOY, [Request(0.0, 40, 2)])


def test_an_artifacts_scheduler_facts_are_read_as_vllm_rbln_syncs_them(tmp_path):
    from qwenvl_rbln.planning.plan import build_plan
    from qwenvl_rbln.tuning.simulate import engine_for_artifact
    from tests.fakes_rbln import write_artifact

    plan = build_plan("rebel100-2npu-batch4")
    engine, buckets = engine_for_artifact(write_artifact(tmp_path / "a", plan))
    r = plan.resolved
    assert (engine.batch, engine.chunk, engine.block_size, engine.max_model_len) == (
        r.batch_size, r.prefill_chunk_size, r.kvcache_block_size, r.max_seq_len)  # fmt: skip
    assert engine.decoder_graphs() == tuple(sorted(r.decoder_batch_sizes))
    assert buckets == tuple(sorted(r.vit_buckets))
    with pytest.raises(InputError, match="rbln_config.json is missing"):
        engine_for_artifact(tmp_path)


@pytest.mark.parametrize("seed", range(12))
def test_coasting_through_identical_decode_steps_changes_nothing(seed):
    """The fast path (runs of decode steps in one go) gives the same steps, times and records as one step at a time,
    through arrivals, finishes, block boundaries, a full pool and preemptions."""
    import random

    rng = random.Random(seed)
    eng = _engine(batch=rng.choice([1, 2, 3, 4]), block_size=16, num_blocks=rng.choice([4, 6, 9, 40]),
                  max_model_len=64, graphs=(1, 2, 4))  # fmt: skip
    model = linear_model(vit=(0.2, 0.0), prefill=(0.3, 0.0, 0.001), decode=(0.02, 0.01, 0.0001))
    reqs, t = [], 0.0
    for _ in range(30):
        t += rng.expovariate(rng.choice([0.5, 2.0, 8.0]))
        prompt = rng.randint(1, 40)
        need = eng.usable_blocks() * 16
        out = rng.randint(1, max(1, min(64, need) - prompt))
        reqs.append(Request(round(t, 3), prompt, out, (64,) * rng.randint(0, 2)))
    fast = simulate(eng, model, reqs, keep_steps=True)
    slow = simulate(eng, model, reqs, keep_steps=True, fast=False)
    assert fast.steps == slow.steps
    assert [(r.first_token, r.finish, r.generated, r.preemptions) for r in fast.records] == [
        (r.first_token, r.finish, r.generated, r.preemptions) for r in slow.records]  # fmt: skip
