"""Packing several ViT segments (images, video temporal patches) of one ``visual()`` call into fewer
compiled ViT calls, with a block-diagonal attention mask.

Why it is exact (``shared/reference/vit-packing.md``): the compiled ViT takes its attention mask as an
input ``[1, 1, S, S]``, so segments laid end to end in one bucket, each attending only to itself, compute
the same function as one call per segment, with no recompile. Why the rules below:

* A pack never uses a bucket larger than the largest bucket its segments would use alone (their own
  bucket: the smallest compiled bucket >= their patches). Attention is quadratic in ``S`` and the mask is
  shipped per call (``S*S*dtype`` bytes), so moving segments into a bigger bucket costs more than not
  packing (a 5-minute video: 3 calls in the 16384 bucket cost 4x what 38 calls in the 1024 bucket cost).
* Every segment starts at a multiple of the merge unit (``spatial_merge_size**2`` = 4 patches): the
  merger views ``[S, h]`` as ``[S/4, 4h]``, so a misaligned start mixes two segments in one merged token.
  A segment's slot is its length rounded up to that unit; starts are sums of slots, so a misaligned start
  cannot be built.
* A segment above the largest bucket is not packed: it is listed in ``oversize`` and the caller handles
  it exactly as it would without packing (today's resize / error policy).

Planner: with the cap rule, a pack's bucket is its largest segment's own bucket, so the cost of a plan is
``sum(cost(own bucket of each pack's largest segment))``; adding a smaller segment to a pack is free. The
planner runs first-fit-decreasing (segments by size, largest first; each into the first pack with room
under that pack's cap) and, for up to ``EXACT_MAX`` segments, an exact search over subsets, keeping the
cheaper. Each pack then takes the smallest bucket that holds its slots (never above its cap).

Pure Python, no torch: ``qvl bucket-plan`` uses it on a build host, the runtime (``backends/vit_packing``)
uses the same plan for the real calls.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from qwenvl_rbln.vision.buckets import BUCKET_MULTIPLE, round_up, select_bucket

EXACT_MAX = 8  # segments up to which the exact subset search runs (3**8 = 6561 steps)


@dataclass(frozen=True)
class Pack:
    """One compiled ViT call: ``segments[i]`` (an index into the call's segment list) occupies rows
    ``starts[i] : starts[i] + lengths[i]`` of a ``bucket``-long sequence; everything else is zero padding."""

    bucket: int
    segments: tuple[int, ...]
    starts: tuple[int, ...]
    lengths: tuple[int, ...]

    @property
    def valid(self) -> int:
        return sum(self.lengths)

    @property
    def padding(self) -> int:
        return self.bucket - self.valid

    def to_dict(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "segments": list(self.segments),
            "starts": list(self.starts),
            "lengths": list(self.lengths),
            "padding": self.padding,
        }


@dataclass
class PackPlan:
    """How the segments of one ``visual()`` call run: packs (compiled calls) plus oversize segments."""

    segments: list[int]  # patches per segment, in call order
    buckets: list[int]  # ascending
    packs: list[Pack] = field(default_factory=list)
    oversize: list[int] = field(default_factory=list)  # segment indices above the largest bucket, not packed
    method: str = "ffd"  # "ffd" | "exact" | "unpacked"

    @property
    def calls(self) -> int:
        """Compiled ViT calls of the packed segments (oversize ones are not counted: they cannot run)."""
        return len(self.packs)

    @property
    def unpacked_calls(self) -> int:
        return len(self.segments) - len(self.oversize)

    def executed(self, cost: Callable[[int], int | float]) -> int | float:
        return sum(cost(p.bucket) for p in self.packs)

    def unpacked_executed(self, cost: Callable[[int], int | float]) -> int | float:
        return sum(cost(p.bucket) for p in unpacked(self.segments, self.buckets).packs)

    def useful(self, cost: Callable[[int], int | float]) -> int | float:
        skip = set(self.oversize)
        return sum(cost(n) for i, n in enumerate(self.segments) if i not in skip)

    def mask_bytes(self, dtype_bytes: int = 2) -> int:
        """Attention-mask bytes sent to the device over all calls: ``S*S*dtype`` per call."""
        return sum(p.bucket * p.bucket * dtype_bytes for p in self.packs)

    def to_dict(self, cost: Callable[[int], int | float] | None = None, dtype_bytes: int = 2) -> dict[str, Any]:
        out: dict[str, Any] = {
            "segments": len(self.segments),
            "calls": self.calls,
            "unpacked_calls": self.unpacked_calls,
            "method": self.method,
            "attn_mask_bytes": self.mask_bytes(dtype_bytes),
            "oversize": list(self.oversize),
            "packs": [p.to_dict() for p in self.packs],
        }
        if cost is not None:
            out["executed_flops"] = self.executed(cost)
            out["unpacked_executed_flops"] = self.unpacked_executed(cost)
            out["useful_flops"] = self.useful(cost)
        return out


def _check(segments: Sequence[int], buckets: Sequence[int]) -> list[int]:
    for n in segments:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"segment length {n!r} is not a positive integer (patches)")
    bs = sorted(set(buckets))
    if not bs or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 or b % BUCKET_MULTIPLE for b in bs):
        raise ValueError(f"buckets {list(buckets)!r} must be positive multiples of {BUCKET_MULTIPLE}")
    return bs


def slot(length: int, unit: int = BUCKET_MULTIPLE) -> int:
    """Rows a segment occupies in a pack: its length rounded up to the merge unit, so the next one starts aligned."""
    return round_up(length, unit)


def _make_pack(group: Sequence[int], segments: Sequence[int], buckets: list[int], unit: int) -> Pack:
    """A pack of ``group`` (segment indices, in placement order): aligned starts, the smallest bucket holding it."""
    starts, pos = [], 0
    for i in group:
        starts.append(pos)
        pos += slot(segments[i], unit)
    bucket = select_bucket(pos, buckets)
    assert bucket is not None  # callers only build packs that fit their cap
    return Pack(bucket, tuple(group), tuple(starts), tuple(segments[i] for i in group))


def unpacked(segments: Sequence[int], buckets: Sequence[int]) -> PackPlan:
    """Today's behaviour: one call per segment in its own bucket (oversize segments listed, not run)."""
    bs = _check(segments, buckets)
    plan = PackPlan(list(segments), bs, method="unpacked")
    for i, n in enumerate(segments):
        b = select_bucket(n, bs)
        if b is None:
            plan.oversize.append(i)
        else:
            plan.packs.append(Pack(b, (i,), (0,), (n,)))
    return plan


def _ffd(order: list[int], segments: Sequence[int], buckets: list[int], unit: int) -> list[list[int]]:
    """First-fit-decreasing: ``order`` is largest first; a pack's cap is its first (largest) segment's own bucket."""
    groups: list[list[int]] = []
    used: list[int] = []
    caps: list[int] = []
    for i in order:
        s = slot(segments[i], unit)
        for g in range(len(groups)):
            if used[g] + s <= caps[g]:
                groups[g].append(i)
                used[g] += s
                break
        else:
            groups.append([i])
            used.append(s)
            caps.append(select_bucket(s, buckets))  # type: ignore[arg-type]  # own bucket (slot <= largest)
    return groups


def _exact(
    order: list[int], segments: Sequence[int], buckets: list[int], unit: int, cost: Callable[[int], int | float]
) -> list[list[int]]:
    """Minimum-cost partition into packs by a subset DP (``len(order) <= EXACT_MAX``)."""
    n = len(order)
    slots = [slot(segments[i], unit) for i in order]
    own = [select_bucket(s, buckets) for s in slots]
    full = (1 << n) - 1

    def pack_cost(mask: int) -> int | float | None:
        total = sum(slots[k] for k in range(n) if mask >> k & 1)
        cap = max(own[k] for k in range(n) if mask >> k & 1)  # type: ignore[type-var]
        return cost(cap) if total <= cap else None  # type: ignore[arg-type]

    single = {m: pack_cost(m) for m in range(1, full + 1)}

    @cache
    def best(mask: int) -> tuple[Any, tuple[int, ...]]:
        if not mask:
            return 0, ()
        low = mask & -mask
        rest = mask ^ low
        result: tuple[Any, tuple[int, ...]] | None = None
        sub = rest
        while True:
            group = sub | low
            c = single[group]
            if c is not None:
                tail, parts = best(mask ^ group)
                if result is None or c + tail < result[0]:
                    result = (c + tail, (group, *parts))
            if not sub:
                break
            sub = (sub - 1) & rest
        assert result is not None  # the singleton {low} always fits
        return result

    _, parts = best(full)
    best.cache_clear()
    return [[order[k] for k in range(n) if m >> k & 1] for m in parts]


def plan_packs(
    segments: Sequence[int],
    buckets: Sequence[int],
    cost: Callable[[int], int | float] | None = None,
    *,
    unit: int = BUCKET_MULTIPLE,
    exact_max: int = EXACT_MAX,
) -> PackPlan:
    """Packs for the segments (patch counts, in call order) of one ``visual()`` call.

    ``cost(S)`` is the cost of one compiled call at ``S`` (``buckets.vit_cost_fn``; any nondecreasing
    function works, the default counts calls weighted by ``S*S``, the attention term). Segments above the
    largest bucket go to ``oversize`` untouched.
    """
    bs = _check(segments, buckets)
    cost = cost or (lambda s: s * s)
    plan = PackPlan(list(segments), bs)
    order = []
    for i, n in enumerate(segments):
        if slot(n, unit) > bs[-1]:
            plan.oversize.append(i)
        else:
            order.append(i)
    order.sort(key=lambda i: (-segments[i], i))  # decreasing; ties keep call order (deterministic)
    groups = _ffd(order, segments, bs, unit)
    if len(groups) > 1 and len(order) <= exact_max:
        exact = _exact(order, segments, bs, unit, cost)

        def total(gs: list[list[int]]) -> Any:
            return sum(cost(_make_pack(g, segments, bs, unit).bucket) for g in gs)

        if total(exact) < total(groups):
            groups, plan.method = [sorted(g, key=lambda i: (-segments[i], i)) for g in exact], "exact"
    plan.packs = [_make_pack(g, segments, bs, unit) for g in groups]
    plan.packs.sort(key=lambda p: min(p.segments))  # packs in the call order of their earliest segment
    return plan


def plan_for(segments: Sequence[int], buckets: Sequence[int], cost: Callable[[int], int | float] | None, packing: bool):
    """``plan_packs`` when packing is on, else today's one call per segment."""
    return plan_packs(segments, buckets, cost) if packing else unpacked(segments, buckets)


# --- uniform requests: N segments of one length (bucket-plan's workload lines) ----------------------

Group = tuple[int, int]  # (patches per segment, segments per visual() call)
_UNIFORM_CACHE: dict[tuple[int, int, tuple[int, ...], Any], tuple[int, Any]] = {}


def uniform_packs(patches: int, n: int, bucket: int, unit: int = BUCKET_MULTIPLE) -> int:
    """Calls for ``n`` segments of ``patches`` each in ``bucket``: ``ceil(n / floor(bucket / slot))``.

    What ``plan_packs`` gives for identical segments (every pack's cap is their own bucket)."""
    per = bucket // slot(patches, unit)
    return -(-n // per)


def uniform_cost(patches: int, n: int, buckets: Sequence[int], cost: Callable[[int], Any]) -> tuple[int, Any] | None:
    """(calls, executed) of one call with ``n`` segments of ``patches`` under ``buckets`` (packed); None if oversize."""
    key = (patches, n, tuple(buckets), cost)
    hit = _UNIFORM_CACHE.get(key)
    if hit is None:
        b = select_bucket(slot(patches), sorted(buckets))
        if b is None:
            return None
        calls = uniform_packs(patches, n, b)
        hit = (calls, calls * cost(b))
        if len(_UNIFORM_CACHE) < 100_000:
            _UNIFORM_CACHE[key] = hit
    return hit


def evaluate_packed(groups: dict[Group, int], buckets: Sequence[int], cost: Callable[[int], Any]) -> Any:
    """A ``buckets.BucketEval`` of a workload (``(patches, n) -> requests``) with packing: executed is packed;
    ``covered_calls``/``uncovered_calls`` count segments (the unpacked calls), ``packed_calls`` the packed ones."""
    from qwenvl_rbln.vision.buckets import BucketEval

    bs = sorted(buckets)
    ev = BucketEval(buckets=bs)
    ev.packed_calls = 0  # type: ignore[attr-defined]
    for (p, n), w in groups.items():
        if w <= 0:
            continue
        res = uniform_cost(p, n, bs, cost)
        if res is None:
            ev.uncovered_calls += w * n
            ev.uncovered_values.append(p)
            continue
        calls, executed = res
        ev.covered_calls += w * n
        ev.packed_calls += w * calls  # type: ignore[attr-defined]
        ev.executed += w * executed
        ev.useful += w * n * cost(p)
    return ev


CANDIDATE_LIMIT = 600  # candidate buckets above which the packed optimiser keeps only the data values


def optimize_packed(
    groups: dict[Group, int],
    k: int,
    cost: Callable[[int], Any],
    max_bucket: int | None = None,
    *,
    force_max: bool = False,
) -> list[int]:
    """The at-most-``k`` bucket list minimising the packed executed cost of ``groups``.

    With packing a bucket above a value can pay (8 images of 320 patches: one 2560 call may beat eight
    320 calls), so the candidates are the values and every fill point ``m * slot(p)`` of a multi-segment
    request, up to the top (the largest value, or ``max_bucket``). Exact over those candidates: a contiguous
    partition DP, ``F[k][i] = min_j F[k-1][j] + G(j, i)`` with ``G`` the packed cost at ``cand[i]`` of the
    values in ``(cand[j], cand[i]]``; O(k * m^2) for m candidates (m capped at ``CANDIDATE_LIMIT`` by falling
    back to the values alone). ``force_max``: the top bucket is ``max_bucket`` (as ``buckets.optimize_buckets``).
    """
    cap = None if max_bucket is None else (int(max_bucket) // BUCKET_MULTIPLE) * BUCKET_MULTIPLE
    live = {(p, n): w for (p, n), w in groups.items() if w > 0 and (cap is None or slot(p) <= cap)}
    if not live:
        return []
    values = sorted({slot(p) for p, _ in live})
    if force_max and cap is not None and values[-1] < cap:
        values.append(cap)
    top = values[-1]
    cands = set(values)
    for p, n in live:
        s = slot(p)
        for m in range(2, n + 1):
            if m * s > top:
                break
            cands.add(m * s)
    cand = sorted(cands) if len(cands) <= CANDIDATE_LIMIT else values
    m = len(cand)
    items = sorted(live.items(), key=lambda kv: slot(kv[0][0]))
    # G[i][j]: packed cost at cand[i] of the values in (cand[j-1], cand[i]] (j = 0: all values <= cand[i])
    slots = [slot(p) for (p, _), _ in items]
    inf = float("inf")
    g_rows: list[list[Any]] = []
    for i, b in enumerate(cand):
        hi = bisect.bisect_right(slots, b)
        prefix = [0]
        for (p, n), w in items[:hi]:
            prefix.append(prefix[-1] + w * uniform_packs(p, n, b) * cost(b))
        row = []
        for j in range(i + 1):  # values in (cand[j-1], cand[i]]
            lo = 0 if j == 0 else bisect.bisect_right(slots, cand[j - 1])
            row.append(prefix[hi] - prefix[lo])
        g_rows.append(row)
    k = max(1, min(k, m))
    # F[layer][i]: best cost covering values <= cand[i] with `layer` buckets, the last at cand[i]
    prev = [g_rows[i][0] for i in range(m)]
    arg: list[list[int]] = [[-1] * m]
    best_total, best_layer = prev[m - 1], 1
    for layer in range(2, k + 1):
        cur = [inf] * m
        back = [-1] * m
        for i in range(m):
            for j in range(i):  # previous bucket at cand[j]
                c = prev[j] + g_rows[i][j + 1]
                if c < cur[i]:
                    cur[i], back[i] = c, j
        arg.append(back)
        if cur[m - 1] < best_total:
            best_total, best_layer = cur[m - 1], layer
        prev = cur
    chosen, i, layer = [], m - 1, best_layer
    while i >= 0 and layer >= 1:
        chosen.append(cand[i])
        i = arg[layer - 1][i]
        layer -= 1
    return sorted(chosen)
