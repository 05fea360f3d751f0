"""The serving simulator (tuning/simulate.py) on the paths the hand-worked scenarios of test_simulate.py do not
reach (audit 2026-12-06, mutants S13, S14, S17 and mutmut's survivors): a preempted request goes back to the head
of the queue, ahead of one already waiting; a step after a preemption and a step of fewer rows than its graph are
priced at the rows that run; requests in any order; a 1-token request; the refusals; and an artifact's config
with keys left out (optimum-rbln's defaults). Declared toy times; nothing here is a device figure."""

from __future__ import annotations

import json

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.tuning.device_time import linear_model
from qwenvl_rbln.tuning.simulate import Engine, Request, engine_for_artifact, simulate

TOY = linear_model(prefill=(1.0, 0.0, 0.0), decode=(0.1, 0.0, 0.0))  # every prefill 1 s, every decode step 0.1 s
BY_ROWS = linear_model(prefill=(1.0, 0.0, 0.0), decode=(0.0, 0.0, 1e-3))  # a decode step: 1 ms x rows x context
# 4-token blocks, 4 blocks (not every row at the full context: 3 usable), 2 rows
SMALL = Engine(batch=2, chunk=512, block_size=4, num_blocks=4, max_model_len=12, graphs=(1, 2))


def _steps(trace):
    return [(k, round(t, 6), n) for k, t, _, n in trace.steps]


def test_a_preempted_request_goes_back_ahead_of_the_requests_already_waiting():
    """S13: A and B run, C waits (batch 2). At 2.1 A's 5th token needs a block: B (the last running) is preempted
    and put at the HEAD of the queue, so when A finishes at 2.3 B's recompute prefills before C."""
    reqs = [Request(0.0, 3, 4), Request(0.0, 3, 4), Request(0.0, 3, 4)]
    trace = simulate(SMALL, TOY, reqs, keep_steps=True)
    a, b, c = trace.records
    assert _steps(trace) == [
        ("prefill", 0.0, 1),  # A
        ("prefill", 1.0, 1),  # B
        ("decode", 2.0, 2),
        ("decode", 2.1, 1),  # B preempted
        ("decode", 2.2, 1),
        ("prefill", 2.3, 1),  # B's recompute
        ("prefill", 3.3, 1),  # C
        ("decode", 4.3, 2),
        ("decode", 4.4, 1),
        ("decode", 4.5, 1),
    ]
    assert (a.preemptions, b.preemptions, c.preemptions) == (0, 1, 0)
    assert (b.first_token, b.finish) == pytest.approx((2.0, 4.4))
    assert (c.first_token, c.finish) == pytest.approx((4.3, 4.6))
    assert trace.end == pytest.approx(4.6)  # the run ends with its last step


def test_a_step_after_a_preemption_is_priced_at_the_rows_that_run():
    """S14: B (8 tokens, the longer row) needs a third block when none is free and is itself preempted: the step
    that runs is A's alone, at A's context, the same step as A alone would run (the model is rows x context)."""
    a, b = Request(0.0, 3, 6), Request(0.0, 8, 4)
    both = simulate(SMALL, BY_ROWS, [a, b], keep_steps=True)
    alone = simulate(SMALL, BY_ROWS, [a], keep_steps=True)
    assert both.records[1].preemptions == 1
    assert [(k, n) for k, _, _, n in both.steps[:3]] == [("prefill", 1), ("prefill", 1), ("decode", 1)]
    assert [k for k, _, _, _ in alone.steps[:2]] == ["prefill", "decode"]
    assert both.steps[2][2] == pytest.approx(alone.steps[1][2])  # A's first decode: A's own context


def test_a_decode_of_fewer_rows_than_its_graph_is_priced_at_its_real_rows():
    """S17: one row on the only compiled graph (4 rows) costs one row's time under a model of real rows, the same
    as on a graph of 1."""
    req = [Request(0.0, 10, 3)]
    wide = simulate(Engine(batch=4, chunk=512, block_size=64, num_blocks=4, max_model_len=64, graphs=(4,)), BY_ROWS,
                    req, keep_steps=True)  # fmt: skip
    narrow = simulate(Engine(batch=1, chunk=512, block_size=64, num_blocks=1, max_model_len=64), BY_ROWS, req,
                      keep_steps=True)  # fmt: skip
    assert [s for k, _, s, _ in wide.steps if k == "decode"] == pytest.approx([0.011, 0.012])  # 1 row x 11, x 12
    assert [s for k, _, s, _ in wide.steps] == [s for k, _, s, _ in narrow.steps]


def test_requests_are_taken_by_arrival_whatever_order_they_are_given_in():
    reqs = [Request(0.0, 10, 3), Request(0.5, 20, 2), Request(0.7, 5, 4), Request(3.0, 10, 1)]
    given = simulate(SMALL.__class__(batch=2, chunk=512, block_size=64, num_blocks=4, max_model_len=64), TOY, reqs)
    back = simulate(SMALL.__class__(batch=2, chunk=512, block_size=64, num_blocks=4, max_model_len=64), TOY,
                    list(reversed(reqs)))  # fmt: skip
    key = [(r.request, r.first_token, r.finish) for r in given.records]
    assert [(r.request, r.first_token, r.finish) for r in back.records] == key
    assert [r.request.arrival for r in back.records] == [0.0, 0.5, 0.7, 3.0]


def test_a_one_token_request_finishes_at_its_prefill():
    trace = simulate(SMALL, TOY, [Request(0.0, 3, 1)])
    (rec,) = trace.records
    assert (rec.first_token, rec.finish, rec.latency, rec.ttft, rec.tpot) == (1.0, 1.0, 1.0, 1.0, None)


@pytest.mark.parametrize("prompt, output", [(5, 0), (0, 5), (0, 0)])
def test_a_request_of_no_prompt_or_no_output_is_refused(prompt, output):
    with pytest.raises(InputError, match=f"a request of {prompt} prompt and {output} output tokens"):
        simulate(SMALL, TOY, [Request(0.0, prompt, output)])


def test_a_request_within_max_seq_len_but_over_the_kv_pool_is_refused():
    """A short prompt with a long output: its prompt alone fits one block, prompt + output needs three."""
    eng = Engine(batch=2, chunk=512, block_size=16, num_blocks=3, max_model_len=64)
    with pytest.raises(InputError, match="a request of 40 tokens needs 3 KV blocks; the pool has 2"):
        simulate(eng, TOY, [Request(0.0, 10, 30)])


def _artifact(tmp_path, **cfg):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "rbln_config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_an_artifact_config_without_the_optional_keys_reads_as_optimum_rblns_defaults(tmp_path):
    """Block size: kvcache_block_size, else kvcache_partition_len, else max_seq_len; the pool: kvcache_num_blocks,
    else every row at the full context; the chunk 128; one decoder graph at the batch; no ViT buckets."""
    eng, buckets = engine_for_artifact(_artifact(tmp_path / "a", max_seq_len=8192, batch_size=2))
    assert (eng.block_size, eng.num_blocks, eng.chunk, eng.decoder_graphs(), buckets) == (8192, 2, 128, (2,), ())
    eng, _ = engine_for_artifact(_artifact(tmp_path / "b", max_seq_len=8192, batch_size=3, kvcache_partition_len=4096))
    assert (eng.block_size, eng.num_blocks) == (4096, 6)
    eng, buckets = engine_for_artifact(
        _artifact(
            tmp_path / "c",
            max_seq_len=8192,
            batch_size=2,
            kvcache_partition_len=4096,
            kvcache_block_size=1024,
            kvcache_num_blocks=5,
            prefill_chunk_size=256,
            visual={"max_seq_len": 4096},
        )  # fmt: skip
    )
    assert (eng.block_size, eng.num_blocks, eng.chunk, buckets) == (1024, 5, 256, (4096,))
    _, buckets = engine_for_artifact(_artifact(tmp_path / "d", max_seq_len=64, batch_size=1,
                                               visual={"max_seq_len": [4096, 1024]}))  # fmt: skip
    assert buckets == (1024, 4096)
    with pytest.raises(InputError, match=r"cannot be read as an optimum-rbln config \(KeyError: 'batch_size'\)"):
        engine_for_artifact(_artifact(tmp_path / "e", max_seq_len=8192))


def test_a_row_that_needs_a_block_takes_the_last_free_one_without_preempting_and_the_next_row_runs_too():
    """A (4 tokens + its first) needs a second block and exactly one is free: it takes it, nobody is preempted,
    and B (behind it, no new block) decodes in the same step."""
    trace = simulate(SMALL, TOY, [Request(0.0, 4, 3), Request(0.0, 1, 3)], keep_steps=True)
    assert [r.preemptions for r in trace.records] == [0, 0]
    assert _steps(trace) == [("prefill", 0.0, 1), ("prefill", 1.0, 1), ("decode", 2.0, 2), ("decode", 2.1, 2)]


def test_a_request_preempted_twice_counts_two_preemptions():
    """4 usable blocks of 4 tokens, 3 rows. At 3.0 A needs a block: C (last) is preempted for it, then B needs one
    and is itself preempted; A runs alone and finishes at 3.5; B (3 blocks) and C prefill again; at 5.5 C needs a
    block and none is free: C is preempted a second time and recomputed after B finishes at 5.8."""
    eng = Engine(batch=3, chunk=512, block_size=4, num_blocks=5, max_model_len=16)
    trace = simulate(eng, TOY, [Request(0.0, 4, 6), Request(0.0, 8, 5), Request(0.0, 3, 3)], keep_steps=True)
    assert [r.preemptions for r in trace.records] == [0, 1, 2]
    assert [t for r in trace.records for t in (r.first_token, r.finish)] == pytest.approx(
        [1.0, 3.5, 2.0, 5.8, 3.0, 6.8]
    )
    assert [(k, n) for k, _, _, n in trace.steps].count(("prefill", 1)) == 6
