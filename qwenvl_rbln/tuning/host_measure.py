"""The host-time model measured: a least-squares fit of the engine steps' host time (``serving.step_log``) by kind.

Why a fit and not a median: the simulator asks a prefill of any length and image count and a decode of any row
count (``HostTimeModel.prefill(tokens, images)``, ``.decode(rows)``); the fit gives those coefficients and its
error says how far one step strays from it. Coefficients are kept >= 0: a term the data cannot support (the
tokens all alike, no image in the run, a negative slope from noise) is dropped and the rest refitted, and the
report says which were not measured.

numpy is imported inside ``fit`` only (qvl's core install has none).
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from qwenvl_rbln.tuning.host_time import HostTimeModel

MIN_STEPS = 3  # per kind, for a fit


@dataclass(frozen=True)
class KindFit:
    """One kind's fit: the coefficients by name, the steps, and the residuals' size (seconds)."""

    coefficients: dict[str, float]
    steps: int
    rms_s: float
    median_s: float
    p90_s: float
    median_abs_rel: float  # median |residual| / measured
    unmeasured: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"coefficients": self.coefficients, "steps": self.steps, "rms_s": self.rms_s,
                "median_s": self.median_s, "p90_s": self.p90_s, "median_abs_rel": self.median_abs_rel,
                "unmeasured": list(self.unmeasured)}  # fmt: skip


@dataclass(frozen=True)
class HostFit:
    model: HostTimeModel
    kinds: dict[str, KindFit]
    decode_by_rows: dict[int, float] = field(default_factory=dict)  # rows -> median host s
    prefill_by_images: dict[int, float] = field(default_factory=dict)  # images -> median host s

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.to_json(), "kinds": {k: v.to_dict() for k, v in self.kinds.items()},
                "decode_by_rows": {str(k): v for k, v in sorted(self.decode_by_rows.items())},
                "prefill_by_images": {str(k): v for k, v in sorted(self.prefill_by_images.items())}}  # fmt: skip


def host_info() -> dict[str, Any]:
    """The machine a measurement ran on: CPU model, cores (and those this process may use), load average."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), model)
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {"cpu": model, "cores": os.cpu_count(), "usable_cores": usable, "hostname": platform.node(),
            "loadavg": [round(x, 2) for x in load]}  # fmt: skip


def _nonneg_lstsq(names: list[str], rows: list[list[float]], y: list[float]) -> tuple[dict[str, float], list[str]]:
    """Least squares with every coefficient >= 0: a column without variation, or one whose coefficient comes out
    negative, is dropped (0) and the rest refitted. (coefficients, dropped names)"""
    import numpy as np

    x = np.asarray(rows, dtype=float)
    target = np.asarray(y, dtype=float)
    keep = [0] + [j for j in range(1, len(names)) if np.ptp(x[:, j]) > 0]
    while True:
        coef, *_ = np.linalg.lstsq(x[:, keep], target, rcond=None)
        negative = [(c, j) for c, j in zip(coef, keep, strict=True) if c < 0 and j != 0]
        if not negative:
            break
        keep.remove(min(negative)[1])
    out = dict.fromkeys(names, 0.0)
    for c, j in zip(coef, keep, strict=True):
        out[names[j]] = max(0.0, float(c))
    return out, [n for j, n in enumerate(names) if j not in keep]


def _kind(names: list[str], rows: list[list[float]], y: list[float]) -> KindFit:
    coef, dropped = _nonneg_lstsq(names, rows, y)
    pred = [sum(coef[n] * v for n, v in zip(names, r, strict=True)) for r in rows]
    res = [a - b for a, b in zip(y, pred, strict=True)]
    ordered = sorted(y)
    return KindFit(
        coefficients=coef,
        steps=len(y),
        rms_s=(sum(r * r for r in res) / len(res)) ** 0.5,
        median_s=statistics.median(y),
        p90_s=ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        median_abs_rel=statistics.median(abs(r) / v for r, v in zip(res, y, strict=True) if v > 0) if any(y) else 0.0,
        unmeasured=tuple(n for n in dropped if n != names[0]),
    )


def fit(steps: Sequence[Any], source: str, host: dict[str, Any]) -> HostFit:
    """The host-time model of these steps (``serving.step_log.Step``: kind, tokens, rows, images, host_s)."""
    prefill = [s for s in steps if s.kind == "prefill"]
    decode = [s for s in steps if s.kind == "decode"]
    kinds: dict[str, KindFit] = {}
    values: dict[str, float] = {}
    if len(prefill) >= MIN_STEPS:
        names = ["prefill_base_s", "prefill_per_token_s", "prefill_per_image_s"]
        kinds["prefill"] = _kind(names, [[1.0, s.tokens, s.images] for s in prefill], [s.host_s for s in prefill])
        values.update(kinds["prefill"].coefficients)
    if len(decode) >= MIN_STEPS:
        names = ["decode_base_s", "decode_per_row_s"]
        kinds["decode"] = _kind(names, [[1.0, s.rows] for s in decode], [s.host_s for s in decode])
        values.update(kinds["decode"].coefficients)
    by_rows = {r: statistics.median(s.host_s for s in decode if s.rows == r) for r in {s.rows for s in decode}}
    by_images = {i: statistics.median(s.host_s for s in prefill if s.images == i) for i in {s.images for s in prefill}}
    model = HostTimeModel(**values, source=source, host=host)
    return HostFit(model, kinds, by_rows, by_images)
