"""``qvl bucket-plan`` composed: build the plan, plan the inputs (``vision.bucket_plan``: arithmetic only), ask the
memory planner for its verdicts and figures, and hand them down, so the vision layer never imports the planner.

No torch, no model, no NPU, no terminal: ``commands/bucket_plan_cmd.py`` calls ``run_bucket_plan`` and renders
the result (``views/bucket_plan.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import DoesNotFit, QvlError
from qwenvl_rbln.inference.vision_report import bucket_memory_check
from qwenvl_rbln.memory import workspaces
from qwenvl_rbln.memory.planner import estimate_plan
from qwenvl_rbln.memory.verdicts import fit_hint, gate_message, gate_stops
from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.vision.bucket_plan.items import ItemPlanner
from qwenvl_rbln.vision.bucket_plan.optimise import decoder_section, optimize_section
from qwenvl_rbln.vision.bucket_plan.report import (
    BucketMemory,
    check_flags,
    check_policy,
    nothing_to_plan,
    plan_workload,
    skip_warnings,
    skipped_json,
    summarize,
)
from qwenvl_rbln.vision.buckets import vit_cost_fn
from qwenvl_rbln.vision.media import expand_inputs_report, parse_size
from qwenvl_rbln.vision.workload import read_batch_trace


def _workspace_bytes(plan: Any, buckets: list[int]) -> dict[int, int | None]:
    """Visual workspace bytes per bucket from the memory planner (None for a bucket it cannot estimate)."""
    out: dict[int, int | None] = {}
    for bucket in buckets:
        try:
            d = workspaces.estimate_for_bucket(plan.geometry, bucket, dtype_bytes=plan.geometry.dtype_bytes)
            out[bucket] = int(d["workspace_bytes"])
        except Exception:  # a workspace column must never stop the plan of the inputs
            out[bucket] = None
    return out


def _bucket_verdicts(plan: Any, buckets: list[int]) -> dict[int, bool | str | None]:
    """Per bucket: would the whole plan (LM, KV, ViT) fit on its devices if that bucket were the largest?
    True / False, "uncertain" (the margin lies inside the modelled range), None (no estimate)."""
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
    report = estimate_plan(plan).to_dict()
    keys = ("device", "verdict", "total_bytes", "total_low_bytes", "total_high_bytes", "usable_bytes", "fits")
    return {
        "verdict": report["verdict"],
        "fits": report["fits"],
        "headline": report.get("headline"),
        "decided_by": report.get("decided_by"),
        "devices": [{k: d[k] for k in keys} for d in report["devices"]],
        "suggestions": [s["cli"] for s in report.get("suggestions") or []],
        "gate": None if report["verdict"] == "fits" else gate_message(report),
        "fix": None if report["verdict"] == "fits" else fit_hint(report),
    }


def plan_memory(plan: Any) -> BucketMemory:
    """Everything bucket-plan's summary needs from the memory planner, asked once."""
    buckets = list(plan.vit_buckets)
    return BucketMemory(
        verdicts=_bucket_verdicts(plan, buckets),
        workspace_bytes=_workspace_bytes(plan, buckets),
        summary=_memory_summary(plan),
    )


def own_dry_run(preset: str, sets: list[str] | None, model: str | None, extra: str) -> dict[str, Any]:
    """The memory verdict of a recommended configuration, by its own dry run (the preset, the user's --sets and
    the recommended ``--set ...`` string applied), so nothing is recommended that `compile --dry-run` refuses."""
    added = [part.strip() for part in extra.split("--set") if part.strip()]
    try:
        report = estimate_plan(build_plan(preset, [*(sets or []), *added], model=model)).to_dict()
    except QvlError as exc:
        return {"verdict": "invalid", "set": added, "reason": exc.one_line(), "fix": None}
    fix = (report.get("suggestions") or [{}])[0].get("cli")
    return {"verdict": report["verdict"], "set": added, "reason": None, "fix": fix}


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
    notify: Callable[[str], None] | None = None,
    on_oversize: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The whole command without printing: (JSON document, warnings). ``vit_packing=False``
    (``--no-vit-packing``) overrides the preset's ``runtime.vit_packing``: today's figures, no ``packed``.
    ``notify`` hears a warning as soon as it is known (the CLI prints it before a later error); without it,
    such warnings lead the returned list."""
    check_flags(
        has_inputs=bool(inputs or sizes or workload),
        optimize=optimize,
        max_bucket=max_bucket,
        batch_trace=batch_trace,
        optimize_decoder=optimize_decoder,
    )
    parsed_sizes = [(s, *parse_size(s)) for s in (sizes or [])]  # bad --size fails before any work
    expansion = expand_inputs_report(inputs or [])
    if inputs and not (expansion.files or sizes or workload or batch_trace):
        raise nothing_to_plan(inputs, expansion)

    plan = build_plan(preset, sets, model=model)
    if not vit_packing:
        plan.runtime = {**plan.runtime, "vit_packing": False}
    if on_oversize is not None:  # --on-oversize over the preset's runtime.on_oversize, as infer takes it
        check_policy(on_oversize)
        plan.runtime = {**plan.runtime, "on_oversize": on_oversize}
    early: list[str] = []
    planner = ItemPlanner(plan, bucket_memory=bucket_memory_check(plan))
    items = [planner.file(path) for path in expansion.files]
    items += [planner.size(text, w, h) for text, w, h in parsed_sizes]
    wl_info = None
    if workload is not None:
        wl_items, wl_info = plan_workload(planner, workload, notify or early.append)
        items.extend(wl_items)
    if optimize is not None and not items:
        raise nothing_to_plan(inputs or [], expansion)
    cost = vit_cost_fn(plan.geometry.vision)
    data: dict[str, Any] = {"items": items, "summary": summarize(items, plan, cost, plan_memory(plan))}
    if inputs:
        data["skipped_files"] = skipped_json(expansion)
    if wl_info:
        data["workload"] = wl_info
    if optimize is not None:
        data["optimized"] = optimize_section(items, plan, optimize, max_bucket, cost, planner)
        data["optimized"]["memory"] = own_dry_run(preset, sets, model, data["optimized"]["set"])
    if batch_trace is not None:
        dec, _ = decoder_section(read_batch_trace(batch_trace), plan, optimize_decoder)
        if dec.get("optimized"):
            dec["optimized"]["memory"] = own_dry_run(preset, sets, model, dec["optimized"]["set"])
        data["decoder"] = dec
    return data, [*early, *plan.warnings, *skip_warnings(expansion)]


def memory_gate(summary: dict[str, Any], uncertain_ok: bool) -> Exception | None:
    """The same CI gate as `compile --dry-run` (exit 4): the plan does not fit, or is uncertain without
    ``--uncertain-ok``. None when the plan may load."""
    mem = summary.get("memory") or {}
    if not gate_stops(mem.get("verdict"), uncertain_ok):
        return None
    return DoesNotFit(
        f"bucket-plan: {mem['gate']}",
        mem["fix"]
        .replace("in `qvl compile --dry-run`", "in `qvl compile --dry-run` or the JSON summary.memory")
        .replace(", or pass --force to compile anyway", "")
        .replace("; --force compiles anyway", ""),
    )
