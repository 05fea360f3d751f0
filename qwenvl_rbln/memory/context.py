"""The context one estimate scenario runs in, and the small readings of a plan every step shares.

Its own module so the KV sizing, the item builders, the chiplet view and the suggestions can all take the
same context without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qwenvl_rbln.memory.params import QUANT_MODEL_DTYPE
from qwenvl_rbln.planning.catalogue.devices import NpuSpec
from qwenvl_rbln.planning.catalogue.modelinfo import ModelGeometry


@dataclass
class Ctx:
    geometry: ModelGeometry
    spec: NpuSpec
    usable: int
    usable_source: str
    calibration: dict[str, Any]
    dtype_bytes: int
    scenario: str = "mid"


def quant(resolved: Any) -> dict[str, Any] | None:
    return getattr(resolved, "quantization", None) or None


def model_dtype(ctx: Ctx, resolved: Any) -> int:
    """Bytes per element of the compiled model: fp32 for a quantized one (optimum-rbln loads it in float32)."""
    return QUANT_MODEL_DTYPE if quant(resolved) else ctx.dtype_bytes
