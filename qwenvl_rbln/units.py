"""Byte counts and JSON values as people read them; plain code so the core and the backends need no terminal
library."""

from __future__ import annotations

import json
from typing import Any


def fmt_bytes(n: float | int | None) -> str:
    """Binary units, as rbln-smi prints them (GiB)."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.2f} TiB"


def fmt_json(value: Any, limit: int = 60) -> str:
    """A value from a JSON file as JSON spells it (``null``, ``true``, ``NaN``, ``"text"``), never Python's ``None``
    or ``True``; cut to ``limit`` characters for a one-line message."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
