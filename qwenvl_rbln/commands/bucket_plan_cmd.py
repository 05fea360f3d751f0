"""`qvl bucket-plan`: where each image / video frame lands in the ViT buckets, what it wastes, and
which bucket list (and decoder_batch_sizes) would serve a real workload best.

Everything here is header reads and arithmetic: no torch, no model, no NPU.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from qwenvl_rbln.buckets import fmt_flops
from qwenvl_rbln.commands.common import JsonOpt, ModelOpt, PresetOpt, SetOpt
from qwenvl_rbln.render import Col, fmt_bytes, markup, plural, print_table

DECODER_NOTE = (
    "per-step decoder graph selection is what vllm-rbln does (smallest compiled batch >= running requests); "
    "optimum-rbln's own generate() always runs decoder_batch_{batch_size}"
)


# --- items -----------------------------------------------------------------------------------------


def _blank_item(input_name: str, kind: str, source: str, count: int = 1) -> dict[str, Any]:
    return {
        "input": input_name,
        "kind": kind,
        "source": source,
        "count": count,
        "width": None,
        "height": None,
        "resized_width": None,
        "resized_height": None,
        "patches": None,
        "bucket": None,
        "padding_pct": None,
        "lm_tokens": None,
        "vit_calls": None,
        "vit_calls_packed": None,
        "capped": None,
        "error": None,
    }


class ItemPlanner:
    """Turns sizes and files into item dicts under one plan's buckets and processor caps."""

    def __init__(self, plan: Any):
        from qwenvl_rbln import geometry
        from qwenvl_rbln.buckets import oversize_error, padding_pct, select_bucket, vit_cost_fn
        from qwenvl_rbln.errors import QvlError
        from qwenvl_rbln.modelinfo import processor_defaults

        self._image_geometry = geometry.image_geometry
        self._video_geometry = geometry.video_geometry
        self._image_geometry_for = geometry.image_geometry_for
        self._video_geometry_for = geometry.video_geometry_for
        self._image_capped = geometry.image_capped
        self._video_capped = geometry.video_capped
        self._padding_pct = padding_pct
        self._select = select_bucket
        self._oversize = oversize_error
        self._error_types = QvlError
        self.plan = plan
        self.buckets: list[int] = list(plan.vit_buckets)
        self.caps = plan.processor
        self.vision = plan.geometry.vision
        self.stock = processor_defaults(plan.model_id)
        self.packing = bool(getattr(plan, "runtime", {}).get("vit_packing", True))
        self.cost = vit_cost_fn(self.vision)

    # the geometry of one image size, with the bucket and padding
    def image(self, item: dict[str, Any], width: int, height: int) -> dict[str, Any]:
        v = self.vision
        item["width"], item["height"] = width, height
        try:
            geo = self._image_geometry_for(
                width, height, self.caps, patch_size=v.patch_size, merge_size=v.spatial_merge_size
            )
        except self._error_types as exc:
            item["error"] = f"{item['input']}: {exc.one_line()}"
            return item
        images = item.get("images", 1)  # a workload line's "images": N, one request
        item.update(
            resized_width=geo.resized_width,
            resized_height=geo.resized_height,
            patches=geo.patches,
            lm_tokens=geo.lm_tokens * images,
            vit_calls=images,
        )
        item["capped"] = self._image_capped(  # the one meaning infer reports too
            width, height, self.caps, self.stock["max_pixels"], patch_size=v.patch_size, merge_size=v.spatial_merge_size
        )
        return self._bucket(item, "image")

    def video(self, item: dict[str, Any], width: int, height: int, frames: int, fps: float | None) -> dict[str, Any]:
        v = self.vision
        c = self.caps
        item.update(width=width, height=height, total_frames=frames, fps=fps)
        try:
            geo = self._video_geometry_for(
                width,
                height,
                frames,
                fps,
                c,
                patch_size=v.patch_size,
                merge_size=v.spatial_merge_size,
                temporal_patch_size=v.temporal_patch_size,
            )
        except self._error_types as exc:
            item["error"] = f"{item['input']}: {exc.one_line()}"
            return item
        item.update(
            resized_width=geo.resized_width,
            resized_height=geo.resized_height,
            patches=geo.patches,
            lm_tokens=geo.lm_tokens,
            vit_calls=geo.vit_calls,
            sampled_frames=geo.sampled_frames,
            notes=list(geo.notes),
            capped=False,
        )
        item["capped"] = self._video_capped(  # the one meaning infer reports too
            width,
            height,
            frames,
            fps,
            c,
            self.stock["video_max_pixels"],
            patch_size=v.patch_size,
            merge_size=v.spatial_merge_size,
            temporal_patch_size=v.temporal_patch_size,
        )
        return self._bucket(item, "video", frames=geo.sampled_frames)

    def _bucket(self, item: dict[str, Any], kind: str, frames: int | None = None) -> dict[str, Any]:
        patches = item["patches"]
        bucket = self._select(patches, self.buckets)
        item["bucket"] = bucket
        if bucket is None:
            item["error"] = self._oversize(
                item["input"],
                patches,
                self.buckets,
                kind=kind,
                frames=frames,
                patch_size=self.vision.patch_size,
                temporal_patch_size=self.vision.temporal_patch_size,
            ).one_line()
        else:
            item["padding_pct"] = self._padding_pct(patches, bucket)  # the one rounding infer reports too
            item["vit_calls_packed"] = item["vit_calls"]
            if self.packing:  # one request's segments share calls (packing.py); requests are never packed together
                from qwenvl_rbln.packing import uniform_cost

                item["vit_calls_packed"] = uniform_cost(patches, item["vit_calls"], self.buckets, self.cost)[0]
        return item

    def file(self, path: Path) -> dict[str, Any]:
        from qwenvl_rbln.errors import QvlError
        from qwenvl_rbln.media import classify, probe_image, probe_video

        kind = classify(path)
        item = _blank_item(str(path), kind, "file")
        try:
            if kind == "video":
                info = probe_video(path)
                return self.video(item, info.width, info.height, info.total_frames, info.fps)
            info = probe_image(path)
        except QvlError as exc:
            item["error"] = exc.one_line()
            return item
        except Exception as exc:  # a probe bug must not hide the other items
            item["error"] = f"{path}: could not be read ({type(exc).__name__}: {exc})"
            return item
        return self.image(item, info.width, info.height)

    def size(self, text: str, width: int, height: int) -> dict[str, Any]:
        return self.image(_blank_item(text, "size", "size"), width, height)

    def with_caps(self, caps: Any) -> ItemPlanner:
        """The same planner under other processor caps (to show what a suggested --set processor.* does)."""
        other = copy.copy(self)
        other.caps = caps
        return other

    def again(self, item: dict[str, Any]) -> dict[str, Any]:
        """A planned item planned again under this planner's caps, from its known size (no file is re-read)."""
        new = _blank_item(item["input"], item["kind"], item["source"], item["count"])
        if "images" in item:
            new["images"] = item["images"]
        if item["kind"] == "video":
            return self.video(new, item["width"], item["height"], item["total_frames"], item["fps"])
        return self.image(new, item["width"], item["height"])

    def workload_entry(self, key: tuple, count: int) -> dict[str, Any]:
        width, height, frames, fps = key[:4]
        if frames is None:
            images = key[4] if len(key) > 4 else 1
            item = _blank_item(f"{width}x{height}" + (f" x{images}" if images > 1 else ""), "size", "workload", count)
            if images > 1:
                item["images"] = images
            return self.image(item, width, height)
        rate = f"@{fps:g}fps" if fps else ""
        item = _blank_item(f"{width}x{height} {frames}f{rate}", "video", "workload", count)
        return self.video(item, width, height, frames, fps)


# --- summaries -------------------------------------------------------------------------------------


def _workspace_fn() -> Callable[[Any, int], int | None] | None:
    """Visual workspace bytes per bucket from the memory planner, when it provides it."""
    try:
        from qwenvl_rbln import memory
    except ImportError:
        return None
    fn = getattr(memory, "estimate_for_bucket", None)
    if fn is None:
        return None

    def bytes_for(geometry: Any, bucket: int) -> int | None:
        try:
            d = fn(geometry, bucket, dtype_bytes=geometry.dtype_bytes)
        except Exception:
            return None
        if isinstance(d, int | float):
            return int(d)
        if isinstance(d, dict):
            for key in ("workspace_bytes", "total_bytes", "bytes"):
                if isinstance(d.get(key), int | float):
                    return int(d[key])
        return None

    return bytes_for


def _bucket_verdicts(plan: Any, buckets: list[int]) -> dict[int, bool | str | None]:
    """Per bucket: would the whole plan (LM, KV, ViT) fit on its devices if that bucket were the largest?
    True / False, "uncertain" (the margin lies inside the modelled range), None (no estimate)."""
    from qwenvl_rbln.memory import estimate_plan

    out: dict[int, bool | str | None] = {}
    for b in buckets:
        try:
            report = estimate_plan(plan, largest_vit_bucket=b, suggest=False)
            out[b] = report.fits if report.verdict != "uncertain" else "uncertain"
        except Exception:  # a verdict column must never stop the plan of the inputs
            out[b] = None
    return out


def _memory_summary(plan: Any) -> dict[str, Any]:
    """The plan's memory verdict, as `compile --dry-run` gives it, in short."""
    from qwenvl_rbln.memory import estimate_plan, fit_hint, gate_message

    report = estimate_plan(plan).to_dict()
    keys = ("device", "verdict", "total_bytes", "total_low_bytes", "total_high_bytes", "usable_bytes", "fits")
    return {
        "verdict": report["verdict"],
        "fits": report["fits"],
        "devices": [{k: d[k] for k in keys} for d in report["devices"]],
        "suggestions": [s["cli"] for s in report.get("suggestions") or []],
        "gate": None if report["verdict"] == "fits" else gate_message(report),
        "fix": None if report["verdict"] == "fits" else fit_hint(report),
    }


def own_dry_run(preset: str, sets: list[str] | None, model: str | None, extra: str) -> dict[str, Any]:
    """The memory verdict of a recommended configuration, by its own dry run (the preset, the user's --sets and
    the recommended ``--set ...`` string applied), so nothing is recommended that `compile --dry-run` refuses."""
    from qwenvl_rbln.errors import QvlError
    from qwenvl_rbln.memory import estimate_plan
    from qwenvl_rbln.plan import build_plan

    added = [part.strip() for part in extra.split("--set") if part.strip()]
    try:
        report = estimate_plan(build_plan(preset, [*(sets or []), *added], model=model)).to_dict()
    except QvlError as exc:
        return {"verdict": "invalid", "set": added, "reason": exc.one_line(), "fix": None}
    fix = (report.get("suggestions") or [{}])[0].get("cli")
    return {"verdict": report["verdict"], "set": added, "reason": None, "fix": fix}


def _recommendation_line(console: Any, use: str, own: dict[str, Any] | None) -> None:
    """'use: --set ...' only for a configuration whose own dry run fits; otherwise say plainly that it does not."""
    if own is None or own["verdict"] == "fits":
        console.print(f"use: {use}", markup=False)
        return
    what = {
        "does_not_fit": "does not fit",
        "uncertain": "is uncertain to fit (verdict uncertain)",
        "invalid": "is refused by the planner",
    }[own["verdict"]]
    extra = f" ({own['reason']})" if own.get("reason") else ""
    fix = f"; its dry run's first fix: {use} {own['fix']}" if own.get("fix") else ""
    console.print(f"not recommended as is: {use} {what} in its own dry run{extra}{fix}", markup=False)


def summarize(items: Iterable[dict[str, Any]], plan: Any, cost: Callable[[int], int]) -> dict[str, Any]:
    """Per-bucket totals over the planned items (each weighted by count x ViT calls)."""
    buckets = list(plan.vit_buckets)
    per: dict[int, dict[str, Any]] = {
        b: {"calls": 0, "pad_sum": 0.0, "executed": 0, "useful": 0, "inputs": 0} for b in buckets
    }
    uncovered = {"calls": 0, "inputs": 0, "max_patches": None}
    n_items = n_errors = requests = lm_tokens = capped = 0
    for it in items:
        n_items += 1
        requests += it["count"]
        if it["patches"] is None:
            n_errors += 1
            continue
        calls = it["count"] * it["vit_calls"]
        lm_tokens += it["count"] * it["lm_tokens"]
        if it.get("capped"):
            capped += it["count"]
        b = it["bucket"]
        if b is None:
            n_errors += 1
            uncovered["calls"] += calls
            uncovered["inputs"] += it["count"]
            mp = uncovered["max_patches"]
            uncovered["max_patches"] = it["patches"] if mp is None else max(mp, it["patches"])
            continue
        row = per[b]
        row["calls"] += calls
        row["inputs"] += it["count"]
        row["pad_sum"] += calls * (b - it["patches"]) / b
        row["executed"] += calls * cost(b)
        row["useful"] += calls * cost(it["patches"])
    total_calls = sum(r["calls"] for r in per.values()) + uncovered["calls"]
    verdicts = _bucket_verdicts(plan, buckets)
    workspace = _workspace_fn()
    dtype = plan.geometry.dtype_bytes
    rows = []
    for b in buckets:
        r = per[b]
        rows.append(
            {
                "bucket": b,
                "square_px": int(math.isqrt(b) * plan.geometry.vision.patch_size),
                "inputs": r["inputs"],
                "calls": r["calls"],
                "share": round(r["calls"] / total_calls, 4) if total_calls else 0.0,
                "mean_padding_pct": round(100.0 * r["pad_sum"] / r["calls"], 2) if r["calls"] else None,
                "executed_flops": r["executed"],
                "useful_flops": r["useful"],
                "executed_over_useful": round(r["executed"] / r["useful"], 4) if r["useful"] else None,
                "flops_per_call": cost(b),
                "attn_mask_bytes": b * b * dtype,
                "workspace_bytes": workspace(plan.geometry, b) if workspace else None,
                "plan_fits_with_this_as_largest": verdicts.get(b),
            }
        )
    executed = sum(r["executed"] for r in per.values())
    useful = sum(r["useful"] for r in per.values())
    return {
        "preset": plan.preset,
        "vit_buckets": buckets,
        "unit": "pre-merge patches (16x16 px) per image or per temporal patch (2 video frames)",
        "processor": plan.processor.to_dict(),
        "items": n_items,
        "requests": requests,
        "errors": n_errors,
        "vit_calls": total_calls,
        "lm_tokens": lm_tokens,
        "capped_inputs": capped,
        "executed_flops": executed,
        "useful_flops": useful,
        "executed_over_useful": round(executed / useful, 4) if useful else None,
        "buckets": rows,
        "memory": _memory_summary(plan),
        "uncovered": uncovered,
        "workspace_note": None
        if workspace
        else "visual workspace per bucket: memory.estimate_for_bucket not available",
        **({"packed": packed_summary(items, plan, cost)} if plan.runtime.get("vit_packing", True) else {}),
    }


def packed_summary(items: Iterable[dict[str, Any]], plan: Any, cost: Callable[[int], int]) -> dict[str, Any]:
    """The same items with each request's segments packed into shared ViT calls (``packing.py``): every pack
    uses its segments' own bucket, so the figures differ only in calls, executed FLOPs and mask bytes."""
    from qwenvl_rbln.packing import uniform_cost

    dtype = plan.geometry.dtype_bytes
    calls = executed = useful = mask = unpacked_mask = 0
    for it in items:
        if it["patches"] is None:
            continue
        if it["bucket"] is None:  # above every bucket: as today (no pack), counted as its calls
            calls += it["count"] * it["vit_calls"]
            continue
        n, b = it["vit_calls"], it["bucket"]
        packed_calls, packed_executed = uniform_cost(it["patches"], n, plan.vit_buckets, cost)
        calls += it["count"] * packed_calls
        executed += it["count"] * packed_executed
        useful += it["count"] * n * cost(it["patches"])
        mask += it["count"] * packed_calls * b * b * dtype
        unpacked_mask += it["count"] * n * b * b * dtype
    return {
        "vit_calls": calls,
        "executed_flops": executed,
        "executed_over_useful": round(executed / useful, 4) if useful else None,
        "attn_mask_bytes": mask,
        "unpacked_attn_mask_bytes": unpacked_mask,
        "note": "segments of one request (its images, a video's temporal patches) share a ViT call through a "
        "block-diagonal mask, each pack in its segments' own bucket; requests are never packed together",
    }


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

    Images: ``max_pixels = cap * patch_size**2``. Videos share one budget over all frames, so it is
    sized for the fewest sampled frames among them (the others then fit with room to spare).
    """
    from qwenvl_rbln.errors import InputError
    from qwenvl_rbln.geometry import max_pixels_for_bucket, video_max_pixels_for_bucket

    changes: dict[str, int] = {}
    if any(it.get("kind") != "video" for it in over):
        changes["max_pixels"] = min(caps.max_pixels, max_pixels_for_bucket(cap, vision.patch_size))
    videos = [it for it in over if it.get("kind") == "video"]
    if videos:
        frames = min(it["sampled_frames"] for it in videos)
        budget = video_max_pixels_for_bucket(cap, frames, vision.patch_size, vision.temporal_patch_size)
        changes["video_max_pixels"] = min(caps.video_max_pixels, budget)
    for key, floor in (("max_pixels", "min_pixels"), ("video_max_pixels", "video_min_pixels")):
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
    from qwenvl_rbln.buckets import round_up

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
    from qwenvl_rbln.errors import InputError

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
    from qwenvl_rbln.buckets import baselines, optimize_buckets

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
    from qwenvl_rbln.buckets import OptimizeResult
    from qwenvl_rbln.packing import evaluate_packed, optimize_packed

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
    from qwenvl_rbln.buckets import (
        decoder_powers_of_two,
        evaluate_buckets,
        optimize_decoder_batches,
        select_decoder_graph,
    )
    from qwenvl_rbln.errors import QvlError

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


# --- human output ----------------------------------------------------------------------------------


def _fmt_int(n: Any) -> str:
    return "-" if n is None else f"{n:,}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _left_out(console: Any, dropped: list[str]) -> None:
    """Say which columns a narrow console left out, so a missing one is not mistaken for missing data."""
    if dropped:
        console.print(
            f"[dim]left out at {console.width} columns: {', '.join(dropped)} (a wider terminal or --json shows them)"
            "[/dim]"
        )


def _print_header(console: Any, data: dict[str, Any]) -> None:
    s = data["summary"]
    p = s["processor"]
    console.print(
        markup(
            "[bold]{}[/bold]: ViT buckets {} [dim]({})[/dim]",
            s["preset"],
            ", ".join(str(b) for b in s["vit_buckets"]),
            s["unit"],
        )
    )
    console.print(
        f"processor: images {p['min_pixels']:,}..{p['max_pixels']:,} px, videos {p['video_min_pixels']:,}.."
        f"{p['video_max_pixels']:,} px over all frames, {p['fps']:g} fps",
        markup=False,
    )
    if data.get("workload"):
        w = data["workload"]
        console.print(
            f"workload {w['path']}: {plural(w['requests'], 'request')} on {plural(w['lines'], 'line')}, aggregated "
            f"into {plural(w['distinct'], 'distinct size')}",
            markup=False,
        )


def _item_row(it: dict[str, Any]) -> list[str]:
    size = f"{it['width']}x{it['height']}" if it["width"] else "-"
    resized = f"{it['resized_width']}x{it['resized_height']}" if it["resized_width"] else "-"
    if it.get("capped"):
        resized += "*"
    bucket = str(it["bucket"]) if it["bucket"] else ("[red]none[/red]" if it["patches"] else "[red]error[/red]")
    return [
        escape(it["input"]),
        size,
        resized,
        _fmt_int(it["patches"]),
        bucket,
        "-" if it["padding_pct"] is None else f"{it['padding_pct']:.1f}",
        _fmt_int(it["lm_tokens"]),
        _fmt_int(it["vit_calls"]),
        _fmt_int(it.get("vit_calls_packed")),
        _fmt_int(it["count"]),
    ]


def _print_inputs(console: Any, data: dict[str, Any], rows_limit: int) -> None:
    items = data["items"]
    s = data["summary"]
    shown = items if rows_limit <= 0 else items[:rows_limit]
    cols = [
        Col("input", "left", fold=True, max_width=48),
        Col("size", drop=2),
        Col("resized", drop=4),
        Col("patches"),
        Col("bucket"),
        Col("pad %"),
        Col("LM tokens", drop=1),
        Col("ViT calls", drop=3),
        Col("packed", drop=3),
        Col("count"),
    ]
    rows = [_item_row(it) for it in shown]
    if "packed" not in s:  # --no-vit-packing / runtime.vit_packing: false
        cols, rows = cols[:-2] + cols[-1:], [r[:-2] + r[-1:] for r in rows]
    if not any(it["count"] != 1 for it in items):
        cols, rows = cols[:-1], [r[:-1] for r in rows]
    _left_out(console, print_table(console, cols, rows, title="inputs"))
    if len(shown) < len(items):
        what = "distinct sizes" if data.get("workload") else "items"
        console.print(
            f"[dim]{len(items) - len(shown):,} more {what} not shown (--rows 0 shows all; --json has every item)[/dim]"
        )
    if s["capped_inputs"]:
        console.print(
            f"[dim]* downscaled by processor.max_pixels={s['processor']['max_pixels']:,} (qvl caps it at the largest "
            f"bucket x 256 so nothing overflows); {s['capped_inputs']:,} input(s) affected[/dim]"
        )


def _print_errors(console: Any, items: list[dict[str, Any]], rows_limit: int) -> None:
    errors = [it["error"] for it in items if it["error"]]
    if not errors:
        return
    console.print(f"[bold red]{len(errors):,} input(s) cannot run:[/bold red]")
    limit = len(errors) if rows_limit <= 0 else max(rows_limit, 20)
    for e in errors[:limit]:
        console.print(f"  {e}", markup=False)
    if len(errors) > limit:
        console.print(f"  ... {len(errors) - limit:,} more (see --json)", markup=False)


BUCKET_COLS = (
    Col("bucket"),
    Col("~square", drop=3),
    Col("inputs", drop=5),
    Col("ViT calls"),
    Col("share", drop=6),
    Col("mean pad %"),
    Col("executed"),
    Col("useful", drop=4),
    Col("exec/useful"),
    Col("attn mask", drop=1),
    Col("workspace", drop=2),
    Col("fits as largest", drop=3),
)


def _bucket_rows(s: dict[str, Any]) -> list[list[str]]:
    rows = []
    for r in s["buckets"]:
        rows.append(
            [
                f"{r['bucket']:,}",
                f"{r['square_px']}²",
                _fmt_int(r["inputs"]),
                _fmt_int(r["calls"]),
                f"{100 * r['share']:.1f}%",
                "-" if r["mean_padding_pct"] is None else f"{r['mean_padding_pct']:.1f}",
                fmt_flops(r["executed_flops"]) if r["calls"] else "-",
                fmt_flops(r["useful_flops"]) if r["calls"] else "-",
                _ratio(r["executed_over_useful"]),
                fmt_bytes(r["attn_mask_bytes"]),
                fmt_bytes(r["workspace_bytes"]) if r["workspace_bytes"] is not None else "-",
                _yes_no(r.get("plan_fits_with_this_as_largest")),
            ]
        )
    u = s["uncovered"]
    if u["calls"]:
        share = f"{100 * u['calls'] / s['vit_calls']:.1f}%"
        rows.append(["[red]> largest[/red]", "-", _fmt_int(u["inputs"]), _fmt_int(u["calls"]), share, "-", "fails"])
        rows[-1] += ["-"] * 5
    total_inputs = sum(r["inputs"] for r in s["buckets"]) + u["inputs"]
    executed, useful = fmt_flops(s["executed_flops"]), fmt_flops(s["useful_flops"])
    ratio = _ratio(s["executed_over_useful"])
    rows.append(["[bold]total[/bold]", "", _fmt_int(total_inputs), _fmt_int(s["vit_calls"]), "", "", executed, useful])
    rows[-1] += [ratio, "", "", ""]
    return rows


def _yes_no(value: bool | str | None) -> str:
    if value == "uncertain":
        return "[yellow]uncertain[/yellow]"
    return "-" if value is None else ("yes" if value else "[red]no[/red]")


def _print_buckets(console: Any, s: dict[str, Any]) -> None:
    if not s["vit_calls"]:
        return
    _left_out(console, print_table(console, BUCKET_COLS, _bucket_rows(s), title="per bucket"))
    console.print(
        f"[dim]compute = ViT FLOPs per call at the bucket (executed) vs at the real patch count (useful); "
        f"LM tokens in total {s['lm_tokens']:,}[/dim]"
    )
    if s.get("workspace_note"):
        console.print(f"[dim]{s['workspace_note']}[/dim]")
    _print_packed(console, s)
    _print_memory_line(console, s.get("memory"))


def _print_packed(console: Any, s: dict[str, Any]) -> None:
    """Unpacked and packed side by side: calls, executed compute, mask bytes (each request's segments packed)."""
    p = s.get("packed")
    if not p:
        return
    console.print(
        f"packed ViT calls (a request's images / temporal patches share calls): {s['vit_calls']:,} -> "
        f"{p['vit_calls']:,} calls, executed {fmt_flops(s['executed_flops'])} -> {fmt_flops(p['executed_flops'])} "
        f"({_ratio(s['executed_over_useful'])} -> {_ratio(p['executed_over_useful'])} useful), attn mask "
        f"{fmt_bytes(p['unpacked_attn_mask_bytes'])} -> {fmt_bytes(p['attn_mask_bytes'])} sent "
        "(--no-vit-packing: one call each)",
        markup=False,
    )


def _print_memory_line(console: Any, mem: dict[str, Any] | None) -> None:
    """The whole plan's verdict (LM + KV + ViT per device), so a bucket list that cannot load is seen here."""
    if not mem:
        return
    devices = ", ".join(
        f"device {d['device']} {fmt_bytes(d['total_bytes'])} of {fmt_bytes(d['usable_bytes'])}" for d in mem["devices"]
    )
    verdict = mem.get("verdict") or {True: "fits", False: "does_not_fit"}.get(mem.get("fits"), "uncertain")
    if verdict == "fits":
        console.print(f"[dim]memory (whole plan, as compile --dry-run): fits: {devices}[/dim]")
        return
    fix = f"; try {mem['suggestions'][0]}" if mem["suggestions"] else "; see `qvl compile --dry-run`"
    style, text = ("red", "does not fit") if verdict == "does_not_fit" else ("yellow", "uncertain")
    console.print(f"[{style}]memory (whole plan): {text}: {devices}{fix}[/{style}]")


def _print_optimized(console: Any, opt: dict[str, Any], preset: str) -> None:
    console.print(
        f"[bold]optimised ViT buckets[/bold] (K={opt['k']}, {opt['distinct_values']:,} distinct patch counts; "
        f"cost = {'packed ' if opt.get('cost') == 'packed' else ''}ViT FLOPs; every list on the same "
        f"{opt['vit_calls']:,} ViT calls)"
    )
    rep = opt.get("replanned")
    if rep:
        console.print(
            f"{rep['inputs']:,} input(s) ({rep['vit_calls']:,} ViT calls, up to {rep['max_patches_before']:,} patches) "
            f"are above --max-bucket {rep['max_bucket']:,}; every list below costs them resized as {rep['set']} "
            f"does (part of the suggested --set)",
            markup=False,
        )
    names = {"preset": "preset", "single_largest": "single largest", "powers_of_two": "powers of two"}
    lists = [("[bold]optimised[/bold]", opt)] + [(label, opt["baselines"][key]) for key, label in names.items()]
    cols = [
        Col("list", "left", fold=True, fold_min=10),
        Col("n", drop=1),
        Col("buckets", "left", fold=True, fold_min=14),
        Col("executed"),
        Col("exec/useful", drop=3),
        Col("uncovered", drop=2 if not any(b["uncovered_calls"] for _, b in lists) else 0),
    ]
    rows = [
        [
            label,
            str(len(b["buckets"])),
            ", ".join(map(str, b["buckets"])),
            fmt_flops(b["executed"]),
            _ratio(b["executed_over_useful"]),
            _fmt_int(b["uncovered_calls"]),
        ]
        for label, b in lists
    ]
    _left_out(console, print_table(console, cols, rows))
    if opt["speedup_vs_preset"] is not None:
        console.print(f"{opt['speedup_vs_preset']:.2f}x less ViT compute executed than the preset's list", markup=False)
    elif opt.get("speedup_note"):
        console.print(opt["speedup_note"], markup=False)
    if opt["uncovered_calls"]:
        console.print(
            f"{opt['uncovered_calls']:,} ViT call(s) are still above --max-bucket "
            f"(up to {opt['uncovered_max']:,} patches) and have no bucket in any list",
            markup=False,
        )
    _recommendation_line(console, opt["set"], opt.get("memory"))
    if not rep:
        console.print(
            f"[dim]with this list qvl caps processor.max_pixels at {opt['processor_max_pixels']:,} px "
            f"(top bucket x 256) unless the preset sets it[/dim]"
        )


def _print_decoder_optimized(console: Any, do: dict[str, Any]) -> None:
    console.print(f"[bold]optimised decoder_batch_sizes[/bold] (K={do['k']}; cost = rows computed per step)")
    cols = [
        Col("list", "left", fold=True),
        Col("decoder_batch_sizes", "left", fold=True),
        Col("computed rows"),
        Col("padded rows"),
        Col("computed/real"),
    ]

    def row(label: str, b: dict[str, Any]) -> list[str]:
        return [
            label,
            str(b["decoder_batch_sizes"]),
            _fmt_int(b["computed_rows"]),
            _fmt_int(b["padded_rows"]),
            _ratio(b["computed_over_rows"]),
        ]

    rows = [row("[bold]optimised[/bold]", do)]
    for key, label in (("preset", "preset"), ("single_largest", "batch_size only"), ("powers_of_two", "powers of two")):
        b = do["baselines"][key]
        extra = f" ({b['uncovered_steps']:,} steps do not fit)" if b["uncovered_steps"] else ""
        rows.append(row(label + extra, b))
    print_table(console, cols, rows)
    _recommendation_line(console, do["set"], do.get("memory"))


def _print_decoder(console: Any, dec: dict[str, Any], rows_limit: int) -> None:
    console.print(
        f"[bold]decoder graphs[/bold] {dec['decoder_batch_sizes']} (batch_size {dec['batch_size']}): "
        f"{dec['steps']:,} decode steps, {dec['rows']:,} real rows, {dec['padded_rows']:,} padded rows "
        f"({dec['padded_pct'] if dec['padded_pct'] is not None else 0:.1f}% of computed)"
    )
    per = dec["per_batch"]
    rows = [
        [
            str(e["batch"]),
            _fmt_int(e["steps"]),
            str(e["graph"]) if e["graph"] else "[red]none[/red]",
            _fmt_int(e["padded_rows"]),
        ]
        for e in (per if rows_limit <= 0 else per[:rows_limit])
    ]
    print_table(console, [Col("running batch"), Col("steps"), Col("graph"), Col("padded rows")], rows)
    if dec["uncovered_steps"]:
        for e in per:
            if e["error"]:
                console.print(f"  {e['error']}", markup=False)
    if dec.get("optimized"):
        _print_decoder_optimized(console, dec["optimized"])
    console.print(f"[dim]note: {dec['note']}[/dim]")


def print_human(console: Any, data: dict[str, Any], rows_limit: int) -> None:
    """Tables that stay readable at 80 columns: columns are left out (and said so) before a number is cut."""
    _print_header(console, data)
    if data["items"]:
        _print_inputs(console, data, rows_limit)
    _print_errors(console, data["items"], rows_limit)
    _print_buckets(console, data["summary"])
    if data.get("optimized"):
        _print_optimized(console, data["optimized"], data["summary"]["preset"])
    if data.get("decoder"):
        _print_decoder(console, data["decoder"], rows_limit)


# --- command ---------------------------------------------------------------------------------------


def _check_k(flag: str, k: int | None) -> None:
    from qwenvl_rbln.errors import InputError

    if k is not None and k < 1:
        raise InputError(f"{flag} {k}: the number of buckets must be at least 1", f"e.g. {flag} 3")


def _check_flags(
    *,
    has_inputs: bool,
    optimize: int | None,
    max_bucket: int | None,
    batch_trace: Path | None,
    optimize_decoder: int | None,
) -> None:
    """Flag combinations, the specific complaint first (so a lone --optimize-decoder names what it needs)."""
    from qwenvl_rbln.errors import InputError

    _check_k("--optimize", optimize)
    _check_k("--optimize-decoder", optimize_decoder)
    if max_bucket is not None and optimize is None:
        raise InputError("--max-bucket only applies to --optimize", "add --optimize K, or drop --max-bucket")
    if max_bucket is not None and (max_bucket < 4 or max_bucket % 4):
        raise InputError(
            f"--max-bucket {max_bucket} is not a positive multiple of 4 (spatial_merge_size**2)",
            f"use {max(4, max_bucket - max_bucket % 4)}",
        )
    if optimize_decoder is not None and batch_trace is None:
        raise InputError(
            "--optimize-decoder needs --batch-trace FILE",
            "pass the observed running-batch sizes: a JSON list or one integer per line",
        )
    if optimize is not None and not has_inputs:
        raise InputError("--optimize needs inputs to optimise for", "pass files, --size or --workload")
    if not (has_inputs or batch_trace):
        raise InputError(
            "bucket-plan needs something to plan",
            "pass image/video files or directories, --size WIDTHxHEIGHT, --workload FILE or --batch-trace FILE",
        )


SKIPPED_SHOWN = 5


def _names(paths: list[Path], shown: int = SKIPPED_SHOWN) -> str:
    text = ", ".join(str(p) for p in paths[:shown])
    return text + (f", ... ({len(paths) - shown:,} more)" if len(paths) > shown else "")


def _supported() -> str:
    from qwenvl_rbln.media import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS

    return f"images {' '.join(sorted(IMAGE_EXTENSIONS))}; videos {' '.join(sorted(VIDEO_EXTENSIONS))}"


def _skip_warnings(expansion: Any) -> list[str]:
    """Say what directories held that is not planned: a silent skip looks like an empty workload."""
    out = []
    if expansion.skipped:
        out.append(
            f"skipped {len(expansion.skipped):,} file(s) without an image or video extension: "
            f"{_names(expansion.skipped)} (qvl reads {_supported()}; convert others, e.g. HEIC, to JPEG or PNG)"
        )
    out += [f"{d}: no image or video files in this directory" for d in expansion.empty_dirs]
    return out


def _nothing_to_plan(inputs: list[str], expansion: Any) -> Exception:
    from qwenvl_rbln.errors import InputError

    skipped = f"; {len(expansion.skipped):,} other file(s) skipped: {_names(expansion.skipped)}"
    verb = "holds" if len(inputs) == 1 else "hold"
    return InputError(
        f"nothing to plan: {_names([Path(i) for i in inputs])} {verb} no image or video files"
        + (skipped if expansion.skipped else ""),
        f"pass image or video files ({_supported()}), convert other formats (e.g. HEIC) to JPEG or PNG, "
        "or use --size/--workload",
    )


def _skipped_json(expansion: Any) -> dict[str, Any]:
    return {"count": len(expansion.skipped), "examples": [str(p) for p in expansion.skipped[:20]]}


def _plan_workload(planner: ItemPlanner, workload: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from qwenvl_rbln.workload import read_workload

    wl = read_workload(workload)
    items = [planner.workload_entry(key, n) for key, n in wl.sizes.items()]
    items.sort(key=lambda it: (-it["count"], it["input"]))
    info = {
        "path": wl.path,
        "format": wl.format,
        "lines": wl.lines,
        "requests": wl.requests,
        "distinct": wl.distinct,
        "ignored_keys": sorted(wl.ignored),
    }
    if wl.ignored:
        from qwenvl_rbln import render

        render.warn(
            escape(
                f"{wl.path}: ignored {'keys' if wl.format != 'csv' else 'columns'} {', '.join(sorted(wl.ignored))} "
                "(only width, height, count, frames, fps, kind and images are read)"
            )
        )
    return items, info


def run_bucket_plan(
    *,
    preset: str,
    sets: list[str] | None,
    model: str | None,
    inputs: list[str] | None,
    sizes: list[str] | None,
    workload: Path | None,
    optimize: int | None,
    max_bucket: int | None,
    batch_trace: Path | None,
    optimize_decoder: int | None,
    vit_packing: bool = True,
) -> tuple[dict[str, Any], list[str]]:
    """The whole command without printing: (JSON document, warnings). ``vit_packing=False``
    (``--no-vit-packing``) overrides the preset's ``runtime.vit_packing``: today's figures, no ``packed``."""
    from qwenvl_rbln.buckets import vit_cost_fn
    from qwenvl_rbln.media import expand_inputs_report, parse_size
    from qwenvl_rbln.plan import build_plan

    _check_flags(
        has_inputs=bool(inputs or sizes or workload),
        optimize=optimize,
        max_bucket=max_bucket,
        batch_trace=batch_trace,
        optimize_decoder=optimize_decoder,
    )
    parsed_sizes = [(s, *parse_size(s)) for s in (sizes or [])]  # bad --size fails before any work
    expansion = expand_inputs_report(inputs or [])
    if inputs and not (expansion.files or sizes or workload or batch_trace):
        raise _nothing_to_plan(inputs, expansion)

    plan = build_plan(preset, sets, model=model)
    if not vit_packing:
        plan.runtime = {**plan.runtime, "vit_packing": False}
    planner = ItemPlanner(plan)
    items = [planner.file(path) for path in expansion.files]
    items += [planner.size(text, w, h) for text, w, h in parsed_sizes]
    wl_info = None
    if workload is not None:
        wl_items, wl_info = _plan_workload(planner, workload)
        items.extend(wl_items)
    if optimize is not None and not items:
        raise _nothing_to_plan(inputs or [], expansion)
    cost = vit_cost_fn(plan.geometry.vision)
    data: dict[str, Any] = {"items": items, "summary": summarize(items, plan, cost)}
    if inputs:
        data["skipped_files"] = _skipped_json(expansion)
    if wl_info:
        data["workload"] = wl_info
    if optimize is not None:
        data["optimized"] = optimize_section(items, plan, optimize, max_bucket, cost, planner)
        data["optimized"]["memory"] = own_dry_run(preset, sets, model, data["optimized"]["set"])
    if batch_trace is not None:
        from qwenvl_rbln.workload import read_batch_trace

        dec, _ = decoder_section(read_batch_trace(batch_trace), plan, optimize_decoder)
        if dec.get("optimized"):
            dec["optimized"]["memory"] = own_dry_run(preset, sets, model, dec["optimized"]["set"])
        data["decoder"] = dec
    return data, [*plan.warnings, *_skip_warnings(expansion)]


def _final_error(data: dict[str, Any], as_json: bool) -> str | None:
    """The closing stderr line when something could not be planned; it points where the details are."""
    failed = sum(1 for it in data["items"] if it["error"])
    dec_failed = data.get("decoder", {}).get("uncovered_steps", 0)
    if not (failed or dec_failed):
        return None
    parts, where = [], []
    if failed:
        parts.append(f"{failed:,} of {len(data['items']):,} inputs cannot run with preset {data['summary']['preset']}")
        where.append("items[].error")
    if dec_failed:
        parts.append(f"{dec_failed:,} decode steps are above the largest decoder graph")
        where.append("decoder.per_batch[].error")
    if as_json:
        return f"qvl: error: {'; '.join(parts)}; fix: see {' and '.join(where)} in the JSON for each one's fix"
    return f"qvl: error: {'; '.join(parts)} (listed above); fix: see the fix on each line above, or remove the inputs"


def register(app: typer.Typer) -> None:
    @app.command("bucket-plan")
    def bucket_plan_cmd(
        inputs: list[str] = typer.Argument(None, help="Image/video files or directories (searched recursively)."),
        preset: str = PresetOpt,
        sets: list[str] = SetOpt,
        model: str = ModelOpt,
        sizes: list[str] = typer.Option(None, "--size", help="An image size WIDTHxHEIGHT, e.g. 1920x1080. Repeatable."),
        workload: Path = typer.Option(
            None,
            "--workload",
            "-w",
            help='Sizes from logs: JSONL {"width","height","count"} (+ "frames","fps" for videos) or CSV '
            "width,height[,count]; a misspelt key is an error, other keys (ids, timestamps) are ignored and listed.",
        ),
        optimize: int = typer.Option(
            None, "--optimize", "-k", help="Find the K ViT buckets minimising the ViT compute executed."
        ),
        max_bucket: int = typer.Option(None, "--max-bucket", help="Cap for the largest optimised bucket (patches)."),
        batch_trace: Path = typer.Option(
            None, "--batch-trace", help="Observed running-batch sizes: a JSON list or one integer per line."
        ),
        optimize_decoder: int = typer.Option(
            None, "--optimize-decoder", help="Find the K decoder_batch_sizes minimising padded rows over --batch-trace."
        ),
        rows: int = typer.Option(
            50, "--rows", min=0, help="Table rows to print (0 = all); --json always has every item."
        ),
        no_vit_packing: bool = typer.Option(
            False,
            "--no-vit-packing",
            help="One ViT call per image / temporal patch (today's optimum-rbln); default: each request's segments "
            "packed into shared calls, unless the preset says runtime.vit_packing: false.",
        ),
        uncertain_ok: bool = typer.Option(
            False,
            "--uncertain-ok",
            help="Accept a memory verdict of 'uncertain' for the plan (exit 0 instead of 4), as compile --dry-run.",
        ),
        as_json: bool = JsonOpt,
    ) -> None:
        """Where each image / video frame lands in the ViT buckets, its padding and compute, and the best buckets
        for a workload. Header reads only: no model, no NPU."""
        from qwenvl_rbln import render
        from qwenvl_rbln.commands.common import print_warnings

        data, warnings = run_bucket_plan(
            preset=preset,
            sets=sets,
            model=model,
            inputs=inputs,
            sizes=sizes,
            workload=workload,
            optimize=optimize,
            max_bucket=max_bucket,
            batch_trace=batch_trace,
            optimize_decoder=optimize_decoder,
            vit_packing=not no_vit_packing,
        )
        print_warnings(warnings)
        render.emit(data, as_json=as_json, human=lambda console, d: print_human(console, d, rows))
        line = _final_error(data, as_json)
        if line:
            render.err().print(line, markup=False, highlight=False)
            raise SystemExit(2)
        mem = data["summary"].get("memory") or {}
        if mem.get("verdict") == "does_not_fit" or (mem.get("verdict") == "uncertain" and not uncertain_ok):
            from qwenvl_rbln.errors import DoesNotFit

            raise DoesNotFit(  # the same CI gate as compile --dry-run: exit 4
                f"bucket-plan: {mem['gate']}",
                mem["fix"]
                .replace("in `qvl compile --dry-run`", "in `qvl compile --dry-run` or the JSON summary.memory")
                .replace(", or pass --force to compile anyway", "")
                .replace("; --force compiles anyway", ""),
            )
