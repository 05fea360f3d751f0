"""buckets.py: optimum-rbln's selection rules, the ViT FLOPs model, and the exact optimiser."""

from __future__ import annotations

import itertools
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_2B, QWEN3_VL_8B, QWEN3_VL_TINY
from qwenvl_rbln.vision import buckets as bk

V2B = QWEN3_VL_2B.vision


def _searchsorted_left(sorted_list: list[int], value: int) -> int:
    """Reference: the index torch.searchsorted(side='left') returns (first element >= value)."""
    for i, b in enumerate(sorted_list):
        if b >= value:
            return i
    return len(sorted_list)


# --- ViT bucket selection -------------------------------------------------------------------------


@given(
    st.lists(st.integers(1, 5000).map(lambda x: 4 * x), min_size=1, max_size=8, unique=True),
    st.integers(1, 21000),
)
@settings(max_examples=300, deadline=None)
def test_select_bucket_matches_searchsorted(buckets: list[int], patches: int) -> None:
    asc = sorted(buckets)
    i = _searchsorted_left(asc, patches)
    expected = asc[i] if i < len(asc) else None  # optimum-rbln: index past the end -> ValueError
    assert bk.select_bucket(patches, asc) == expected


def test_select_bucket_examples() -> None:
    b = [1024, 3136, 16384]
    assert bk.select_bucket(1024, b) == 1024  # equal -> that bucket (side left)
    assert bk.select_bucket(1025, b) == 3136
    assert bk.select_bucket(8160, b) == 16384
    assert bk.select_bucket(8160, [16384]) == 16384
    assert bk.select_bucket(16388, b) is None
    assert bk.select_bucket(4, b) == 1024


def test_select_bucket_matches_torch_searchsorted() -> None:
    torch = pytest.importorskip("torch")
    asc = [1024, 3136, 16384]
    t = torch.tensor(asc)
    for patches in (1, 1023, 1024, 1025, 3136, 3137, 16384):
        idx = torch.searchsorted(t, patches).item()
        assert bk.select_bucket(patches, asc) == asc[idx]
    assert torch.searchsorted(t, 16385).item() == len(asc)
    assert bk.select_bucket(16385, asc) is None


def test_oversize_message_names_input_and_both_fixes() -> None:
    msg = bk.oversize_error("photo.jpg", 47000, [1024, 3136, 16384]).one_line()
    assert "\n" not in msg
    assert "photo.jpg" in msg and "47000" in msg and "16384" in msg
    assert "--set visual.max_seq_len=[1024,3136,16384,47000]" in msg
    assert "--set processor.max_pixels=4194304" in msg  # 16384 * 256
    # rounded up to a multiple of 4 (spatial_merge_size**2)
    assert "[16384,16386" not in bk.oversize_error("x", 16386, [16384]).one_line()
    assert "--set visual.max_seq_len=[16384,16388]" in bk.oversize_error("x", 16386, [16384]).one_line()
    err = bk.oversize_error("x", 20000, [16384])
    assert isinstance(err, InputError) and err.hint and err.exit_code == 2


def test_oversize_fix_marks_a_bucket_the_memory_planner_rejects() -> None:
    """``bucket_memory`` is asked about the new largest bucket (rounded up): a cost moves the cap first."""
    asked = []

    def cost(bucket: int) -> str | None:
        asked.append(bucket)
        return "memory verdict does_not_fit: visual workspace 9.00 GiB" if bucket > 20000 else None

    hint = bk.oversize_error("x", 24126, [16384], bucket_memory=cost).hint
    assert asked == [24128]
    assert hint.startswith("cap the processor: --set processor.max_pixels=4194304")
    assert hint.endswith(
        "a bucket of 24128 instead (--set visual.max_seq_len=[16384,24128]) costs memory the plan does not have "
        "(memory verdict does_not_fit: visual workspace 9.00 GiB)"
    )
    fits = bk.oversize_error("x", 18000, [16384], bucket_memory=cost).hint
    assert fits == bk.oversize_error("x", 18000, [16384]).hint and fits.startswith("add a bucket: ")


def test_oversize_message_for_video_caps_each_frame() -> None:
    msg = bk.oversize_error("clip.mp4", 24128, [16384], kind="video", frames=4).one_line()
    assert "clip.mp4" in msg and "24128" in msg and "temporal patch" in msg
    # per frame, whatever the frame count: a lower video_max_pixels would shrink every long video too
    assert f"--set processor.video_max_frame_pixels={16384 * 256}" in msg
    five = bk.oversize_error("v", 20000, [16384], kind="video", frames=5).one_line()
    assert f"video_max_frame_pixels={16384 * 256}" in five and "video_max_pixels" not in five


# --- decoder graphs -------------------------------------------------------------------------------


def test_select_decoder_graph() -> None:
    assert bk.select_decoder_graph(3, [4, 2, 1]) == (4, 1)  # optimum-rbln keeps them descending
    assert bk.select_decoder_graph(2, [1, 2, 4]) == (2, 0)
    assert bk.select_decoder_graph(1, [4]) == (4, 3)
    with pytest.raises(InputError) as e:
        bk.select_decoder_graph(5, [1, 2, 4])
    assert "5" in e.value.message and "4" in e.value.message
    assert "--set batch_size=5" in e.value.hint
    with pytest.raises(InputError):
        bk.select_decoder_graph(0, [1, 2, 4])


# --- FLOPs ----------------------------------------------------------------------------------------


def test_vit_flops_formula_by_hand() -> None:
    s, h, i, o = 1024, 1024, 4096, 2048
    block = 2 * s * h * 3 * h + 2 * s * h * h + 4 * s * h * i + 4 * s * s * h
    merger = 2 * (s // 4) * (4 * h) ** 2 + 2 * (s // 4) * (4 * h) * o
    assert bk.vit_flops(s, V2B) == 24 * block + 4 * merger
    # Qwen3-VL-2B at 16384 patches: ~37 TFLOP per call, attention the larger part.
    assert 3.0e13 < bk.vit_flops(16384, V2B) < 4.5e13


@pytest.mark.parametrize("vision", [V2B, QWEN3_VL_8B.vision, QWEN3_VL_TINY.vision])
def test_vit_flops_monotonic_and_superlinear(vision) -> None:
    values = [bk.vit_flops(s, vision) for s in range(4, 20000, 4)]
    assert all(b > a for a, b in itertools.pairwise(values))
    assert bk.vit_flops(16384, vision) > 4 * bk.vit_flops(4096, vision)  # attention is quadratic


def test_fmt_flops() -> None:
    assert bk.fmt_flops(999) == "999 FLOP"
    assert bk.fmt_flops(3.2e12) == "3.20 TFLOP"
    assert bk.fmt_flops(None) == "-"


# --- optimiser ------------------------------------------------------------------------------------


def _brute_force(counts: dict[int, int], k: int, cost, top: int, multiple: int = 4):
    """Every subset of at most k-1 multiples of `multiple` below `top`, plus top: the true optimum."""
    cands = list(range(multiple, top, multiple))
    best = None
    for r in range(k):
        for combo in itertools.combinations(cands, r):
            ev = bk.evaluate_buckets(counts, [*combo, top], cost)
            if ev.uncovered_calls:
                continue
            if best is None or ev.executed < best:
                best = ev.executed
    return best


def _quadratic_dp(counts: dict[int, int], k: int, cost) -> int:
    """Textbook O(k n^2) DP over the sorted distinct values (an independent reference)."""
    values = sorted({bk.round_up(v) for v in counts})
    w = {v: 0 for v in values}
    for v, n in counts.items():
        w[bk.round_up(v)] += n
    n = len(values)
    prefix = [0]
    for v in values:
        prefix.append(prefix[-1] + w[v])
    inf = float("inf")
    f = [[inf] * (n + 1) for _ in range(k + 1)]
    f[0][0] = 0
    for layer in range(1, k + 1):
        for i in range(1, n + 1):
            c = cost(values[i - 1])
            f[layer][i] = min(f[layer - 1][j] + c * (prefix[i] - prefix[j]) for j in range(i))
    return min(f[layer][n] for layer in range(1, k + 1))


COSTS = {
    "vit": bk.vit_cost_fn(V2B),
    "tokens": lambda s: s,
    "square": lambda s: s * s,
    "step": lambda s: s // 10,  # nondecreasing with plateaus (ties)
}


@pytest.mark.parametrize("cost_name", list(COSTS))
def test_optimizer_equals_brute_force_on_random_small_cases(cost_name: str) -> None:
    rng = random.Random(1234 + len(cost_name))
    cost = COSTS[cost_name]
    for _ in range(60):
        counts = {rng.randint(1, 100): rng.randint(1, 50) for _ in range(rng.randint(1, 8))}
        k = rng.randint(1, 4)
        res = bk.optimize_buckets(counts, k, cost)
        top = bk.round_up(max(counts))
        assert res.buckets[-1] == top
        assert len(res.buckets) <= k
        assert all(b % 4 == 0 for b in res.buckets)
        assert res.buckets == sorted(set(res.buckets))
        assert res.executed == _brute_force(counts, k, cost, top), (counts, k)
        assert res.executed == bk.evaluate_buckets(counts, res.buckets, cost).executed
        assert res.uncovered_calls == 0


def test_optimizer_equals_quadratic_dp_on_larger_cases() -> None:
    rng = random.Random(7)
    cost = COSTS["vit"]
    for _ in range(8):
        counts = {4 * rng.randint(64, 4096): rng.randint(1, 1000) for _ in range(rng.randint(20, 120))}
        k = rng.randint(1, 6)
        res = bk.optimize_buckets(counts, k, cost)
        assert res.executed == _quadratic_dp(counts, k, cost)


def test_optimizer_is_never_worse_than_baselines() -> None:
    rng = random.Random(99)
    cost = COSTS["vit"]
    for _ in range(30):
        counts = {4 * rng.randint(64, 4096): rng.randint(1, 100) for _ in range(rng.randint(1, 40))}
        top = bk.round_up(max(counts))
        current = sorted(rng.sample([1024, 2048, 3136, 4096, 8192], 2)) + [16384]
        base = bk.baselines(counts, cost, current=current, top=top)
        pow2 = bk.powers_of_two(top)
        for name, ev in base.items():
            k = len(ev.buckets)
            res = bk.optimize_buckets(counts, k, cost)
            assert res.executed <= ev.executed, (name, counts)
        assert base["single_largest"].executed >= bk.optimize_buckets(counts, 2, cost).executed
        assert pow2[-1] >= top and pow2[0] == 256
        assert base["single_largest"].ratio >= 1.0


def test_optimizer_more_buckets_never_hurt_and_k_above_n() -> None:
    cost = COSTS["vit"]
    counts = {1024: 5, 3520: 3, 8160: 2}
    costs = [bk.optimize_buckets(counts, k, cost).executed for k in range(1, 6)]
    assert all(b <= a for a, b in itertools.pairwise(costs))
    res = bk.optimize_buckets(counts, 5, cost)
    assert res.buckets == [1024, 3520, 8160]
    assert res.ratio == 1.0
    assert res.distinct_values == 3


def test_optimizer_rounds_values_up_to_multiples_of_4() -> None:
    res = bk.optimize_buckets({1021: 1, 1022: 1, 5: 2}, 3, lambda s: s)
    assert res.buckets == [8, 1024]
    assert res.distinct_values == 2


def test_optimizer_cap_reports_uncovered() -> None:
    cost = COSTS["vit"]
    counts = {1024: 10, 4096: 5, 20000: 3, 30000: 1}
    res = bk.optimize_buckets(counts, 3, cost, max_bucket=16384)
    assert res.buckets[-1] == 4096  # nothing between 4096 and the cap needs more
    assert res.uncovered_calls == 4 and res.uncovered_max == 30000
    assert res.covered_calls == 15
    forced = bk.optimize_buckets(counts, 3, cost, max_bucket=16384, force_max=True)
    assert forced.buckets[-1] == 16384 and 4096 in forced.buckets
    assert forced.distinct_values == 2  # the forced top bucket is no patch count of the workload
    with pytest.raises(InputError):
        bk.optimize_buckets(counts, 0, cost)


def test_optimizer_rejects_a_decreasing_cost() -> None:
    with pytest.raises(ValueError):
        bk.optimize_buckets({4: 1, 8: 1}, 2, lambda s: -s)


def test_optimizer_is_fast_on_many_distinct_values() -> None:
    rng = random.Random(5)
    counts = {4 * v: rng.randint(1, 1000) for v in range(64, 16385)}  # every multiple of 4 up to 65536
    t0 = time.process_time()  # CPU seconds (0.25 s here): a busy machine's wall clock must not fail it
    res = bk.optimize_buckets(counts, 8, COSTS["vit"])
    assert time.process_time() - t0 < 10
    assert len(res.buckets) == 8 and res.buckets[-1] == 65536


# --- decoder optimiser ----------------------------------------------------------------------------


def test_optimize_decoder_batches_matches_brute_force() -> None:
    rng = random.Random(3)
    for _ in range(60):
        batch = rng.randint(1, 12)
        trace = [rng.randint(1, batch) for _ in range(rng.randint(1, 40))]
        k = rng.randint(1, 4)
        res = bk.optimize_decoder_batches(trace, k, batch_size=batch)
        assert res.buckets[-1] == batch
        counts = bk._as_counts(trace)
        assert res.executed == _brute_force(counts, k, lambda b: b, batch, multiple=1)
        padded = res.executed - sum(trace)
        assert padded >= 0


def test_optimize_decoder_batches_defaults_and_uncovered() -> None:
    res = bk.optimize_decoder_batches({1: 10, 4: 3}, 2)
    assert res.buckets == [1, 4] and res.executed == 22 and res.useful == 22
    res = bk.optimize_decoder_batches([1, 2, 8], 2, batch_size=4)
    assert res.uncovered_calls == 1 and res.buckets[-1] == 4
    assert bk.decoder_powers_of_two(6) == [1, 2, 4, 6]
    assert bk.decoder_powers_of_two(1) == [1]
    with pytest.raises(InputError):
        bk.optimize_decoder_batches([], 2)
