"""ViT bucket and decoder-graph selection exactly as optimum-rbln 0.12 does it, ViT compute, and
an exact optimiser for bucket lists over a workload.

Pure Python, no torch: ``qvl bucket-plan`` must answer on a build host before anything is installed.

Selection (``modeling_qwen3_vl.py:184-246``): the ViT runs once per image and once per video
temporal patch with ``S = grid_h * grid_w`` pre-merge patches, and picks
``torch.searchsorted(ascending_buckets, S)`` (side left), i.e. the smallest bucket ``>= S``; no
bucket ``>= S`` raises ``ValueError: Required seq_len(S) is larger than available max_seq_len(...)``.
A compiled graph always computes its whole bucket, so the padding is executed compute.

Decoder graphs: vllm-rbln pads each decode step's running batch up to the smallest compiled
``decoder_batch_sizes`` entry ``>=`` it (``select_bucket_size`` = ``bisect_left``). optimum-rbln's own
``generate()`` for Qwen3-VL always runs ``decoder_batch_{batch_size}`` (reference section 3.4).

ViT compute model (``vit_flops``), per ViT call at sequence length ``S`` (multiply-add = 2 FLOPs),
with ``h`` = vision hidden_size, ``I`` = intermediate_size, ``m`` = spatial_merge_size,
``o`` = out_hidden_size, ``D`` = depth and ``N`` = number of DeepStack mergers::

    block  = 2*S*h*3h        (fused qkv projection)
           + 2*S*h*h         (attention output projection)
           + 2*2*S*h*I       (MLP fc1 + fc2)
           + 2*2*S*S*h       (attention: Q @ K^T and A @ V over all heads; full S x S, masks do not skip work)
    merger = 2*(S/m^2)*(h*m^2)^2 + 2*(S/m^2)*(h*m^2)*o      (fc1 + fc2 on the S/m^2 merged tokens)
    vit_flops(S) = D*block + (1 + N)*merger

Patch embedding (Conv3d), position-embedding interpolation and rotary tables run on the host and
are left out, as are norms, biases, GELU and softmax (lower-order terms). For Qwen3-VL-2B (h=1024,
I=4096, D=24) the linear part is ~24*S*h^2 per block and attention 4*S^2*h, so attention dominates
from S ~ 6k patches on: cost is superlinear in S, which is why padding a 3k-patch image to a 16k
bucket costs ~9x its useful compute.

Optimiser (``optimize_buckets``): given a weighted set of sequence lengths (ViT calls per patch
count), choose at most K buckets, the largest covering the workload (or a cap), minimising
``sum(count * cost(bucket(S)))``. With a nondecreasing cost the optimal buckets sit on data values,
so it is the contiguous-partition DP over the n sorted distinct values::

    F[k][i] = min_{j<i} F[k-1][j] + cost(v[i-1]) * (W[i] - W[j])       (W = prefix sums of counts)

Each inner minimum is a lower-envelope query over lines ``y = -W[j]*x + F[k-1][j]`` at
``x = cost(v[i-1])``; the slopes decrease and the queries increase with ``i``, so a monotone convex
hull trick answers it exactly in amortised O(1): O(K*n) overall instead of O(K*n^2), in exact
integer arithmetic when cost and counts are integers. Values are rounded up to a multiple of 4
first (buckets must be multiples of spatial_merge_size^2), which bounds n by max_patches / 4 and
loses nothing. Tests check it against brute force.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.vision.geometry import max_pixels_for_bucket

BUCKET_MULTIPLE = 4  # spatial_merge_size**2: the merger views [S, h] as [S/4, 4h]
PATCH_PIXELS = 16 * 16  # one pre-merge patch of Qwen3-VL (patch_size 16)
POW2_START = 256  # the smallest image the stock processor makes (65536 px) is 256 patches


# --- selection -------------------------------------------------------------------------------------


def padding_pct(patches: int, bucket: int | None) -> float | None:
    """Share of ``bucket`` that is padding, in percent to 2 decimals (None without a bucket): the one rounding
    `bucket-plan` and `infer` both report."""
    return None if bucket is None else round(100.0 * (bucket - patches) / bucket, 2)


def select_bucket(patches: int, buckets: Sequence[int]) -> int | None:
    """Smallest bucket ``>= patches`` (``buckets`` ascending), or None when none is big enough.

    Identical to optimum-rbln's ``torch.searchsorted(max_seq_len_ascending, patches)`` (side
    left) followed by indexing, where an index past the end raises.
    """
    i = bisect.bisect_left(buckets, patches)
    return buckets[i] if i < len(buckets) else None


def round_up(value: int, multiple: int = BUCKET_MULTIPLE) -> int:
    return -(-value // multiple) * multiple


def _list_arg(values: Iterable[int]) -> str:
    """A list as --set takes it: JSON without spaces, so the shell keeps it one argument."""
    return "[" + ",".join(str(v) for v in values) + "]"


def oversize_error(
    input_name: str,
    patches: int,
    buckets: Sequence[int],
    *,
    kind: str = "image",
    frames: int | None = None,
    patch_size: int = 16,
    temporal_patch_size: int = 2,
    bucket_memory: Callable[[int], str | None] | None = None,
) -> InputError:
    """The error for an input whose ViT call is longer than every compiled bucket, with both fixes.

    Fix 1 adds a bucket (``patches`` rounded up to a multiple of 4) to ``visual.max_seq_len``;
    fix 2 caps the processor so inputs resize into the largest bucket: ``max_pixels = largest *
    patch_size**2`` for images, ``video_max_frame_pixels`` (the same number, per frame) for videos
    (``frame_cap.py``; ``frames`` is kept for callers and no longer changes the fix).

    ``bucket_memory(new_largest)`` is the memory planner's word on fix 1, asked by a higher layer (vision does
    not import the planner): None when the plan fits with that bucket, else why not with its figures; then the
    cap comes first and the bucket is marked with that cost, so no fix is offered as plain that cannot load.
    """
    largest = max(buckets)
    need = round_up(patches)
    new_list = sorted({*buckets, need})
    unit = "patches per temporal patch (2 frames)" if kind == "video" else "patches"
    message = (
        f"{input_name}: {patches} {unit} exceed the largest ViT bucket {largest} "
        f"(visual.max_seq_len={_list_arg(sorted(buckets))}); optimum-rbln would raise "
        f"'Required seq_len({patches}) is larger than available max_seq_len'"
    )
    if kind == "video":  # per frame: a lower video_max_pixels would shrink every long video too
        cap = max_pixels_for_bucket(largest, patch_size)
        cap_fix = f"--set processor.video_max_frame_pixels={cap} (frames then resize to at most {largest} patches)"
    else:
        cap = max_pixels_for_bucket(largest, patch_size)
        cap_fix = f"--set processor.max_pixels={cap} (images then resize to at most {largest} patches)"
    add = f"--set visual.max_seq_len={_list_arg(new_list)}"
    cost = bucket_memory(need) if bucket_memory is not None else None
    if cost:
        return InputError(message, f"cap the processor: {cap_fix}; {bucket_cost_clause(need, add, cost)}")
    return InputError(message, f"add a bucket: {add}, or cap the processor: {cap_fix}")


def bucket_cost_clause(bucket: int, fix: str, cost: str) -> str:
    """The bucket fix marked with what the memory planner says it costs (one wording for bucket-plan and infer)."""
    return f"a bucket of {bucket} instead ({fix}) costs memory the plan does not have ({cost})"


def select_decoder_graph(batch: int, decoder_batch_sizes: Sequence[int]) -> tuple[int, int]:
    """``(graph batch, padded rows)``: the smallest compiled decoder batch ``>= batch``.

    ``decoder_batch_sizes`` may be in any order (optimum-rbln keeps them descending). A batch
    above the largest graph raises ``InputError`` naming both.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InputError(
            f"running batch {batch!r} is not a positive integer", "batch sizes are counts of requests >= 1"
        )
    sizes = sorted(decoder_batch_sizes)
    graph = select_bucket(batch, sizes)
    if graph is None:
        raise InputError(
            f"running batch {batch} is above the largest decoder graph {sizes[-1]} "
            f"(decoder_batch_sizes={_list_arg(sizes)})",
            f"compile a larger batch: --set batch_size={batch} --set decoder_batch_sizes={_list_arg([*sizes, batch])}",
        )
    return graph, graph - batch


# --- compute ---------------------------------------------------------------------------------------


def vit_flops(seq_len: int, vision: Any) -> int:
    """FLOPs of one ViT call at sequence length ``seq_len`` (see the module docstring).

    ``vision`` is a ``modelinfo.VisionGeometry`` (anything with depth, hidden_size,
    intermediate_size, out_hidden_size, spatial_merge_size and num_deepstack).
    """
    s = int(seq_len)
    h = vision.hidden_size
    inter = vision.intermediate_size
    m2 = vision.spatial_merge_size**2
    out = vision.out_hidden_size
    block = 2 * s * h * 3 * h + 2 * s * h * h + 2 * 2 * s * h * inter + 2 * 2 * s * s * h
    # merged tokens s/m2 with width h*m2: 2*(s/m2)*(h*m2)^2 = 2*s*h*h*m2, 2*(s/m2)*(h*m2)*o = 2*s*h*o
    merger = 2 * s * h * h * m2 + 2 * s * h * out
    return vision.depth * block + (1 + getattr(vision, "num_deepstack", 3)) * merger


def vit_cost_fn(vision: Any) -> Callable[[int], int]:
    """A memoised ``seq_len -> FLOPs`` for one vision geometry."""
    cache: dict[int, int] = {}

    def cost(s: int) -> int:
        v = cache.get(s)
        if v is None:
            v = cache[s] = vit_flops(s, vision)
        return v

    return cost


def fmt_flops(n: float | int | None) -> str:
    """Decimal SI units, as FLOP counts are usually quoted."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"):
        if abs(n) < 1000 or unit == "EFLOP":
            return f"{n:.0f} {unit}" if unit == "FLOP" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} EFLOP"


# --- evaluation ------------------------------------------------------------------------------------


@dataclass
class BucketEval:
    """How a bucket list serves a weighted workload."""

    buckets: list[int]
    executed: int | float = 0  # sum(count * cost(bucket)) over covered values
    useful: int | float = 0  # sum(count * cost(value)) over covered values
    covered_calls: int = 0
    uncovered_calls: int = 0
    uncovered_values: list[int] = field(default_factory=list)  # distinct values above the largest bucket

    @property
    def ratio(self) -> float | None:
        return (self.executed / self.useful) if self.useful else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "buckets": self.buckets,
            "executed": self.executed,
            "useful": self.useful,
            "executed_over_useful": _round(self.ratio),
            "covered_calls": self.covered_calls,
            "uncovered_calls": self.uncovered_calls,
            "uncovered_max": max(self.uncovered_values) if self.uncovered_values else None,
        }


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def evaluate_buckets(
    counts: Mapping[int, int], buckets: Sequence[int], cost_fn: Callable[[int], int | float]
) -> BucketEval:
    """Executed and useful compute of ``counts`` (value -> calls) under ``buckets`` (any order)."""
    bs = sorted(buckets)
    ev = BucketEval(buckets=bs)
    for value, n in counts.items():
        if n <= 0:
            continue
        b = select_bucket(value, bs)
        if b is None:
            ev.uncovered_calls += n
            ev.uncovered_values.append(value)
            continue
        ev.covered_calls += n
        ev.executed += n * cost_fn(b)
        ev.useful += n * cost_fn(value)
    return ev


def powers_of_two(top: int, start: int = POW2_START) -> list[int]:
    """``start, 2*start, ...`` up to the first power that is ``>= top`` (the industry default)."""
    out = [start]
    while out[-1] < top:
        out.append(out[-1] * 2)
    return out


# --- optimiser -------------------------------------------------------------------------------------


@dataclass
class OptimizeResult:
    buckets: list[int]  # ascending; the last one is the top bucket
    k: int  # the K asked for (len(buckets) can be smaller when there are fewer distinct values)
    executed: int | float
    useful: int | float
    covered_calls: int
    uncovered_calls: int
    uncovered_max: int | None
    distinct_values: int  # n, after rounding to the bucket multiple

    @property
    def ratio(self) -> float | None:
        return (self.executed / self.useful) if self.useful else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "buckets": self.buckets,
            "k": self.k,
            "executed": self.executed,
            "useful": self.useful,
            "executed_over_useful": _round(self.ratio),
            "covered_calls": self.covered_calls,
            "uncovered_calls": self.uncovered_calls,
            "uncovered_max": self.uncovered_max,
            "distinct_values": self.distinct_values,
        }


def _bad_middle(b1: Any, m1: int, b2: Any, m2: int, b3: Any, m3: int) -> bool:
    """Line 2 never strictly wins the lower envelope between lines 1 and 3 (slopes m1 > m2 > m3).

    x(1,3) <= x(1,2)  <=>  (b3-b1)/(m1-m3) <= (b2-b1)/(m1-m2), cross-multiplied (denominators > 0).
    """
    return (b3 - b1) * (m1 - m2) <= (b2 - b1) * (m1 - m3)


def _partition_dp(values: list[int], weights: list[int], costs: list[Any], k: int) -> tuple[Any, list[int]]:
    """Exact min-cost partition of sorted ``values`` into <= k contiguous groups, each served by its
    largest value; the last group ends at ``values[-1]``. Returns (cost, chosen values ascending).

    Requires ``costs`` nondecreasing and ``weights[:-1]`` positive (the last may be 0: a forced
    top bucket). Monotone convex hull trick: O(k * n).
    """
    n = len(values)
    prefix = [0] * (n + 1)
    for i, w in enumerate(weights):
        prefix[i + 1] = prefix[i] + w
    k = max(1, min(k, n))
    # prev[i]: best cost of covering the first i values with the current number of buckets, the
    # last one at values[i-1]. One bucket: everything up to i-1 pads to values[i-1].
    prev: list[Any] = [None] + [costs[i - 1] * prefix[i] for i in range(1, n + 1)]
    best_total = prev[n]
    best_layer = 1
    choices: list[list[int]] = [[0] * (n + 1)]  # choices[layer][i] = j (start of the last group)
    for layer in range(2, k + 1):
        cur: list[Any] = [None] * (n + 1)
        arg = [0] * (n + 1)
        hull: deque[tuple[int, Any, int]] = deque()  # (slope, intercept, j)
        # Line j exists for j >= layer-1 (j values need layer-1 buckets); query i needs j <= i-1.
        for i in range(layer, n + 1):
            j = i - 1
            m_new, b_new = -prefix[j], prev[j]
            while len(hull) >= 2 and _bad_middle(hull[-2][1], hull[-2][0], hull[-1][1], hull[-1][0], b_new, m_new):
                hull.pop()
            hull.append((m_new, b_new, j))
            x = costs[i - 1]
            while len(hull) >= 2 and hull[1][1] + hull[1][0] * x <= hull[0][1] + hull[0][0] * x:
                hull.popleft()
            m, b, jbest = hull[0]
            cur[i] = costs[i - 1] * prefix[i] + b + m * x
            arg[i] = jbest
        choices.append(arg)
        if cur[n] < best_total:
            best_total, best_layer = cur[n], layer
        prev = cur
    # Walk back from (best_layer, n).
    chosen: list[int] = []
    i, layer = n, best_layer
    while layer >= 1 and i > 0:
        chosen.append(values[i - 1])
        i = choices[layer - 1][i] if layer > 1 else 0
        layer -= 1
    return best_total, sorted(chosen)


def optimize_buckets(
    counts: Mapping[int, int],
    k: int,
    cost_fn: Callable[[int], int | float],
    max_bucket: int | None = None,
    *,
    multiple: int = BUCKET_MULTIPLE,
    force_max: bool = False,
) -> OptimizeResult:
    """The at-most-``k`` bucket list minimising ``sum(count * cost_fn(bucket(value)))``.

    ``counts`` maps a sequence length (patches per ViT call, or a decode batch) to how many calls
    have it. Values are rounded up to ``multiple`` (buckets must be multiples of 4 for the ViT; use
    1 for decoder batches). The largest bucket is the largest value, or ``max_bucket`` (rounded down
    to ``multiple``) when values exceed it: those calls are reported as uncovered and left out of
    the cost. ``force_max`` makes ``max_bucket`` the largest bucket even when nothing reaches it
    (decoder graphs: the top must equal batch_size). ``cost_fn`` must be nondecreasing.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InputError(f"number of buckets K={k!r} must be a positive integer", "e.g. --optimize 3")
    cap = None
    if max_bucket is not None:
        cap = (int(max_bucket) // multiple) * multiple
        if cap < multiple:
            raise InputError(f"--max-bucket {max_bucket} is below {multiple}", f"use a multiple of {multiple}")
    rounded: dict[int, int] = {}
    uncovered_calls = 0
    uncovered_max: int | None = None
    for value, n in counts.items():
        if n <= 0:
            continue
        if value < 1:
            raise InputError(f"sequence length {value} is not positive", "lengths are patch counts or batch sizes >= 1")
        r = round_up(value, multiple)
        if cap is not None and r > cap:
            uncovered_calls += n
            uncovered_max = value if uncovered_max is None else max(uncovered_max, value)
            continue
        rounded[r] = rounded.get(r, 0) + n
    values = sorted(rounded)
    weights = [rounded[v] for v in values]
    distinct = len(values)  # before a forced top bucket, which is no value of the workload
    if cap is not None and force_max and (not values or values[-1] < cap):
        values.append(cap)
        weights.append(0)
    if not values:
        return OptimizeResult([], k, 0, 0, 0, uncovered_calls, uncovered_max, 0)
    costs = [cost_fn(v) for v in values]
    if any(b < a for a, b in zip(costs, costs[1:], strict=False)):
        raise ValueError("cost_fn must be nondecreasing in the sequence length")
    _, chosen = _partition_dp(values, weights, costs, k)
    # Recompute both sums on the original (unrounded) values: exact, and independent of the DP.
    covered = {v: n for v, n in counts.items() if n > 0 and (cap is None or round_up(v, multiple) <= cap)}
    ev = evaluate_buckets(covered, chosen, cost_fn)
    return OptimizeResult(
        buckets=chosen,
        k=k,
        executed=ev.executed,
        useful=ev.useful,
        covered_calls=ev.covered_calls,
        uncovered_calls=uncovered_calls,
        uncovered_max=uncovered_max,
        distinct_values=distinct,
    )


def baselines(
    counts: Mapping[int, int],
    cost_fn: Callable[[int], int | float],
    *,
    current: Sequence[int],
    top: int,
    pow2_start: int = POW2_START,
) -> dict[str, BucketEval]:
    """The lists an optimised one is compared with: the preset's, one bucket at ``top``, powers of two."""
    return {
        "preset": evaluate_buckets(counts, sorted(current), cost_fn),
        "single_largest": evaluate_buckets(counts, [top], cost_fn),
        "powers_of_two": evaluate_buckets(counts, powers_of_two(top, pow2_start), cost_fn),
    }


# --- decoder batches -------------------------------------------------------------------------------


def decoder_rows(b: int) -> int:
    """Cost of one decode step on a graph of batch ``b``: its rows (padding rows included)."""
    return b


def optimize_decoder_batches(
    trace: Mapping[int, int] | Iterable[int], k: int, batch_size: int | None = None
) -> OptimizeResult:
    """The at-most-``k`` ``decoder_batch_sizes`` minimising the rows computed over a batch trace.

    Cost model: a decode step on graph ``B`` computes ``B`` rows, so minimising the rows computed
    is minimising padded rows (the real rows are fixed). The largest entry is always ``batch_size``
    (optimum-rbln appends it anyway), or the trace's maximum when not given; trace entries above
    ``batch_size`` are reported as uncovered. Exact (same DP as ``optimize_buckets``).
    """
    counts = _as_counts(trace)
    if not counts:
        raise InputError("the batch trace has no decode steps", "give a list of running batch sizes, e.g. [1, 3, 4, 2]")
    top = batch_size if batch_size is not None else max(counts)
    return optimize_buckets(counts, k, decoder_rows, max_bucket=top, multiple=1, force_max=True)


def _as_counts(trace: Mapping[int, int] | Iterable[int]) -> dict[int, int]:
    if isinstance(trace, Mapping):
        return {int(b): int(n) for b, n in trace.items() if n > 0}
    out: dict[int, int] = {}
    for b in trace:
        out[b] = out.get(b, 0) + 1
    return out


def decoder_powers_of_two(batch_size: int) -> list[int]:
    """1, 2, 4, ... below ``batch_size``, then ``batch_size`` (the top must equal it)."""
    out = []
    p = 1
    while p < batch_size:
        out.append(p)
        p *= 2
    return [*out, batch_size]
