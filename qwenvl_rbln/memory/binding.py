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


def describe_limit(c: dict[str, Any]) -> str:
    """One limit with its need, usable bytes and margin, e.g. ``the fullest chiplet needs 34.90 .. 36.55 of
    35.00 GiB (margin -1.55 .. +0.10 GiB)``."""
    need = _span(c["need_low"], c["need_high"], _gib)
    margin = (
        f"{c['margin_worst'] / GiB:+.2f} GiB"
        if c["need_low"] == c["need_high"]
        else f"{c['margin_worst'] / GiB:+.2f} .. {c['margin_best'] / GiB:+.2f} GiB"
    )
    return f"{_name(c)} needs {need} of {_gib(c['usable'])} GiB (margin {margin})"


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
    decided = dev.get("decided_by") or {}
    if decided.get("constraint") == "kv_blocks":  # optimum-rbln's compile stops on the KV minimum first
        return f"{lead}: {decided['text']}" + "".join(f"; {describe_limit(c)}" for c in bind)
    if not bind:
        return f"{lead}: the KV pool search leaves fewer blocks than the minimum in some scenario"
    text = f"{lead}: " + "; ".join(describe_limit(c) for c in bind)
    fine = [c for c in cons if c not in bind and c["margin_worst"] >= 0]
    for c in fine:
        text += f"; {_name(c)} fits in every scenario (margin {c['margin_worst'] / GiB:+.2f} GiB at worst)"
    return text


VERDICT_WORDS = {"fits": "fits", "does_not_fit": "does not fit", "uncertain": "uncertain"}
_NOT_OUT = ("kind", "some", "every")
_LIMIT_NAMES = {"device": "card total", "chiplet": "fullest chiplet"}


def _span(low: int | float, high: int | float, fmt: Any = str) -> str:
    return fmt(high) if low == high else f"{fmt(low)} .. {fmt(high)}"


def _budget(kv: dict[str, Any]) -> str:
    """How the automatic KV search was bounded: the memory_budget as written, or the nominal DRAM."""
    budget = kv.get("memory_budget")
    if budget is None:
        return "in the nominal DRAM beside the LM (no memory_budget)"
    if isinstance(budget, float):
        return f"under memory_budget {budget:g}"
    return f"under memory_budget {budget} B ({_gib(int(budget))} GiB)"


def _kv_limit(dev: dict[str, Any], kv: dict[str, Any]) -> dict[str, Any] | None:
    """The KV-block minimum as a limit of an LM device under optimum-rbln's automatic search, else None."""
    on_lm = any(str(i.get("name", "")).startswith("lm.") for i in dev.get("items") or [])
    if not on_lm or kv.get("mode") != "auto" or "num_min_blocks" not in kv:
        return None
    low, high = kv.get("num_blocks_range") or [kv["num_blocks"], kv["num_blocks"]]
    minimum = kv["num_min_blocks"]
    return {
        "kind": "kv_blocks",
        "blocks_low": low,
        "blocks_high": high,
        "minimum": minimum,
        "some": low < minimum,
        "every": high < minimum,
    }


def _limit_text(c: dict[str, Any], kv: dict[str, Any]) -> str:
    if c["kind"] == "kv_blocks":
        rel = "<" if c["every"] else "vs"
        return f"KV blocks {_span(c['blocks_low'], c['blocks_high'])} {rel} minimum {c['minimum']} {_budget(kv)}"
    return f"{_LIMIT_NAMES[c['kind']]} {_span(c['need_low'], c['need_high'], _gib)} of {_gib(c['usable'])} GiB"


def decided_by(dev: dict[str, Any], kv: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one constraint that decides device ``dev``'s verdict, with its numbers and a short ``text``: the
    KV-block minimum (optimum-rbln's compile stops first), the card total or the fullest chiplet; for ``fits``
    the tightest of the two memory limits; an observed verdict or a compiler split when those decide."""
    kv = kv or {}
    verdict = dev.get("verdict") or "uncertain"
    source = dev.get("verdict_source") or ""
    if source.startswith("observed"):
        return {"constraint": "observed", "text": "as observed in the product document", "source": source}
    limits = []
    kv_limit = _kv_limit(dev, kv)
    if kv_limit is not None:
        limits.append(kv_limit)
    for c in sorted(constraints(dev), key=lambda c: c["kind"] != "device"):
        limits.append({**c, "some": c["margin_worst"] < 0, "every": c["margin_best"] < 0})
    if verdict == "fits":
        pick = min(limits[1:] if kv_limit else limits, key=lambda c: c["margin_worst"])
    else:
        pick = next((c for c in limits if c["every"]), None) if verdict == "does_not_fit" else None
        pick = pick or next((c for c in limits if c["some"]), None)
    if pick is None:  # uncertain although every limit holds: the compiler's own split decides
        return {
            "constraint": "split",
            "text": "a submodule split over several devices (the compiler decides the split)",
        }
    out = {k if k.startswith(("blocks", "min")) else f"{k}_bytes": v for k, v in pick.items() if k not in _NOT_OUT}
    return {"constraint": pick["kind"], **out, "text": _weights_alone(dev, pick) + _limit_text(pick, kv)}


def _weights_alone(dev: dict[str, Any], pick: dict[str, Any]) -> str:
    """'the LM weights alone (436.74 GiB) exceed the card's 140.00 GiB, so ' when that is why no KV block is left:
    the block count is the symptom, the weights are the cause."""
    weights = sum(int(i.get("bytes") or 0) for i in dev.get("items") or [] if i.get("name") == "lm.weights")
    usable = int(dev.get("usable_bytes") or 0)
    if pick["kind"] != "kv_blocks" or pick["blocks_high"] != 0 or not usable or weights <= usable:
        return ""
    return f"the LM weights alone ({_gib(weights)} GiB) exceed the card's {_gib(usable)} GiB, so "


def device_decided_by(dev: dict[str, Any], kv: dict[str, Any] | None = None) -> dict[str, Any]:
    """``dev['decided_by']`` as the planner stored it, or worked out now (a report from an older qvl)."""
    return dev.get("decided_by") or decided_by(dev, kv)


def deciding_devices(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The devices whose verdict is the plan's: every one that does not fit (or is uncertain); for a plan that
    fits, the one with the least worst-case margin on its deciding limit."""
    devices = report.get("devices") or []
    verdict = report.get("verdict") or "uncertain"
    deciding = [d for d in devices if d.get("verdict") == verdict] or devices
    if verdict != "fits" or len(deciding) < 2:
        return deciding
    kv = report.get("kv") or {}
    margins = [device_decided_by(d, kv).get("margin_worst_bytes") for d in deciding]
    if any(m is None for m in margins):
        return deciding
    return [min(zip(margins, range(len(deciding)), deciding, strict=True))[2]]


def headline(report: dict[str, Any]) -> str:
    """The one-line verdict with what decides it, e.g. ``does not fit: KV blocks 17 < minimum 33 under
    memory_budget 0.5`` or ``uncertain: device 0: fullest chiplet 22.43 .. 38.33 of 35.00 GiB`` (the device is
    named when there are several)."""
    devices = report.get("devices") or []
    verdict = report.get("verdict") or "uncertain"
    words = VERDICT_WORDS.get(verdict, verdict)
    deciding = deciding_devices(report)
    if not deciding:
        return words
    kv = report.get("kv") or {}
    texts = [device_decided_by(d, kv)["text"] for d in deciding]
    if len(devices) > 1 and len(deciding) == len(devices) and len(set(texts)) == 1:
        texts = [f"every device: {texts[0]}"]
    elif len(devices) > 1:
        texts = [f"device {d['device']}: {t}" for d, t in zip(deciding, texts, strict=True)]
    return f"{words}: " + "; ".join(texts)
