"""The serving simulator against schedules worked out by hand from vllm-rbln 0.11.1a1's optimum scheduler, with a
declared toy time model: every prefill chunk 1 s, every decode step 0.1 s, no ViT (unless a test says so)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.tuning.device_time import DeviceTimeModel, linear_model
from qwenvl_rbln.tuning.host_time import HOST_FREE, HostTimeModel
from qwenvl_rbln.tuning.simulate import LONGEST, OWN, Engine, Request, sampler_buckets, simulate

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
    # the recompute is charged its ViT again: qvl's vLLM plugin gives a resumed request its pixels again, so under
    # qvl serve it runs (vllm-rbln alone would run none and prefill the placeholders as text): 0.5 s ViT + 1 s chunk
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
    through arrivals, finishes, block boundaries, a full pool and preemptions; with host time, the sampler, and
    decode rows at either context end, down to the device and host seconds."""
    import random

    rng = random.Random(seed)
    eng = _engine(batch=rng.choice([1, 2, 3, 4]), block_size=16, num_blocks=rng.choice([4, 6, 9, 40]),
                  max_model_len=64, graphs=rng.choice([(1, 2, 4), (4,)]))  # fmt: skip
    model = linear_model(vit=(0.2, 0.0), prefill=(0.3, 0.0, 0.001), decode=(0.02, 0.01, 0.0001),
                         sampler=(0.003, 0.0007))  # fmt: skip
    host = HostTimeModel(0.004, 1e-5, 0.002, 0.003, 0.0005, source="test") if seed % 3 else HOST_FREE
    end = OWN if seed % 2 else LONGEST
    reqs, t = [], 0.0
    for _ in range(30):
        t += rng.expovariate(rng.choice([0.5, 2.0, 8.0]))
        prompt = rng.randint(1, 40)
        need = eng.usable_blocks() * 16
        out = rng.randint(1, max(1, min(64, need) - prompt))
        reqs.append(Request(round(t, 3), prompt, out, (64,) * rng.randint(0, 2)))
    fast = simulate(eng, model, reqs, host=host, context_end=end, keep_steps=True)
    slow = simulate(eng, model, reqs, host=host, context_end=end, keep_steps=True, fast=False)
    assert fast.steps == slow.steps
    assert [(r.first_token, r.finish, r.generated, r.preemptions) for r in fast.records] == [
        (r.first_token, r.finish, r.generated, r.preemptions) for r in slow.records]  # fmt: skip
    assert (fast.end, fast.device_s, fast.host_s) == (slow.end, slow.device_s, slow.host_s)
    assert fast.host_s > 0 if not host.is_zero else fast.host_s == 0


def test_host_time_and_the_sampler_are_charged_every_step_by_hand():
    """Two requests at 0 on batch 2 (graphs 1, 2): chunk 1 s, decode 0.1 s, sampler 0.02 s + 0.01 s per row; host
    0.3 s per prefill, 0.05 s + 0.01 s per row per decode. Worked by hand:
    prefill A 0-1.33 (1 + sampler(1) 0.03 + host 0.3), prefill B 1.33-2.66, two decodes of both rows, each
    0.1 + sampler(2 rows) 0.04 + host 0.07 = 0.21 s: 2.66-2.87-3.08."""
    model = linear_model(prefill=(1.0, 0.0, 0.0), decode=(0.1, 0.0, 0.0), sampler=(0.02, 0.01))
    host = HostTimeModel(prefill_base_s=0.3, decode_base_s=0.05, decode_per_row_s=0.01, source="by hand")
    trace = simulate(_engine(graphs=(1, 2)), model, [Request(0.0, 10, 3), Request(0.0, 10, 3)], host=host,
                     keep_steps=True)  # fmt: skip
    assert [(k, round(t, 9), round(s, 9), n) for k, t, s, n in trace.steps] == [
        ("prefill", 0.0, 1.33, 1),
        ("prefill", 1.33, 1.33, 1),
        ("decode", 2.66, 0.21, 2),
        ("decode", 2.87, 0.21, 2),
    ]
    assert _times(trace) == pytest.approx([1.33, 3.08, 2.66, 3.08])
    assert (trace.device_s, trace.host_s, trace.end) == pytest.approx((2 * 1.03 + 2 * 0.14, 2 * 0.3 + 2 * 0.07, 3.08))
    assert trace.npu_busy_share == pytest.approx(2.34 / 3.08)
    # without host time the same schedule is 0.74 s shorter, and the NPU is never idle
    bare = simulate(_engine(graphs=(1, 2)), model, [Request(0.0, 10, 3), Request(0.0, 10, 3)])
    assert bare.end == pytest.approx(2.34) and bare.npu_busy_share == pytest.approx(1.0)


def test_a_prefill_steps_host_time_counts_its_tokens_and_vit_calls():
    host = HostTimeModel(prefill_base_s=0.1, prefill_per_token_s=0.001, prefill_per_image_s=0.05, source="x")
    trace = simulate(_engine(), TOY, [Request(0.0, 100, 1, vit=(64, 64))], host=host, keep_steps=True)
    assert trace.steps[0][2] == pytest.approx(1.0 + 0.1 + 0.1 + 2 * 0.05)  # one chunk + base + 100 tokens + 2 calls


def test_the_sampler_runs_on_vllm_rblns_padded_rows():
    """One row unpadded; else the smallest bucket >= the rows: the decoder graphs when there are several, else
    vllm-rbln's get_bucket_sizes(max_num_seqs) (ported in sampler_buckets, checked against the real one below)."""
    assert _engine(batch=16).sampler_rows(1) == 1
    assert _engine(batch=16).sampler_rows(2) == 2 and _engine(batch=16).sampler_rows(9) == 16
    assert _engine(batch=20).sampler_rows(17) == 20  # the batch is appended as the last bucket
    assert _engine(batch=8, graphs=(2, 5, 8)).sampler_rows(3) == 5
    model, rec = _recorded()
    simulate(_engine(batch=4, graphs=(4,)), model, [Request(0.0, 10 + i, 2) for i in range(3)])  # 3 prefills
    assert [c for c in rec.calls if c[0] == "sampler"] == [("sampler", 1)] * 3 + [("sampler", 4)]


def test_sampler_buckets_is_vllm_rblns_get_bucket_sizes():
    pytest.importorskip("vllm_rbln")
    from qwenvl_rbln.backends import emulator

    emulator.activate()  # vllm-rbln's runner imports rebel
    from vllm_rbln.v1.worker.optimum_model_runner import RBLNOptimumModelRunner

    for batch in (1, 2, 3, 4, 7, 8, 9, 20, 64, 255, 256, 300, 512):
        assert sampler_buckets(batch) == sorted(RBLNOptimumModelRunner.get_bucket_sizes(batch)), batch


def test_each_decode_row_is_charged_at_its_own_context_or_every_row_at_the_longest():
    """Two rows at contexts 11 and 1501: the lower end asks the model for 2 rows at their mean (the cost is linear
    in rows x context), the upper end for 2 rows at 1501."""
    reqs = [Request(0.0, 10, 2), Request(0.0, 1500, 2)]
    seen = {}
    for end in (OWN, LONGEST):
        model, rec = _recorded()
        simulate(_engine(graphs=(1, 2)), model, reqs, context_end=end)
        seen[end] = [c for c in rec.calls if c[0] == "decode"]
    assert seen[OWN] == [("decode", 2, (11 + 1501) / 2, 2)]
    assert seen[LONGEST] == [("decode", 2, 1501, 2)]
    with pytest.raises(InputError, match="context end 'middle'"):
        simulate(_engine(), TOY, reqs, context_end="middle")


def test_the_roofline_of_a_mixed_batch_at_each_rows_own_context_is_the_audits_figure():
    """upstream audit W12: Qwen3-VL-2B, graph 8, one row at 8192 and seven at 100: 2.283 ms with every row at the
    longest context, 0.929 ms with each at its own."""
    from qwenvl_rbln.tuning.device_time import time_model_for

    m = time_model_for(model="Qwen/Qwen3-VL-2B-Instruct", chunk=512, block=8192)
    assert m.decode(8, 8192, rows=8) * 1e3 == pytest.approx(2.283, abs=5e-4)
    assert m.decode(8, [8192] + [100] * 7) * 1e3 == pytest.approx(0.929, abs=5e-4)
    assert m.decode(8, [100] * 8) == pytest.approx(m.decode(8, 100, rows=8))
    # the sampler: the stated assumption (8 rows of a 151,936-token vocabulary at 4.8 TB/s + the launch cost)
    assert m.sampler(8) == pytest.approx(20e-6 + 8 * 151936 * 2 / 4.8e12)
    assert "assumed, not measured" in m.sampler_source
