"""The planner's entry points: ``estimate`` for a model, resolved LM and placement, ``estimate_plan`` for a Plan.

Its own module because it ties the estimate and the suggestions together, so neither imports the other back.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from qwenvl_rbln.memory import calibration as cal
from qwenvl_rbln.memory.context import Ctx
from qwenvl_rbln.memory.estimate import evaluate
from qwenvl_rbln.memory.params import RBLN_DTYPE_BYTES
from qwenvl_rbln.memory.report import SOURCE_OVERRIDE, SOURCE_SPEC, MemoryReport, parse_device_memory
from qwenvl_rbln.memory.suggestions import suggestions
from qwenvl_rbln.planning.catalogue.devices import NpuSpec
from qwenvl_rbln.planning.catalogue.modelinfo import ModelGeometry


def estimate(
    geometry: ModelGeometry,
    resolved: Any,
    spec: NpuSpec,
    placement: dict[str, Any],
    *,
    device_memory: int | str | None = None,
    calibration: dict[str, Any] | None = None,
    dtype_bytes: int | None = None,
    suggest: bool = True,
) -> MemoryReport:
    """Per-device memory of a resolved LM + ViT placement; ``calibration`` None reads the default file."""
    override = parse_device_memory(device_memory, spec)
    ctx = Ctx(
        geometry=geometry,
        spec=spec,
        usable=override if override is not None else spec.usable_bytes,
        usable_source=SOURCE_OVERRIDE if override is not None else SOURCE_SPEC,
        calibration=cal.load_calibration() if calibration is None else calibration,
        dtype_bytes=dtype_bytes or geometry.dtype_bytes,
    )
    report = evaluate(ctx, resolved, placement)
    if suggest:
        report.suggestions = suggestions(ctx, resolved, placement, report)
    return report


def estimate_plan(
    plan: Any,
    device_memory: int | str | None = None,
    calibration: dict[str, Any] | None = None,
    *,
    largest_vit_bucket: int | None = None,
    suggest: bool = True,
) -> MemoryReport:
    """estimate() for a Plan (bf16 for the rbln backend, the model's dtype for the torch reference);
    ``largest_vit_bucket`` answers "would it fit if this were the largest ViT bucket" for bucket-plan."""
    dtype = RBLN_DTYPE_BYTES if plan.backend == "rbln" else plan.geometry.dtype_bytes
    resolved = plan.resolved
    if largest_vit_bucket is not None:
        kept = [b for b in resolved.vit_buckets if b < largest_vit_bucket]
        resolved = replace(resolved, vit_buckets=[*kept, largest_vit_bucket])
    return estimate(
        plan.geometry,
        resolved,
        plan.npu_spec,
        plan.placement,
        device_memory=device_memory,
        calibration=calibration,
        dtype_bytes=dtype,
        suggest=suggest,
    )
