"""`compile --dry-run --plot` and `load-check --plot`: which device, and which chiplet, fills up first.

From the memory report alone (``--json``'s ``memory``): per device one stacked bar (weights, KV cache,
workspaces, masks), each part with its low..high range as a whisker, the device's usable bytes as a line
coloured by its verdict, and every suggestion as a ghost bar beside it (its total, whisker to its high end).
Per chiplet: the planner's load of each chiplet at the estimate, the fullest with its low..high range, against
its share; load-check's exact read-out has every chiplet's allocation, drawn one bar each. Chiplets are labelled
``c0``.. under a device label, so two cards' eight bars stay legible.

The title names the ``--set`` overrides the report is of (a preset's name alone would claim the preset's verdict).
Emulated sizes (qvl's CPU emulator, tiny models) are drawn in the unit that fits them (MiB, KiB), with the NPU's
usable bytes named, not drawn, when they would flatten the bars to nothing, and the title says they are emulated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qwenvl_rbln.views.plots.figure import VERDICT_COLOUR, GiB, draw

UNITS = (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10))
OFF_SCALE = 4  # a usable line this many times above the tallest bar is named, not drawn

CATEGORIES = ("weights", "KV cache", "workspaces", "masks", "io buffers", "other")
COLOURS = {
    "weights": "#0072B2",
    "KV cache": "#56B4E9",
    "workspaces": "#E69F00",
    "masks": "#CC79A7",
    "io buffers": "#F0E442",
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


KEY_CATEGORY = {"Weight": "weights", "DramTensor": "KV cache", "Workspace": "workspaces", "IOBuffer": "io buffers"}


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


def memory_data(memory: dict[str, Any], *, title: str = "", sets: list[str] | None = None) -> dict[str, Any]:
    """What the picture draws, from a memory report alone: the planner's (dry run, load-check without rebel) or
    load-check's exact / emulated allocations (with the planner's estimate beside when it carries one)."""
    source = memory.get("source", "estimate")
    exact = source in ("exact", "emulated")
    graphs = memory.get("graphs") or {}
    devices = [_exact_device(d, graphs) if exact else _estimate_device(d) for d in memory.get("devices") or []]
    estimate = memory.get("estimate") if exact else None
    return {
        "title": title,
        "sets": list(sets or []),
        "source": source,
        "npu": memory.get("npu"),
        "verdict": _verdict(memory),
        "devices": devices,
        "estimate": memory_data(estimate) if isinstance(estimate, dict) and estimate.get("devices") else None,
        "suggestions": _suggestions(memory),
    }


def _tallest(data: dict[str, Any]) -> int:
    """The tallest bar or whisker of the picture, in bytes (the usable lines left out)."""
    tops = [d["total_high"] or 0 for d in data["devices"]]
    tops += [b["high"] or 0 for d in data["devices"] if d["chiplets"] for b in d["chiplets"]["bars"]]
    tops += [d["total_high"] or 0 for d in (data["estimate"] or {}).get("devices", [])]
    tops += [d["total_high"] or 0 for s in data["suggestions"] for d in s["devices"]]
    return max(tops, default=0)


def scale(data: dict[str, Any]) -> tuple[str, int]:
    """(unit, bytes per unit): GiB for NPU-sized reports, MiB or KiB for the emulator's tiny graphs."""
    tallest = _tallest(data)
    return next(((name, size) for name, size in UNITS if tallest >= size), UNITS[-1])


def _shown(data: dict[str, Any], usable: int | None) -> bool:
    """Whether a usable line is drawn: always for the planner's estimate; for a read-out only when it does not
    flatten the bars (the emulator's megabytes against a 140 GiB card)."""
    if not usable:
        return False
    return data["source"] == "estimate" or usable <= OFF_SCALE * max(_tallest(data), 1)


class Unit:
    """Bytes in the picture's unit: ``unit(n)`` a number on the axis, ``unit.name`` its label."""

    def __init__(self, name: str, size: int):
        self.name, self.size = name, size

    def __call__(self, n: float | int | None) -> float:
        return 0.0 if n is None else n / self.size


def _stack(ax: Any, x: float, parts: list[dict[str, Any]], width: float, u: Unit) -> None:
    base = 0.0
    for p in parts:
        h = u(p["bytes"])
        ax.bar(x, h, bottom=base, width=width, color=COLOURS[p["category"]], edgecolor="white", linewidth=0.5)
        if p["low"] != p["bytes"] or p["high"] != p["bytes"]:
            ax.errorbar(
                x,
                base + h,
                yerr=[[h - u(p["low"])], [u(p["high"]) - h]],
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


def _usable_line(
    ax: Any,
    data: dict[str, Any],
    usable: int | None,
    span: tuple[float, float],
    colour: str,
    u: Unit,
    named: set,
    text: bool = True,
) -> None:
    """The usable bytes as a line over ``span``, or named in words (once per axis: ``named``) when the line would
    flatten the bars."""
    if not usable:
        return
    if _shown(data, usable):
        ax.hlines(u(usable), span[0], span[1], colors=colour, linewidth=2)
        if text:  # the chiplet axis names it once, after its last group: no label runs into the next group
            ax.text(span[1], u(usable), f" usable {u(usable):.0f} {u.name}", color=colour, fontsize=7, va="bottom")
    else:
        named.add(usable)


def _named_title(ax: Any, title: str, named: set, what: str) -> None:
    """The axis title, with the usable bytes no line was drawn for (``named``) in words under it."""
    if named:
        title += f"\nusable {max(named) / GiB:.0f} GiB {what} (not drawn)"
    ax.set_title(title)


def _devices_axis(ax: Any, data: dict[str, Any], u: Unit) -> None:
    from matplotlib.patches import Patch

    by_id = {d["device"]: d for d in data["devices"]}
    est = {d["device"]: d for d in (data["estimate"] or {}).get("devices", [])}
    x, ticks, labels, named = 0.0, [], [], set()
    for dev_id in _device_groups(data):
        start = x
        dev = by_id.get(dev_id)
        if dev is not None:
            _stack(ax, x, dev["parts"], 0.8, u)
            ax.text(x, u(dev["total_high"]), f"{u(dev['total']):.1f}", ha="center", va="bottom", fontsize=7)
            ticks.append(x)
            labels.append(f"dev {dev_id}\n{data['source'] if data['source'] != 'estimate' else 'now'}")
            x += 1
        if dev_id in est:
            e = est[dev_id]
            ax.bar(x, u(e["total"]), width=0.8, color="none", edgecolor="#555555", linestyle=":", linewidth=1.2)
            ticks.append(x)
            labels.append("planner\nestimate")
            x += 1
        for s in data["suggestions"]:
            for sd in s["devices"]:
                if sd["device"] != dev_id:
                    continue
                colour = VERDICT_COLOUR[sd["verdict"]]
                ax.bar(x, u(sd["total"]), width=0.8, color=colour, alpha=0.18, edgecolor=colour, linestyle="--")
                ax.errorbar(x, u(sd["total"]), yerr=[[0], [u(sd["total_high"]) - u(sd["total"])]], color=colour)
                ticks.append(x)
                labels.append(f"dev {dev_id}\n{s['label']}")
                x += 1
        usable = (dev or {}).get("usable") or next((d["usable"] for d in data["devices"] if d.get("usable")), None)
        colour = VERDICT_COLOUR[(dev or {}).get("verdict")] if dev else "#777777"
        _usable_line(ax, data, usable, (start - 0.45, x - 0.55), colour, u, named)
        x += 0.7
    ax.set_xticks(ticks, labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel(u.name)
    cats = sorted({p["category"] for d in data["devices"] for p in d["parts"]}, key=list(COLOURS).index)
    handles = [Patch(color=COLOURS[c], label=c) for c in cats]
    if data["suggestions"]:
        handles.append(Patch(facecolor="#cccccc", edgecolor="#555555", linestyle="--", label="suggestion (ghost)"))
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(handles))
    _named_title(
        ax,
        "per device: parts with low..high whiskers; usable line coloured by verdict",
        named,
        "per device: far above these bars",
    )


def _chiplets_axis(ax: Any, data: dict[str, Any], u: Unit) -> None:
    """One bar per chiplet, ticks ``c0``.. and each device's name once under its group."""
    x, ticks, labels, named = 0.0, [], [], set()
    drawn = [dev for dev in data["devices"] if dev["chiplets"]]
    for dev in drawn:
        chip = dev["chiplets"]
        start = x
        for bar in chip["bars"]:
            h = u(bar["bytes"])
            ax.bar(x, h, width=0.8, color="#56B4E9")
            if bar["low"] != bar["bytes"] or bar["high"] != bar["bytes"]:
                ax.errorbar(x, h, yerr=[[h - u(bar["low"])], [u(bar["high"]) - h]], color="#333333", capsize=3)
            ax.text(x, u(bar["high"]), f"{h:.1f}", ha="center", va="bottom", fontsize=6)
            ticks.append(x)
            labels.append(bar["label"].replace("chiplet ", "c"))
            x += 1
        ax.text(
            (start + x - 1) / 2,
            -0.12,
            f"dev {dev['device']}",
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="top",
            fontsize=7,
        )
        if chip.get("usable"):
            verdict = {True: "fits", False: "does_not_fit"}.get(chip.get("fits"))
            colour, last = VERDICT_COLOUR[verdict], dev is drawn[-1]
            _usable_line(ax, data, chip["usable"], (start - 0.45, x - 0.55), colour, u, named, text=last)
        x += 0.7
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_ylabel(u.name)
    _named_title(ax, "per chiplet (share of usable)", named, "each")


def _has_chiplets(data: dict[str, Any]) -> bool:
    return any(d["chiplets"] for d in data["devices"])


def title_of(data: dict[str, Any]) -> str:
    """``NAME --set k=v ...: memory on NPU (source): verdict``; emulated sizes say what they are."""
    verdict = (data["verdict"] or "no verdict").replace("_", " ")
    source = data["source"]
    if source == "emulated":
        source = "emulated: tensor sizes on qvl's CPU emulator, not NPU figures"
    head = f"memory on {data['npu'] or 'the NPU'} ({source}): {verdict}"
    name = " ".join([data["title"], *(f"--set {x}" for x in data["sets"])]).strip()
    return f"{name} - {head}" if name else head


def memory_figure(data: dict[str, Any], figure_cls: Any) -> Any:
    """The figure of ``memory_data``'s result (``draw_memory`` saves it; tests read its texts and limits)."""
    u = Unit(*scale(data))
    chips = _has_chiplets(data)
    bars = sum(len(d["chiplets"]["bars"]) for d in data["devices"] if d["chiplets"])
    fig = figure_cls(figsize=(11 + max(0, bars - 4) * 0.45 if chips else 8, 5.5), layout="constrained")
    ratios = [3, max(1.0, bars / 4)] if chips else [1]
    grid = fig.add_gridspec(1, 2 if chips else 1, width_ratios=ratios)
    _devices_axis(fig.add_subplot(grid[0, 0]), data, u)
    if chips:
        _chiplets_axis(fig.add_subplot(grid[0, 1]), data, u)
    fig.suptitle(title_of(data), fontsize=10)
    return fig


def draw_memory(
    memory: dict[str, Any], path: Path, *, title: str = "", sets: list[str] | None = None
) -> dict[str, Any]:
    """Draw the memory picture into ``path`` (.png / .svg); returns what was plotted. ``sets``: the ``--set``
    overrides the report is of, named in the title."""
    data = memory_data(memory, title=title, sets=sets)
    draw(path, lambda figure_cls: memory_figure(data, figure_cls))
    return data
