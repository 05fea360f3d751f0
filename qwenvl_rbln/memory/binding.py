"""Which limit decides a device's verdict, the card total or its fullest chiplet, and that limit's own numbers.

Its own module because the gate line, the per-device note and the view must name the same constraint: a card
whose total fits in every scenario can still be ``uncertain`` or ``does_not_fit`` on one chiplet, and a line that
quotes the card's all-positive margin for it contradicts itself.
"""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.planning.catalogue.devices import GiB


def constraints(dev: dict[str, Any]) -> list[dict[str, Any]]:
    """The device total and the fullest chiplet, each as need (low, high) against its usable bytes and the margin
    (worst = need at its high end, best = need at its low end)."""
    usable = dev["usable_bytes"]
    total = dev.get("total_bytes", 0)
    low, high = dev.get("total_low_bytes", total), dev.get("total_high_bytes", total)
    out = [{"kind": "device", "need_low": low, "need_high": high, "usable": usable}]
    chip = dev.get("chiplets") or {}
    if chip:
        fullest = chip["fullest_bytes"]
        out.append(
            {
                "kind": "chiplet",
                "need_low": chip.get("fullest_low_bytes", fullest),
                "need_high": chip.get("fullest_high_bytes", fullest),
                "usable": chip["usable_per_chiplet_bytes"],
            }
        )
    for c in out:
        c["margin_worst"], c["margin_best"] = c["usable"] - c["need_high"], c["usable"] - c["need_low"]
    return out


def binding(dev: dict[str, Any]) -> list[dict[str, Any]]:
    """The constraints that fail in some scenario (worst margin below zero); for ``does_not_fit``, those that fail
    in every scenario come first. Empty when neither limit is crossed (the KV search alone decided)."""
    over = [c for c in constraints(dev) if c["margin_worst"] < 0]
    return sorted(over, key=lambda c: c["margin_best"] >= 0)


def _name(c: dict[str, Any]) -> str:
    return "the card total" if c["kind"] == "device" else "the fullest chiplet"


def _gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def describe(dev: dict[str, Any], verdict: str) -> str:
    """One clause for device ``dev`` that names the binding limit with its own numbers, e.g. ``device 0's
    fullest chiplet needs 34.90 .. 36.55 of 35.00 GiB (margin -1.55 .. +0.10 GiB); the card total fits
    (margin +24.79 .. +58.09 GiB)``."""
    lead = f"device {dev['device']}"
    cons = constraints(dev)
    bind = binding(dev)
    if verdict == "does_not_fit":
        bind = [c for c in bind if c["margin_best"] < 0]
    source = dev.get("verdict_source") or ""
    if source.startswith("observed") and (not bind or verdict == "fits"):
        return f"{lead}: {source}"
    if not bind:
        return f"{lead}: the KV pool search leaves fewer blocks than the minimum in some scenario"
    parts = []
    for c in bind:
        need = (
            _gib(c["need_high"])
            if c["need_low"] == c["need_high"]
            else f"{_gib(c['need_low'])} .. {_gib(c['need_high'])}"
        )
        margin = (
            f"{c['margin_worst'] / GiB:+.2f} GiB"
            if c["need_low"] == c["need_high"]
            else f"{c['margin_worst'] / GiB:+.2f} .. {c['margin_best'] / GiB:+.2f} GiB"
        )
        parts.append(f"{_name(c)} needs {need} of {_gib(c['usable'])} GiB (margin {margin})")
    text = f"{lead}: " + "; ".join(parts)
    fine = [c for c in cons if c not in bind and c["margin_worst"] >= 0]
    for c in fine:
        text += f"; {_name(c)} fits in every scenario (margin {c['margin_worst'] / GiB:+.2f} GiB at worst)"
    return text
