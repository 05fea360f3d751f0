"""Byte counts as people read them; plain code so the core and the backends need no terminal library."""

from __future__ import annotations


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
