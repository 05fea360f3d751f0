"""The workload and the batch trace, read once, and the two choices that depend on them alone: the ViT buckets
(exactly as ``bucket-plan --optimize K``) and the decoder graphs for a batch (exactly as ``--optimize-decoder K``).

The search then varies only what memory decides (batch, context, partition, placement), so the bucket DP runs
once however many candidates are checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.vision.bucket_plan.items import ItemPlanner
from qwenvl_rbln.vision.bucket_plan.optimise import optimize_section
from qwenvl_rbln.vision.buckets import decoder_powers_of_two, optimize_decoder_batches, select_bucket, vit_cost_fn
from qwenvl_rbln.vision.packing import slot, uniform_packs
from qwenvl_rbln.vision.workload import read_batch_trace, read_workload


@dataclass
class Work:
    """What the cost model needs from the workload, and the bucket list chosen for it."""

    path: str
    requests: int
    lines: int
    distinct: int
    errors: int  # requests that cannot be planned at all (their error is in the first message)
    first_error: str | None
    vit_buckets: list[int]
    vit_section: dict[str, Any]  # bucket-plan's optimized section, baselines included
    groups: dict[tuple[int, int], int]  # (patches per segment, segments per request) -> requests
    chunks_hist: dict[int, int] = field(default_factory=dict)  # LM image tokens per request -> requests
    trace: dict[int, int] | None = None
    trace_path: str | None = None
    prompt_tokens: int = 128
    output_tokens: int = 256
    longest: tuple[str, int, int] | None = None  # the request with the most media tokens: (line, tokens, images)
    vit_note: str | None = None  # why the buckets differ from bucket-plan --optimize K's, when they do
    # (patches per segment, segments per request, LM media tokens) -> requests: the joint mix the simulator draws
    mix: dict[tuple[int, int, int], int] = field(default_factory=dict)

    @property
    def mean_input_tokens(self) -> float:
        total = sum(self.chunks_hist.values())
        image = sum(t * n for t, n in self.chunks_hist.items()) / total if total else 0.0
        return image + self.prompt_tokens

    def to_dict(self) -> dict[str, Any]:
        sec = self.vit_section
        return {
            "path": self.path,
            "lines": self.lines,
            "requests": self.requests,
            "distinct_sizes": self.distinct,
            "unplannable_requests": self.errors,
            "mean_input_tokens": round(self.mean_input_tokens, 1),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "vit_buckets": self.vit_buckets,
            "vit_buckets_note": self.vit_note,
            "vit_cost": sec.get("cost"),
            "vit_executed_over_useful": sec.get("executed_over_useful"),
            "vit_baselines": {k: v.get("buckets") for k, v in sec.get("baselines", {}).items()},
            "batch_trace": self.trace_path,
            "trace_steps": sum(self.trace.values()) if self.trace else None,
            "trace_max_batch": max(self.trace) if self.trace else None,
        }


def read_work(
    base_plan: Any,
    workload: Path,
    k: int,
    trace: Path | None,
    *,
    prompt_tokens: int,
    output_tokens: int,
) -> Work:
    """Plan every workload line under the base plan, choose its K buckets (packed DP) and read the trace."""
    wl = read_workload(workload)
    planner = ItemPlanner(base_plan)
    items = [planner.workload_entry(key, n) for key, n in wl.sizes.items()]
    bad = [it for it in items if it["patches"] is None or it["bucket"] is None]
    good = [it for it in items if it not in bad] if bad else items
    if not good:
        raise InputError(
            f"{wl.path}: no line of the workload can be planned ({bad[0]['error'] if bad else 'it is empty'})",
            "fix the workload lines (width, height, count; frames for videos)",
        )
    cost = vit_cost_fn(base_plan.geometry.vision)
    section = optimize_section(good, base_plan, k, None, cost, planner)
    buckets, note = above_min_pixels(list(section["buckets"]), base_plan, k)
    groups: dict[tuple[int, int], int] = {}
    tokens: dict[int, int] = {}
    mix: dict[tuple[int, int, int], int] = {}
    longest = max(good, key=lambda it: it["lm_fit"]["tokens"] if it.get("lm_fit") else 0)
    for it in good:
        key = (it["patches"], it["vit_calls"])
        groups[key] = groups.get(key, 0) + it["count"]
        tokens[it["lm_tokens"]] = tokens.get(it["lm_tokens"], 0) + it["count"]
        joint = (*key, it["lm_tokens"])
        mix[joint] = mix.get(joint, 0) + it["count"]
    return Work(
        path=wl.path,
        requests=wl.requests,
        lines=wl.lines,
        distinct=wl.distinct,
        errors=sum(it["count"] for it in bad),
        first_error=bad[0]["error"] if bad else None,
        vit_buckets=buckets,
        vit_section=section,
        groups=groups,
        chunks_hist=tokens,
        trace=read_batch_trace(trace) if trace is not None else None,
        trace_path=str(trace) if trace is not None else None,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        longest=(longest["input"], longest["lm_fit"]["tokens"], longest.get("images", 1))
        if longest["lm_fit"]
        else None,
        vit_note=note,
        mix=mix,
    )


def min_pixels_bucket(plan: Any) -> int:
    """The smallest largest-bucket the plan accepts (the plan refuses a lower one: "no image fits"): the planning
    catalogue's one floor, for this plan's processor and patch geometry."""
    from qwenvl_rbln.planning.catalogue import modelinfo

    v = plan.geometry.vision
    return modelinfo.min_pixels_bucket(plan.processor.min_pixels, v.patch_size, v.spatial_merge_size)


def above_min_pixels(buckets: list[int], plan: Any, k: int) -> tuple[list[int], str | None]:
    """The DP's buckets with the largest raised to the min_pixels floor when the workload alone (small video
    frames) chose less: the smaller buckets are kept for the frames, at most K in all."""
    floor = min_pixels_bucket(plan)
    if buckets[-1] >= floor:
        return buckets, None
    kept = sorted(set(buckets))[: max(0, k - 1)]
    note = (
        f"bucket-plan --optimize {k} chooses {buckets} for these inputs alone; the largest bucket is raised to {floor} "
        f"patches, the least that holds an image of processor.min_pixels={plan.processor.min_pixels} (the plan "
        "refuses less)"
    )
    return [*kept, floor], note


def check_context(work: Work, context: int, max_position: int) -> None:
    """Every request fits --context, as bucket-plan's ``lm_fit`` and infer count it: its media tokens (pads, the
    vision start/end pairs, a video's timestamps) plus --prompt-tokens and --output-tokens, and never less than
    bucket-plan's reserve for the template, prompt and output. A configuration at --context cannot serve a longer
    request, so tune refuses rather than recommend it (it does not raise the context: that is the user's need)."""
    from qwenvl_rbln.vision.context import RESERVE_TOKENS

    if work.longest is None:
        media, name, images = 0, "every request", 1
    else:
        name, media, images = work.longest
        name = f"request {name}"
    text = work.prompt_tokens + work.output_tokens
    need = media + max(text, RESERVE_TOKENS)
    if need <= context:
        return
    parts = f"{media:,} for its images/videos + " if media else ""
    parts += f"--prompt-tokens {work.prompt_tokens} + --output-tokens {work.output_tokens}"
    if text < RESERVE_TOKENS:
        parts += f", at least bucket-plan's reserve of {RESERVE_TOKENS}"
    fixes = [f"raise --context to {need} (or more)"] if need <= max_position else []
    if text >= context:
        fixes.append(f"lower --prompt-tokens/--output-tokens (together {text:,})")
    per_image = media // images
    if media and images > 1 and per_image + max(text, RESERVE_TOKENS) <= context:
        fixes.append(f"send at most {(context - max(text, RESERVE_TOKENS)) // per_image} of these images per request")
    elif media:
        fixes.append("send fewer or smaller images/videos per request")
    fix = ", or ".join(fixes) + f" (the model holds at most {max_position} tokens)"
    raise InputError(f"{work.path}: {name} needs {need:,} tokens ({parts}), above --context {context}", fix)


def vit_seconds_per_request(work: Work, buckets: list[int], call_seconds: Any) -> float:
    """Mean ViT time per request with packing: each request's segments share calls (``packing.uniform_cost``)."""
    total = 0.0
    ordered = sorted(buckets)
    for (patches, n), requests in work.groups.items():
        bucket = select_bucket(slot(patches), ordered)
        if bucket is not None:
            total += requests * uniform_packs(patches, n, bucket) * call_seconds(bucket)
    count = sum(work.groups.values())
    return total / count if count else 0.0


def clamp_trace(trace: dict[int, int], batch: int) -> dict[int, int]:
    """Running batches above ``batch`` run as ``batch`` (the rest wait in the queue)."""
    out: dict[int, int] = {}
    for b, n in trace.items():
        out[min(b, batch)] = out.get(min(b, batch), 0) + n
    return out


def decoder_graphs(work: Work, batch: int, k: int) -> tuple[list[int], str]:
    """``decoder_batch_sizes`` for a batch: ``--optimize-decoder K`` on the trace (its entries above ``batch``
    clamped to it); without a trace the powers of two up to the batch, or the K best for a uniform load when
    those are more than K."""
    if work.trace:
        res = optimize_decoder_batches(clamp_trace(work.trace, batch), k, batch_size=batch)
        return sorted(res.buckets), "optimised on the batch trace (as --optimize-decoder)"
    pow2 = decoder_powers_of_two(batch)
    if len(pow2) <= k:
        return pow2, "powers of two up to the batch (no batch trace)"
    res = optimize_decoder_batches({b: 1 for b in range(1, batch + 1)}, k, batch_size=batch)
    return sorted(res.buckets), f"the {k} best for a uniform running batch 1..{batch} (no batch trace)"


def chunks(tokens: float, chunk: int) -> int:
    return max(1, math.ceil(tokens / chunk))
