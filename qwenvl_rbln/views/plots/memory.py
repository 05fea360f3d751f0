"""`compile --dry-run --plot` and `load-check --plot`: which device, and which chiplet, fills up first.

From the memory report alone (``--json``'s ``memory``): per device one stacked bar (weights, KV cache,
workspaces, masks), each part with its low..high range as a whisker, the device's usable bytes as a line
coloured by its verdict, and every suggestion as a ghost bar beside it (its total, whisker to its high end).
Per chiplet: the planner's load of each chiplet at the estimate, the fullest with its low..high range, against
its share; load-check's exact read-out has every chiplet's allocation, drawn one bar each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qwenvl_rbln.views.plots.figure import VERDICT_COLOUR, draw, gib

CATEGORIES = ("weights", "KV cache", "workspaces", "masks", "other")
COLOURS = {
    "weights": "#0072B2",
    "KV cache": "#56B4E9",
    "workspaces": "#E69F00",
    "masks": "#CC79A7",
    "other": "#999999",
    "allocated": "#0072B2",
}


def category(name: str) -> str:
    """An item's category from its name (``lm.weights``, ``lm.kv_cache``, ``visual.workspace``, ...)."""
    if "mask" in name:
        return "masks"
    if "kv" in name:
        return "KV cache"
    if "workspace" in name:
        return "workspaces"
    if "weight" in name:
        return "weights"
    return "other"


def _verdict(d: dict[str, Any]) -> str | None:
    if d.get("verdict") in ("fits", "uncertain", "does_not_fit"):
        return d["verdict"]
    return {True: "fits", False: "does_not_fit"}.get(d.get("fits"))


def _parts(dev: dict[str, Any]) -> list[dict[str, Any]]:
    """Items summed by category, bottom first; the low/high of a part is the sum of its items' ranges."""
    parts: dict[str, dict[str, Any]] = {}
    for it in dev.get("items") or []:
        cat = category(it["name"])
        p = parts.setdefault(cat, {"category": cat, "bytes": 0, "low": 0, "high": 0, "items": []})
        p["bytes"] += it["bytes"]
        p["low"] += it.get("low_bytes", it["bytes"])
        p["high"] += it.get("high_bytes", it["bytes"])
        p["items"].append(it["name"])
    return [parts[c] for c in CATEGORIES if c in parts]


def _chiplet_bars(chip: dict[str, Any]) -> list[dict[str, Any]]:
    """One bar per chiplet at the estimate (the planner's ``loads_bytes``), the fullest one with its low..high range;
    only the fullest when a report carries no per-chiplet loads."""
    fullest = chip.get("fullest_bytes")
    rng = {"low": chip.get("fullest_low_bytes", fullest), "high": chip.get("fullest_high_bytes", fullest)}
    loads = chip.get("loads_bytes")
    if not loads:
        return [{"label": f"fullest of {chip.get('count')}", "bytes": fullest, **rng}]
    top = loads.index(max(loads))
    return [
        {"label": f"chiplet {i}", "bytes": b, **(rng if i == top else {"low": b, "high": b})}
        for i, b in enumerate(loads)
    ]


def _estimate_device(dev: dict[str, Any]) -> dict[str, Any]:
    chip = dev.get("chiplets") or None
    chiplets = None
    if chip:
        chiplets = {
            "usable": chip.get("usable_per_chiplet_bytes"),
            "bars": _chiplet_bars(chip),
            "fits": chip.get("fits"),
        }
    return {
        "device": dev["device"],
        "verdict": _verdict(dev),
        "usable": dev.get("usable_bytes"),
        "total": dev.get("total_bytes"),
        "total_low": dev.get("total_low_bytes", dev.get("total_bytes")),
        "total_high": dev.get("total_high_bytes", dev.get("total_bytes")),
        "parts": _parts(dev),
        "chiplets": chiplets,
    }


KEY_CATEGORY = {"Weight": "weights", "DramTensor": "KV cache", "Workspace": "workspaces"}


def _exact_parts(dev: dict[str, Any], graphs: dict[str, Any]) -> list[dict[str, Any]]:
    """A device's read-out split by allocation key (Weight, DramTensor = KV, Workspace, the rest), from the graphs
    placed on it alone; one "allocated" part when a graph spans devices or the keys do not add up to the total."""
    total = dev["total_bytes"]
    whole = [{"category": "allocated", "bytes": total, "low": total, "high": total, "items": dev.get("graphs", [])}]
    sums: dict[str, int] = {}
    for name in dev.get("graphs", []):
        g = graphs.get(name)
        if not g or not isinstance(g.get("device"), int):
            return whole
        for key, n in (g.get("by_key") or {}).items():
            if key == "DramTensor" and g.get("kv_shared"):
                continue  # the KV cache is one buffer shared by the LM graphs: counted once
            cat = KEY_CATEGORY.get(key, "other")
            sums[cat] = sums.get(cat, 0) + int(n)
    if sum(sums.values()) != total:
        return whole
    return [
        {"category": c, "bytes": sums[c], "low": sums[c], "high": sums[c], "items": []} for c in CATEGORIES if c in sums
    ]


def _exact_device(dev: dict[str, Any], graphs: dict[str, Any]) -> dict[str, Any]:
    total = dev["total_bytes"]
    chips = dev.get("per_chiplet_bytes") or []
    return {
        "device": dev["device"],
        "verdict": _verdict(dev),
        "usable": dev.get("usable_bytes"),
        "total": total,
        "total_low": total,
        "total_high": total,
        "parts": _exact_parts(dev, graphs),
        "chiplets": {
            "usable": dev.get("usable_per_chiplet_bytes"),
            "bars": [{"label": f"chiplet {i}", "bytes": b, "low": b, "high": b} for i, b in enumerate(chips)],
            "fits": dev.get("fits"),
        }
        if chips
        else None,
    }


def _suggestions(memory: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for s in memory.get("suggestions") or []:
        if not isinstance(s, dict) or not s.get("devices"):
            continue
        out.append(
            {
                "label": s.get("kind") or s.get("cli"),
                "cli": s.get("cli"),
                "verdict": _verdict(s),
                "devices": [
                    {
                        "device": d["device"],
                        "total": d.get("total_bytes"),
                        "total_high": d.get("total_high_bytes", d.get("total_bytes")),
                        "verdict": _verdict(d),
                    }
                    for d in s["devices"]
                ],
            }
        )
    return out


def memory_data(memory: dict[str, Any], *, title: str = "") -> dict[str, Any]:
    """What the picture draws, from a memory report alone: the planner's (dry run, load-check without rebel) or
    load-check's exact / emulated allocations (with the planner's estimate beside when it carries one)."""
    source = memory.get("source", "estimate")
    exact = source in ("exact", "emulated")
    graphs = memory.get("graphs") or {}
    devices = [_exact_device(d, graphs) if exact else _estimate_device(d) for d in memory.get("devices") or []]
    estimate = memory.get("estimate") if exact else None
    return {
        "title": title,
        "source": source,
        "npu": memory.get("npu"),
        "verdict": _verdict(memory),
        "devices": devices,
        "estimate": memory_data(estimate) if isinstance(estimate, dict) and estimate.get("devices") else None,
        "suggestions": _suggestions(memory),
    }


def _stack(ax: Any, x: float, parts: list[dict[str, Any]], width: float) -> None:
    base = 0.0
    for p in parts:
        h = gib(p["bytes"])
        ax.bar(x, h, bottom=base, width=width, color=COLOURS[p["category"]], edgecolor="white", linewidth=0.5)
        if p["low"] != p["bytes"] or p["high"] != p["bytes"]:
            ax.errorbar(
                x,
                base + h,
                yerr=[[h - gib(p["low"])], [gib(p["high"]) - h]],
                color="#333333",
                capsize=3,
                linewidth=1,
            )
        base += h


def _device_groups(data: dict[str, Any]) -> list[int]:
    ids = {d["device"] for d in data["devices"]}
    for s in data["suggestions"]:
        ids |= {d["device"] for d in s["devices"]}
    return sorted(ids)


def _devices_axis(ax: Any, data: dict[str, Any]) -> None:
    from matplotlib.patches import Patch

    by_id = {d["device"]: d for d in data["devices"]}
    est = {d["device"]: d for d in (data["estimate"] or {}).get("devices", [])}
    x, ticks, labels = 0.0, [], []
    for dev_id in _device_groups(data):
        start = x
        dev = by_id.get(dev_id)
        if dev is not None:
            _stack(ax, x, dev["parts"], 0.8)
            ax.text(x, gib(dev["total_high"]), f"{gib(dev['total']):.1f}", ha="center", va="bottom", fontsize=7)
            ticks.append(x)
            labels.append(f"dev {dev_id}\n{data['source'] if data['source'] != 'estimate' else 'now'}")
            x += 1
        if dev_id in est:
            e = est[dev_id]
            ax.bar(x, gib(e["total"]), width=0.8, color="none", edgecolor="#555555", linestyle=":", linewidth=1.2)
            ticks.append(x)
            labels.append("planner\nestimate")
            x += 1
        for s in data["suggestions"]:
            for sd in s["devices"]:
                if sd["device"] != dev_id:
                    continue
                colour = VERDICT_COLOUR[sd["verdict"]]
                ax.bar(x, gib(sd["total"]), width=0.8, color=colour, alpha=0.18, edgecolor=colour, linestyle="--")
                ax.errorbar(x, gib(sd["total"]), yerr=[[0], [gib(sd["total_high"]) - gib(sd["total"])]], color=colour)
                ticks.append(x)
                labels.append(f"dev {dev_id}\n{s['label']}")
                x += 1
        usable = (dev or {}).get("usable") or next((d["usable"] for d in data["devices"] if d.get("usable")), None)
        if usable:
            colour = VERDICT_COLOUR[(dev or {}).get("verdict")] if dev else "#777777"
            ax.hlines(gib(usable), start - 0.45, x - 0.55, colors=colour, linewidth=2)
            ax.text(x - 0.55, gib(usable), f" usable {gib(usable):.0f} GiB", color=colour, fontsize=7, va="bottom")
        x += 0.7
    ax.set_xticks(ticks, labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("GiB")
    cats = sorted({p["category"] for d in data["devices"] for p in d["parts"]}, key=list(COLOURS).index)
    handles = [Patch(color=COLOURS[c], label=c) for c in cats]
    if data["suggestions"]:
        handles.append(Patch(facecolor="#cccccc", edgecolor="#555555", linestyle="--", label="suggestion (ghost)"))
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(handles))
    ax.set_title("per device: parts with low..high whiskers; usable line coloured by verdict")


def _chiplets_axis(ax: Any, data: dict[str, Any]) -> None:
    x, ticks, labels = 0.0, [], []
    for dev in data["devices"]:
        chip = dev["chiplets"]
        if not chip:
            continue
        start = x
        for bar in chip["bars"]:
            h = gib(bar["bytes"])
            ax.bar(x, h, width=0.8, color="#56B4E9")
            if bar["low"] != bar["bytes"] or bar["high"] != bar["bytes"]:
                ax.errorbar(x, h, yerr=[[h - gib(bar["low"])], [gib(bar["high"]) - h]], color="#333333", capsize=3)
            ax.text(x, gib(bar["high"]), f"{h:.1f}", ha="center", va="bottom", fontsize=7)
            ticks.append(x)
            labels.append(f"dev {dev['device']}\n{bar['label']}")
            x += 1
        if chip.get("usable"):
            verdict = {True: "fits", False: "does_not_fit"}.get(chip.get("fits"))
            ax.hlines(gib(chip["usable"]), start - 0.45, x - 0.55, colors=VERDICT_COLOUR[verdict], linewidth=2)
        x += 0.7
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_ylabel("GiB")
    ax.set_title("per chiplet (share of usable)")


def _has_chiplets(data: dict[str, Any]) -> bool:
    return any(d["chiplets"] for d in data["devices"])


def draw_memory(memory: dict[str, Any], path: Path, *, title: str = "") -> dict[str, Any]:
    """Draw the memory picture into ``path`` (.png / .svg); returns what was plotted."""
    data = memory_data(memory, title=title)

    def build(figure_cls: Any) -> Any:
        chips = _has_chiplets(data)
        fig = figure_cls(figsize=(11 if chips else 8, 5.5), layout="constrained")
        grid = fig.add_gridspec(1, 2 if chips else 1, width_ratios=[3, 1] if chips else [1])
        _devices_axis(fig.add_subplot(grid[0, 0]), data)
        if chips:
            _chiplets_axis(fig.add_subplot(grid[0, 1]), data)
        verdict = (data["verdict"] or "no verdict").replace("_", " ")
        head = f"memory on {data['npu'] or 'the NPU'} ({data['source']}): {verdict}"
        fig.suptitle(f"{title} - {head}" if title else head, fontsize=10)
        return fig

    draw(path, build)
    return data
