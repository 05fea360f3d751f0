"""The ViT packing planner (pure core): rules, cost, and the reference numbers of vit-packing.md."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_2B
from qwenvl_rbln.vision.buckets import select_bucket, vit_cost_fn
from qwenvl_rbln.vision.packing import plan_packs, slot, unpacked

BUCKETS = [1024, 3136, 16384]


@pytest.fixture(scope="module")
def cost():
    return vit_cost_fn(QWEN3_VL_2B.vision)


def check_rules(plan, segments, buckets):
    """Every rule of the issue, on any plan."""
    bs = sorted(buckets)
    placed = [i for p in plan.packs for i in p.segments]
    assert sorted(placed + plan.oversize) == list(range(len(segments)))  # each segment exactly once
    for i in plan.oversize:
        assert select_bucket(segments[i], bs) is None
    for p in plan.packs:
        own = max(select_bucket(segments[i], bs) for i in p.segments)
        assert p.bucket <= own, "a pack never uses a bucket larger than its segments' own largest"
        assert p.bucket in bs
        end = 0
        for i, start, length in zip(p.segments, p.starts, p.lengths, strict=True):
            assert start % 4 == 0, "segment starts are aligned to the merge unit"
            assert start >= end and length == segments[i]
            end = start + length
        assert end <= p.bucket
    return True


def test_reference_numbers(cost):
    # vit-packing.md: 5-min video 300 x 128 -> 38 calls; 30 x 1560 -> 15; 8 x 320 -> 3 (x0.375 FLOPs)
    video = plan_packs([128] * 300, BUCKETS, cost)
    assert (video.calls, video.unpacked_calls) == (38, 300)
    assert video.executed(cost) / video.unpacked_executed(cost) == pytest.approx(38 / 300)
    assert plan_packs([1560] * 30, BUCKETS, cost).calls == 15
    images = plan_packs([320] * 8, BUCKETS, cost)
    assert images.calls == 3 and images.executed(cost) / images.unpacked_executed(cost) == pytest.approx(0.375)
    assert plan_packs([3000], BUCKETS, cost).calls == 1  # one image per call: no change


def test_never_a_bigger_bucket(cost):
    # two 600-patch images would fit one 3136 call, but that costs more than two 1024 calls: not allowed
    plan = plan_packs([600, 600], BUCKETS, cost)
    assert [p.bucket for p in plan.packs] == [1024, 1024]
    # a small segment rides along in a bigger segment's pack for free
    plan = plan_packs([2000, 500, 300], BUCKETS, cost)
    assert plan.calls == 1 and plan.packs[0].bucket == 3136


def test_alignment_by_construction():
    # lengths that are not multiples of 4 still start the next segment on a multiple of 4
    plan = plan_packs([6, 10, 3], [32], exact_max=0)
    (p,) = plan.packs
    assert p.starts == (0, 12, 20) and p.lengths == (10, 6, 3)
    assert all(s % 4 == 0 for s in p.starts) and slot(10) == 12
    # and slots are counted: 3 segments of 6 (18 rows, slots of 8) do not fit 20 rows
    assert plan_packs([6, 6, 6], [24], exact_max=0).calls == 1
    assert plan_packs([6, 6, 6], [20], exact_max=0).calls == 2


def test_oversize_untouched(cost):
    plan = plan_packs([20000, 128, 128], BUCKETS, cost)
    assert plan.oversize == [0] and plan.calls == 1
    assert unpacked([20000, 128], BUCKETS).oversize == [0]


def test_order_of_packs_and_report(cost):
    plan = plan_packs([128, 2000, 256, 900], BUCKETS, cost)
    assert check_rules(plan, [128, 2000, 256, 900], BUCKETS)
    d = plan.to_dict(cost)
    assert d["calls"] == plan.calls and d["unpacked_calls"] == 4
    assert d["attn_mask_bytes"] == sum(p.bucket**2 * 2 for p in plan.packs)
    assert d["executed_flops"] <= d["unpacked_executed_flops"]
    assert d["packs"][0]["padding"] == plan.packs[0].bucket - plan.packs[0].valid


def test_bad_arguments():
    with pytest.raises(ValueError):
        plan_packs([0], BUCKETS)
    with pytest.raises(ValueError):
        plan_packs([4], [10])


def test_no_torch_import():
    code = "import sys, qwenvl_rbln.vision.packing; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip() == "False"


def _brute(segments, buckets, cost):
    """Minimum cost over every partition of the segments into packs that obey the cap rule."""
    n = len(segments)
    best = None

    def partitions(items):
        if not items:
            yield []
            return
        first, rest = items[0], items[1:]
        for part in partitions(rest):
            for k in range(len(part)):
                yield part[:k] + [[first, *part[k]]] + part[k + 1 :]
            yield [[first], *part]

    for part in partitions(list(range(n))):
        total = 0
        for g in part:
            cap = max(select_bucket(slot(segments[i]), buckets) for i in g)
            if sum(slot(segments[i]) for i in g) > cap:
                break
            total += cost(cap)
        else:
            best = total if best is None else min(best, total)
    return best


seg_lists = st.lists(st.integers(min_value=1, max_value=1200), min_size=0, max_size=7)
bucket_lists = st.lists(st.integers(min_value=1, max_value=300).map(lambda x: 4 * x), min_size=1, max_size=3)


@given(seg_lists, bucket_lists)
@example([600, 600], [1024, 3136])
@example([5, 5, 5, 5], [8, 12])
def test_rules_and_optimal_small(segments, buckets):
    bs = sorted(set(buckets))
    cost = lambda s: s * s + 1000 * s  # noqa: E731 - quadratic + linear, like the ViT
    plan = plan_packs(segments, bs, cost)
    check_rules(plan, segments, bs)
    base = unpacked(segments, bs)
    assert plan.calls <= base.calls
    assert plan.executed(cost) <= base.executed(cost)
    assert plan.useful(cost) == base.useful(cost)
    runnable = [n for n in segments if slot(n) <= bs[-1]]
    if runnable:
        assert plan.executed(cost) == _brute(runnable, bs, cost)  # exact search: optimal up to EXACT_MAX


@given(st.lists(st.integers(min_value=1, max_value=4000), min_size=9, max_size=60), bucket_lists)
def test_rules_ffd_large(segments, buckets):
    bs = sorted(set(buckets))
    plan = plan_packs(segments, bs)
    check_rules(plan, segments, bs)
    assert plan.calls <= unpacked(segments, bs).calls
    # first-fit-decreasing: no two packs of the same cap could have been merged
    for a, b in itertools.combinations(plan.packs, 2):
        if a.bucket == b.bucket:
            assert sum(slot(x) for x in a.lengths + b.lengths) > a.bucket
