"""Time one runtime call: device time from ``rebel.capture_reports()`` where the runtime offers it, else wall time
around the call; warm-up, repeats, and the median with its spread (p10-p90, plus min and max).

The report is read as vllm-rbln's model runner reads it (``CAPTURE_SOURCE``): ``reports[0]["total_device"]``, in
microseconds. No public rebel document describes it and optimum-rbln 0.12 does not call it; vllm-rbln v0.11.0 does
(the newest release it was checked against), and so did its 0.10 line: that is the version named, never a "0.12".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

CAPTURE_SOURCE = (
    "vllm-rbln v0.11.0 (RBLN-SW/vllm-rbln 95c7a25a): v1/worker/optimum_model_runner.py wraps each model call in "
    "rebel.capture_reports() and v1/worker/metrics.py reads reports[0]['total_device'] as microseconds"
)
DEVICE = "device time (rebel.capture_reports total_device)"
WALL = "wall time around the runtime call (the runtime has no capture_reports)"


def _percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarise(samples: list[float]) -> dict[str, float]:
    return {
        "median_s": _percentile(samples, 0.5),
        "p10_s": _percentile(samples, 0.1),
        "p90_s": _percentile(samples, 0.9),
        "min_s": min(samples),
        "max_s": max(samples),
    }


def _one(rebel: Any, call: Callable[[], Any]) -> tuple[float, bool]:
    """(seconds, from the device report) for one call."""
    capture = getattr(rebel, "capture_reports", None)
    if capture is not None:
        try:
            with capture() as reports:
                call()
        except (AttributeError, TypeError):  # a runtime without working reports: fall back to the clock
            capture = None
        else:
            device_us = (reports[0] or {}).get("total_device") if reports else None
            if isinstance(device_us, int | float) and device_us > 0:
                return device_us / 1e6, True
    start = time.perf_counter()
    call()
    return time.perf_counter() - start, False


def time_call(rebel: Any, call: Callable[[], Any], *, warmup: int, repeats: int) -> tuple[dict[str, float], str]:
    """Warm up, then time ``repeats`` calls: (summary, which clock)."""
    for _ in range(warmup):
        call()
    samples, from_device = [], True
    for _ in range(repeats):
        seconds, device = _one(rebel, call)
        samples.append(seconds)
        from_device = from_device and device
    return {**summarise(samples), "samples": float(len(samples))}, DEVICE if from_device else WALL
