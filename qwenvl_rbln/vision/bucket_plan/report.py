"""The bucket-plan report as plain data: every item's bucket and padding, per-bucket compute, the packed
figures, the flag checks and the closing error.

Everything here is header reads and arithmetic: no torch, no model, no NPU, no terminal, and no memory planner:
``jobs/bucket_plan_job.py`` builds the plan, asks the memory planner and hands its numbers down
(``BucketMemory``); ``commands/bucket_plan_cmd.py`` parses the options and renders the result
(``views/bucket_plan.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.vision.bucket_plan.items import ItemPlanner
from qwenvl_rbln.vision.context import RESERVE_TOKENS
from qwenvl_rbln.vision.media import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS
from qwenvl_rbln.vision.packing import uniform_cost
from qwenvl_rbln.vision.workload import read_workload


@dataclass(frozen=True)
class BucketMemory:
    """The memory planner's answers for one plan, handed down by ``jobs.bucket_plan_job`` (vision never asks it).

    ``verdicts``: per bucket, would the whole plan fit with it as the largest (True, False, "uncertain", None);
    ``workspace_bytes``: the visual workspace per bucket (None for a bucket the planner cannot estimate);
    ``summary``: the plan's own verdict in short, as ``compile --dry-run`` gives it.
    """

    verdicts: dict[int, bool | str | None]
    workspace_bytes: dict[int, int | None]
    summary: dict[str, Any]


def summarize(
    items: Iterable[dict[str, Any]], plan: Any, cost: Callable[[int], int], memory: BucketMemory
) -> dict[str, Any]:
    """Per-bucket totals over the planned items (each weighted by count x ViT calls); the memory figures come
    from the memory planner through ``memory`` (``jobs.bucket_plan_job`` asks it), so this stays arithmetic."""
    buckets = list(plan.vit_buckets)
    per: dict[int, dict[str, Any]] = {
        b: {"calls": 0, "pad_sum": 0.0, "executed": 0, "useful": 0, "inputs": 0} for b in buckets
    }
    uncovered = {"calls": 0, "inputs": 0, "max_patches": None}
    n_items = n_errors = requests = lm_tokens = capped = over_context = 0
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
        if it.get("lm_fit") and not it["lm_fit"]["fits"]:
            over_context += it["count"]
            n_errors += it["bucket"] is not None  # counted once: an oversize one is counted below
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
    verdicts = memory.verdicts
    workspace = memory.workspace_bytes
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
                "workspace_bytes": workspace.get(b),
                "plan_fits_with_this_as_largest": verdicts.get(b),
            }
        )
    executed = sum(r["executed"] for r in per.values())
    useful = sum(r["useful"] for r in per.values())
    from qwenvl_rbln.planning.catalogue.modelinfo import moe_summary

    return {
        "preset": plan.preset,
        **({"model_moe": moe_summary(plan.geometry)} if plan.geometry.text.moe else {}),  # ViT depth 27, out 2048
        "vit_buckets": buckets,
        "unit": "pre-merge patches (16x16 px) per image or per temporal patch (2 video frames)",
        "processor": plan.processor.to_dict(),
        "items": n_items,
        "requests": requests,
        "errors": n_errors,
        "vit_calls": total_calls,
        "lm_tokens": lm_tokens,
        "capped_inputs": capped,
        "on_oversize": plan.runtime.get("on_oversize", "resize"),
        "context": {
            "max_seq_len": plan.resolved.max_seq_len,
            "reserve": RESERVE_TOKENS,
            "over_context_inputs": over_context,
            "note": f"each input's tokens (an upper bound for videos) must leave {RESERVE_TOKENS} of max_seq_len free "
            "for the chat template, the prompt text and the output, or qvl infer refuses it",
        },
        "executed_flops": executed,
        "useful_flops": useful,
        "executed_over_useful": round(executed / useful, 4) if useful else None,
        "buckets": rows,
        "memory": memory.summary,
        "uncovered": uncovered,
        "workspace_note": None,  # the key stays for --json readers: the planner always gives per-bucket figures
        **({"packed": packed_summary(items, plan, cost)} if plan.runtime.get("vit_packing", True) else {}),
    }


def packed_summary(items: Iterable[dict[str, Any]], plan: Any, cost: Callable[[int], int]) -> dict[str, Any]:
    """The same items with each request's segments packed into shared ViT calls (``packing.py``): every pack
    uses its segments' own bucket, so the figures differ only in calls, executed FLOPs and mask bytes."""
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


def check_policy(on_oversize: str) -> None:
    from qwenvl_rbln.planning.plan import ON_OVERSIZE

    if on_oversize not in ON_OVERSIZE:
        raise InputError(
            f"--on-oversize {on_oversize!r} is not one of {', '.join(ON_OVERSIZE)}",
            "use --on-oversize resize (default) or --on-oversize error",
        )


def _check_k(flag: str, k: int | None) -> None:
    if k is not None and k < 1:
        raise InputError(f"{flag} {k}: the number of buckets must be at least 1", f"e.g. {flag} 3")


def check_flags(
    *,
    has_inputs: bool,
    optimize: int | None,
    max_bucket: int | None,
    batch_trace: Path | None,
    optimize_decoder: int | None,
) -> None:
    """Flag combinations, the specific complaint first (so a lone --optimize-decoder names what it needs)."""
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
    return f"images {' '.join(sorted(IMAGE_EXTENSIONS))}; videos {' '.join(sorted(VIDEO_EXTENSIONS))}"


def skip_warnings(expansion: Any) -> list[str]:
    """Say what directories held that is not planned: a silent skip looks like an empty workload."""
    out = []
    if expansion.skipped:
        out.append(
            f"skipped {len(expansion.skipped):,} file(s) without an image or video extension: "
            f"{_names(expansion.skipped)} (qvl reads {_supported()}; convert others, e.g. HEIC, to JPEG or PNG)"
        )
    out += [f"skipped {path}: {why}" for path, why in getattr(expansion, "special", [])]
    out += [f"{d}: no image or video files in this directory" for d in expansion.empty_dirs]
    return out


def nothing_to_plan(inputs: list[str], expansion: Any) -> Exception:
    skipped = f"; {len(expansion.skipped):,} other file(s) skipped: {_names(expansion.skipped)}"
    verb = "holds" if len(inputs) == 1 else "hold"
    return InputError(
        f"nothing to plan: {_names([Path(i) for i in inputs])} {verb} no image or video files"
        + (skipped if expansion.skipped else ""),
        f"pass image or video files ({_supported()}), convert other formats (e.g. HEIC) to JPEG or PNG, "
        "or use --size/--workload",
    )


def skipped_json(expansion: Any) -> dict[str, Any]:
    special = getattr(expansion, "special", [])
    return {
        "count": len(expansion.skipped),
        "examples": [str(p) for p in expansion.skipped[:20]],
        "not_regular": [{"path": str(p), "why": why} for p, why in special],
    }


def plan_workload(
    planner: ItemPlanner, workload: Path, notify: Callable[[str], None]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The workload's distinct sizes planned, most frequent first; its ignored keys are said through ``notify``."""
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
        notify(
            f"{wl.path}: ignored {'keys' if wl.format != 'csv' else 'columns'} {', '.join(sorted(wl.ignored))} "
            "(only width, height, count, frames, fps, kind and images are read)"
        )
    return items, info


def final_error(data: dict[str, Any], as_json: bool) -> InputError | None:
    """The error (exit 2) when something could not be planned: its line closes stderr and, with --json, the
    document carries it; it points where the details are."""
    failed = sum(1 for it in data["items"] if it["error"])
    dec_failed = data.get("decoder", {}).get("uncovered_steps", 0)
    if not (failed or dec_failed):
        return None
    parts, where = [], []
    if failed:
        parts.append(f"{failed:,} of {len(data['items']):,} inputs cannot run with preset {data['summary']['preset']}")
        where.append("items[].error")
    if dec_failed:
        steps = f"{dec_failed:,} decode step is" if dec_failed == 1 else f"{dec_failed:,} decode steps are"
        parts.append(f"{steps} above the largest decoder graph")
        where.append("decoder.per_batch[].error")
    if as_json:
        return InputError("; ".join(parts), f"see {' and '.join(where)} in the JSON for each one's fix")
    return InputError(f"{'; '.join(parts)} (listed above)", "see the fix on each line above, or remove the inputs")
