"""Optimisation comparisons of a bucket plan: the K ViT buckets (and decoder_batch_sizes) that would serve a
workload best, each compared with the preset's list and the usual baselines on the same calls.

Arithmetic over planned items (``bucket_items.py``): no torch, no terminal; returns plain dicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from qwenvl_rbln.errors import InputError, QvlError
from qwenvl_rbln.vision.bucket_plan.items import ItemPlanner
from qwenvl_rbln.vision.buckets import (
    OptimizeResult,
    baselines,
    decoder_powers_of_two,
    evaluate_buckets,
    optimize_buckets,
    optimize_decoder_batches,
    round_up,
    select_decoder_graph,
)
from qwenvl_rbln.vision.geometry import max_pixels_for_bucket
from qwenvl_rbln.vision.packing import evaluate_packed, optimize_packed

DECODER_NOTE = (
    "per-step decoder graph selection is what vllm-rbln does (smallest compiled batch >= running requests); "
    "optimum-rbln's own generate() always runs decoder_batch_{batch_size}"
)


def _call_counts(items: Iterable[dict[str, Any]]) -> dict[int, int]:
    """ViT calls per patch count over the planned items (each weighted by count x ViT calls)."""
    counts: dict[int, int] = {}
    for it in items:
        if it["patches"] is not None:
            counts[it["patches"]] = counts.get(it["patches"], 0) + it["count"] * it["vit_calls"]
    return counts


def _calls(items: Iterable[dict[str, Any]]) -> int:
    return sum(it["count"] * it["vit_calls"] for it in items)


def replan_caps(over: list[dict[str, Any]], caps: Any, cap: int, vision: Any) -> tuple[Any, dict[str, int]]:
    """Processor caps that resize every input in ``over`` into ``cap`` patches, and the keys they change.

    Images: ``max_pixels = cap * patch_size**2``; videos: the same number as ``video_max_frame_pixels``, the
    per-frame cap, so long videos keep their budget over all frames.
    """
    changes: dict[str, int] = {}
    if any(it.get("kind") != "video" for it in over):
        changes["max_pixels"] = min(caps.max_pixels, max_pixels_for_bucket(cap, vision.patch_size))
    if any(it.get("kind") == "video" for it in over):  # per frame (frame_cap.py): long videos keep their budget
        frame_cap = max_pixels_for_bucket(cap, vision.patch_size)
        changes["video_max_frame_pixels"] = min(caps.video_max_frame_pixels or frame_cap, frame_cap)
    for key, floor in (("max_pixels", "min_pixels"),):
        if key in changes and changes[key] < getattr(caps, floor):
            raise InputError(
                f"--max-bucket {cap}: resizing the inputs above it needs processor.{key}={changes[key]}, "
                f"below processor.{floor}={getattr(caps, floor)}",
                f"raise --max-bucket, or add --set processor.{floor}={changes[key]}",
            )
    return dataclasses.replace(caps, **changes), changes


def _replan_over_cap(
    items: list[dict[str, Any]], planner: ItemPlanner, cap: int
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The workload as it runs with the suggested processor cap: every item re-planned (None: nothing is over)."""
    over = [it for it in items if it["patches"] is not None and it.get("width") and round_up(it["patches"]) > cap]
    if not over:
        return items, None
    caps, changes = replan_caps(over, planner.caps, cap, planner.vision)
    again = planner.with_caps(caps)
    work = [again.again(it) if it["patches"] is not None and it.get("width") else it for it in items]
    sets = " ".join(f"--set processor.{k}={v}" for k, v in changes.items())
    info = {
        "max_bucket": cap,
        "inputs": sum(it["count"] for it in over),
        "vit_calls": _calls(over),
        "max_patches_before": max(it["patches"] for it in over),
        "processor": changes,
        "set": sets,
        "note": f"inputs above --max-bucket are costed in every list resized as {sets} does",
    }
    return work, info


def _nothing_to_optimise(counts: dict[int, int], res: Any, max_bucket: int | None) -> None:
    if not counts:
        raise InputError(
            "--optimize has nothing to optimise: every input failed", "fix the inputs (each item's error says how)"
        )
    if not res.buckets:  # every input is still above --max-bucket
        need = -(-min(counts) // 4) * 4
        raise InputError(
            f"--max-bucket {max_bucket} is below every input: the smallest needs {need} patches "
            f"({res.uncovered_calls} ViT calls would have no bucket)",
            f"raise --max-bucket to at least {need}, or drop it",
        )


def _speedup(optimised: Any, preset: Any) -> tuple[float | None, str | None]:
    """Executed-compute ratio, only between lists that run the same calls (else there is no like-for-like one)."""
    if preset.covered_calls != optimised.covered_calls:
        missing = preset.uncovered_calls - optimised.uncovered_calls
        who = "the preset's list" if missing > 0 else "the optimised list"
        return None, f"{who} cannot run {abs(missing):,} of these ViT calls: no like-for-like speedup"
    if not (optimised.executed and preset.executed):
        return None, None
    return round(preset.executed / optimised.executed, 4), None


def optimize_section(
    items: list[dict[str, Any]],
    plan: Any,
    k: int,
    max_bucket: int | None,
    cost: Callable[[int], int],
    planner: ItemPlanner | None = None,
) -> dict[str, Any]:
    """The optimised bucket list and the baselines, every one costed on the same ViT calls.

    With ``--max-bucket``, inputs above it are re-planned under the processor cap the output suggests
    (``--set processor.max_pixels=...``), so no list is credited for leaving calls out. Items without
    a known size cannot be re-planned and stay above the cap, uncovered in every list alike.
    """
    planner = planner or ItemPlanner(plan)
    work, replanned = (items, None) if max_bucket is None else _replan_over_cap(items, planner, max_bucket)
    counts = _call_counts(work)
    res = optimize_buckets(counts, k, cost, max_bucket=max_bucket, force_max=replanned is not None) if counts else None
    _nothing_to_optimise(counts, res, max_bucket)
    top = res.buckets[-1]
    base = baselines(counts, cost, current=plan.vit_buckets, top=top)
    packed = plan.runtime.get("vit_packing", True)
    if packed:  # optimise the packed cost instead; every list is costed packed too
        res, base = _optimize_packed(work, k, cost, max_bucket, res, base, force_max=replanned is not None)
    ps = plan.geometry.vision.patch_size
    total = sum(counts.values())
    speedup, speedup_note = _speedup(res, base["preset"])
    vit_set = "--set visual.max_seq_len=[" + ",".join(str(b) for b in res.buckets) + "]"
    return {
        **res.to_dict(),
        "executed_flops": res.executed,
        "useful_flops": res.useful,
        "max_bucket": max_bucket,
        "vit_calls": total,
        "compared_on": f"the same {total:,} ViT calls for every list"
        + (f", {replanned['vit_calls']:,} of them re-planned with {replanned['set']}" if replanned else ""),
        "replanned": replanned,
        "set": vit_set + (f" {replanned['set']}" if replanned else ""),
        "processor_max_pixels": top * ps * ps,
        "baselines": {name: e.to_dict() for name, e in base.items()},
        "speedup_vs_preset": speedup,
        "speedup_note": speedup_note,
        "cost": "packed" if packed else "unpacked",
        "vit_calls_packed": getattr(res, "packed_calls", None),
    }


def _request_groups(items: Iterable[dict[str, Any]]) -> dict[tuple[int, int], int]:
    """(patches per segment, segments per request) -> requests, over the planned items."""
    groups: dict[tuple[int, int], int] = {}
    for it in items:
        if it["patches"] is not None:
            key = (it["patches"], it["vit_calls"])
            groups[key] = groups.get(key, 0) + it["count"]
    return groups


def _optimize_packed(
    work: list[dict[str, Any]],
    k: int,
    cost: Callable[[int], int],
    max_bucket: int | None,
    res: Any,
    base: Any,
    *,
    force_max: bool = False,
) -> tuple[Any, dict[str, Any]]:
    """The K buckets minimising the packed executed cost, and the baselines costed packed (same lists)."""
    groups = _request_groups(work)
    chosen = optimize_packed(groups, k, cost, max_bucket, force_max=force_max) or res.buckets
    ev = evaluate_packed(groups, chosen, cost)
    out = OptimizeResult(
        buckets=chosen,
        k=k,
        executed=ev.executed,
        useful=ev.useful,
        covered_calls=ev.covered_calls,
        uncovered_calls=res.uncovered_calls,
        uncovered_max=res.uncovered_max,
        distinct_values=res.distinct_values,
    )
    out.packed_calls = ev.packed_calls  # type: ignore[attr-defined]
    return out, {name: evaluate_packed(groups, b.buckets, cost) for name, b in base.items()}


def decoder_section(trace: dict[int, int], plan: Any, k: int | None) -> tuple[dict[str, Any], list[str]]:
    graphs = sorted(plan.resolved.decoder_batch_sizes)
    batch_size = plan.resolved.batch_size
    per_batch = []
    per_graph: dict[int, dict[str, int]] = {g: {"steps": 0, "rows": 0, "padded_rows": 0} for g in graphs}
    errors: list[str] = []
    steps = rows = padded = uncovered = 0
    for b in sorted(trace):
        n = trace[b]
        steps += n
        entry: dict[str, Any] = {"batch": b, "steps": n, "graph": None, "padded_rows": None, "error": None}
        try:
            g, pad = select_decoder_graph(b, graphs)
        except QvlError as exc:
            entry["error"] = exc.one_line()
            errors.append(f"{n} step(s): {exc.one_line()}")
            uncovered += n
        else:
            entry.update(graph=g, padded_rows=pad * n)
            per_graph[g]["steps"] += n
            per_graph[g]["rows"] += b * n
            per_graph[g]["padded_rows"] += pad * n
            rows += b * n
            padded += pad * n
        per_batch.append(entry)
    computed = rows + padded
    out: dict[str, Any] = {
        "decoder_batch_sizes": graphs,
        "batch_size": batch_size,
        "steps": steps,
        "rows": rows,
        "computed_rows": computed,
        "padded_rows": padded,
        "padded_pct": round(100.0 * padded / computed, 2) if computed else None,
        "uncovered_steps": uncovered,
        "per_batch": per_batch,
        "per_graph": [{"graph": g, **v} for g, v in per_graph.items()],
        "note": DECODER_NOTE,
    }
    if k is not None:
        top = max(batch_size, max(trace))
        res = optimize_decoder_batches(trace, k, batch_size=top)

        def ev(bs: list[int]) -> dict[str, Any]:
            e = evaluate_buckets(trace, bs, lambda x: x)
            return {
                "decoder_batch_sizes": bs,
                "computed_rows": e.executed,
                "padded_rows": e.executed - e.useful,
                "computed_over_rows": round(e.ratio, 4) if e.ratio else None,
                "uncovered_steps": e.uncovered_calls,
            }

        sets = f"--set decoder_batch_sizes=[{','.join(str(b) for b in res.buckets)}]"
        if top != batch_size:
            sets = f"--set batch_size={top} " + sets
        out["optimized"] = {
            **ev(res.buckets),
            "k": k,
            "set": sets,
            "cost": "rows computed per decode step (graph batch); minimising it minimises padded rows",
            "baselines": {
                "preset": ev(graphs),
                "single_largest": ev([top]),
                "powers_of_two": ev(decoder_powers_of_two(top)),
            },
        }
    return out, errors
