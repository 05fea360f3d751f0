"""`qvl bucket-plan --plot`: where the workload's per-segment patch counts fall against the ViT buckets.

Three panels, all from the bucket-plan report (``--json``'s ``items``, ``summary`` and ``optimized``):

- the distribution of per-segment patch counts (an image, or one video temporal patch, weighted by count x ViT
  calls), the bucket edges drawn, and between each bucket's largest segment and its edge the padding every call
  in that bucket pays at least (shaded); the optimised edges dashed when ``--optimize`` was given;
- per bucket: useful patches against padding patches over all its calls (the preset's list, and the optimised
  one beside it);
- per bucket: ViT calls one-per-segment against packed.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

from qwenvl_rbln.views.plots.figure import draw

# A bucket label's width as a share of the log x-axis (" 16384" at 8 pt on the ~7 in wide top panel, with room):
# labels of one list closer than this go on separate lines, so "3584" and "4096" never run into "35844096".
LABEL_SHARE = 0.075
TITLE_WIDTH = 130  # characters per title line at 10 pt across the 11 in figure
LEGEND_WIDTH = 30  # characters per legend line: the legend sits right of the panel and must stay in the figure
OWN_DRY_RUN = {
    "does_not_fit": "does not fit",
    "uncertain": "uncertain to fit",
    "invalid": "refused by the planner",
}


def _segments(items: list[dict[str, Any]]) -> dict[int, int]:
    """patches -> segments (count x ViT calls) over the planned items."""
    out: dict[int, int] = {}
    for it in items:
        if it.get("patches") is None:
            continue
        out[it["patches"]] = out.get(it["patches"], 0) + it["count"] * it["vit_calls"]
    return dict(sorted(out.items()))


def _land(patches: int, buckets: list[int]) -> int | None:
    return next((b for b in sorted(buckets) if b >= patches), None)


def _rows(landed: list[tuple[int, int, int | None, int | None]], buckets: list[int]) -> list[dict[str, Any]]:
    """Per bucket, from (patches, segments, bucket, packed calls) of each item: calls one per segment and packed,
    useful patches, padding patches either way (a call executes its whole bucket), and the largest segment in it."""
    rows = {
        b: {"bucket": b, "calls": 0, "packed_calls": 0, "useful_patches": 0, "padding_patches": 0, "largest": None}
        for b in buckets
    }
    packing = all(packed is not None for *_, packed in landed)
    for p, n, b, packed in landed:
        if b not in rows:
            continue
        r = rows[b]
        r["calls"] += n
        r["packed_calls"] += packed or 0
        r["useful_patches"] += n * p
        r["padding_patches"] += n * (b - p)
        r["largest"] = p if r["largest"] is None else max(r["largest"], p)
    for r in rows.values():
        total = r["useful_patches"] + r["padding_patches"]
        r["padding_pct"] = round(100.0 * r["padding_patches"] / total, 2) if total else None
        if not packing:
            r["packed_calls"] = r["packed_padding_patches"] = r["packed_padding_pct"] = None
            continue
        executed = r["packed_calls"] * r["bucket"]
        r["packed_padding_patches"] = executed - r["useful_patches"]
        r["packed_padding_pct"] = round(100.0 * r["packed_padding_patches"] / executed, 2) if executed else None
    return [rows[b] for b in buckets]


def _optimised_landing(items: list[dict[str, Any]], buckets: list[int], packing: bool) -> list[tuple]:
    """Each item under the optimised list: its bucket and, with packing, its packed calls as the optimiser
    counts them (``packing.uniform_cost``: identical segments of one request share calls in their own bucket)."""
    from qwenvl_rbln.vision.packing import uniform_cost

    out = []
    for it in items:
        p, n = it["patches"], it["vit_calls"]
        packed = None
        if packing:
            res = uniform_cost(p, n, sorted(buckets), _no_cost)
            packed = None if res is None else it["count"] * res[0]
        out.append((p, it["count"] * n, _land(p, buckets), packed if packing else None))
    return out


def _no_cost(bucket: int) -> int:
    return 0


def bucket_plan_data(report: dict[str, Any]) -> dict[str, Any]:
    """What the picture draws, from the bucket-plan report alone (the tests compare it with the report)."""
    summary = report["summary"]
    items = [it for it in report.get("items") or [] if it.get("patches") is not None]
    segments = _segments(items)
    packing = "packed" in summary
    preset = list(summary["vit_buckets"])
    # the preset's list: each item's own bucket and packed calls, as the report planned them
    own = [
        (
            it["patches"],
            it["count"] * it["vit_calls"],
            it["bucket"],
            it["count"] * it["vit_calls_packed"] if packing and it.get("vit_calls_packed") is not None else None,
        )
        for it in items
    ]
    lists = [
        {
            "name": f"preset {summary['preset']}",
            "buckets": preset,
            "rows": _rows(own, preset),
            "executed_over_useful": summary.get("executed_over_useful"),
            "packed_executed_over_useful": (summary.get("packed") or {}).get("executed_over_useful"),
        }
    ]
    opt = report.get("optimized")
    if opt and opt.get("buckets"):
        buckets = list(opt["buckets"])
        verdict = (opt.get("memory") or {}).get("verdict", "fits")
        # the same word as the text report: a list whose own dry run does not fit is "not recommended as is"
        lists.append(
            {
                "name": f"optimised (K={opt.get('k', len(buckets))})",
                "recommended": verdict == "fits",
                "not_recommended": None if verdict == "fits" else OWN_DRY_RUN.get(verdict, verdict),
                "buckets": buckets,
                "rows": _rows(_optimised_landing(items, buckets, packing), buckets),
                "executed_over_useful": opt.get("executed_over_useful"),
                "packed_executed_over_useful": None,
                "cost": opt.get("cost"),
                "set": opt.get("set"),
            }
        )
    limits = _x_limits(segments, lists)
    return {
        "unit": summary.get("unit"),
        "packing": packing,
        "segments": [{"patches": p, "segments": n} for p, n in segments.items()],
        "lists": lists,
        "x_limits": limits,
        "edge_labels": _edge_labels(lists, *limits),
        "uncovered_calls": (summary.get("uncovered") or {}).get("calls", 0),
        "memory_verdict": (summary.get("memory") or {}).get("verdict"),
    }


def _x_limits(segments: dict[int, int], lists: list[dict[str, Any]]) -> tuple[int, int]:
    """The top panel's log x range: half the smallest to twice the largest of the segments and bucket edges."""
    values = [*segments, *(b for lst in lists for b in lst["buckets"])]
    if not values:
        return 1, 2
    return max(1, min(values) // 2), max(values) * 2


def _edge_labels(lists: list[dict[str, Any]], lo: int, hi: int) -> list[dict[str, Any]]:
    """Each bucket edge's label and its line (0 at the top): within a list, a label goes on the first line where
    it clears the previous one by ``LABEL_SHARE`` of the log axis; each list starts below the lines of the last."""
    span = math.log(hi / lo) or 1.0
    out: list[dict[str, Any]] = []
    base = 0
    for i, lst in enumerate(lists):
        ends: list[float] = []  # per line: where its last label ends, as a share of the axis
        for b in sorted(lst["buckets"]):
            start = math.log(b / lo) / span
            line = next((n for n, end in enumerate(ends) if end <= start), len(ends))
            if line == len(ends):
                ends.append(0.0)
            ends[line] = start + LABEL_SHARE
            out.append({"list": i, "bucket": b, "line": base + line})
        base += max(len(ends), 1)
    return out


def _integer_ticks(axis: Any) -> None:
    """Counts of segments and calls are whole numbers: no tick at 0.25 of a segment."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _legend_label(text: str) -> str:
    return "\n".join(textwrap.wrap(text, LEGEND_WIDTH))


def _distribution(ax: Any, data: dict[str, Any]) -> None:
    import numpy as np

    values = [s["patches"] for s in data["segments"]]
    weights = [s["segments"] for s in data["segments"]]
    lo, hi = data["x_limits"]
    if values:
        ax.hist(values, bins=np.geomspace(lo, hi, 48), weights=weights, color="#56B4E9", edgecolor="#0072B2")
    ax.set_xscale("log", base=2)
    ax.set_xlim(lo, hi)  # the range the labels were laid out for
    _integer_ticks(ax.yaxis)
    ax.set_xlabel("patches per segment (image or video temporal patch; log scale)")
    ax.set_ylabel("segments (count x ViT calls)")
    top = ax.get_ylim()[1]
    spans = 0
    for i, lst in enumerate(data["lists"]):
        style = "-" if i == 0 else "--"
        colour = "#333333" if i == 0 else "#CC79A7"
        for r in lst["rows"]:
            b = r["bucket"]
            ax.axvline(b, color=colour, linestyle=style, linewidth=1.2)
            if i == 0 and r["largest"] is not None and r["largest"] < b:
                ax.axvspan(r["largest"], b, color="#D55E00", alpha=0.15, linewidth=0)
                spans += 1
    for label in data["edge_labels"]:  # above the bars and lines, on a white ground: never hidden by a bar
        colour = "#333333" if label["list"] == 0 else "#CC79A7"
        y = top * (0.97 - 0.085 * label["line"])
        box = {"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 0.5}
        ax.text(
            label["bucket"], y, f" {label['bucket']}", color=colour, fontsize=8, va="top", ha="left", zorder=5, bbox=box
        )
    _distribution_legend(ax, data, spans)
    ax.set_title("where the segments land")


def _distribution_legend(ax: Any, data: dict[str, Any], spans: int) -> None:
    """Only entries with something drawn; long names wrapped so the legend stays inside the figure."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = []
    if data["segments"]:
        handles.append(Patch(facecolor="#56B4E9", edgecolor="#0072B2", label="segments"))
    handles.append(Line2D([], [], color="#333333", label=_legend_label(f"{data['lists'][0]['name']} buckets")))
    if len(data["lists"]) > 1:
        opt = data["lists"][1]
        why = opt.get("not_recommended")
        name = _legend_label(f"{opt['name']} buckets" + (f", not recommended as is: {why}" if why else ""))
        handles.append(Line2D([], [], color="#CC79A7", linestyle="--", label=name))
    if spans:
        label = _legend_label("least padding per call: largest segment to its bucket")
        handles.append(Patch(color="#D55E00", alpha=0.3, label=label))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, framealpha=0.9)


def _padding(ax: Any, data: dict[str, Any]) -> None:
    x, labels = 0.0, []
    ticks = []
    key = "packed_padding" if data["packing"] else "padding"
    for i, lst in enumerate(data["lists"]):
        for r in lst["rows"]:
            useful = r["useful_patches"] / 1e6
            pad = r[f"{key}_patches"] / 1e6
            ax.bar(x, useful, color="#0072B2" if i == 0 else "#CC79A7", width=0.8)
            ax.bar(x, pad, bottom=useful, color="#D55E00", alpha=0.35, hatch="//", width=0.8)
            if r[f"{key}_pct"] is not None:
                ax.text(x, useful + pad, f"{r[f'{key}_pct']:.1f}%", ha="center", va="bottom", fontsize=7)
            ticks.append(x)
            labels.append(f"{r['bucket']}" + ("" if i == 0 else "*"))
            x += 1
        x += 0.6
    ax.set_xticks(ticks, labels, rotation=45, fontsize=7)
    ax.set_ylabel("patches over all calls (millions)")
    how = "packed calls" if data["packing"] else "one call per segment"
    ax.set_title(f"useful vs padding (hatched), {how}")
    if len(data["lists"]) > 1:
        ax.set_xlabel(
            "bucket (* optimised" + ("" if data["lists"][1]["recommended"] else ", not recommended as is") + ")"
        )


def _calls(ax: Any, data: dict[str, Any]) -> None:
    rows = data["lists"][0]["rows"]
    xs = list(range(len(rows)))
    ax.bar([x - 0.2 for x in xs], [r["calls"] for r in rows], width=0.4, color="#999999", label="one per segment")
    if any(r["packed_calls"] is not None for r in rows):
        ax.bar(
            [x + 0.2 for x in xs],
            [r["packed_calls"] or 0 for r in rows],
            width=0.4,
            color="#009E73",
            label="packed",
        )
    for x, r in zip(xs, rows, strict=True):
        ax.text(x - 0.2, r["calls"], str(r["calls"]), ha="center", va="bottom", fontsize=7)
        if r["packed_calls"] is not None:
            ax.text(x + 0.2, r["packed_calls"], str(r["packed_calls"]), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs, [str(r["bucket"]) for r in rows], fontsize=7)
    _integer_ticks(ax.yaxis)
    ax.set_ylabel("ViT calls")
    ax.set_title("ViT calls per bucket")
    ax.legend(fontsize=8)


def _title(data: dict[str, Any]) -> str:
    parts = []
    for lst in data["lists"]:
        eu = lst["executed_over_useful"]
        name = lst["name"] + (" (not recommended as is)" if lst.get("not_recommended") else "")
        text = f"{name}: executed/useful {eu:.2f}x" if eu is not None else name
        if lst.get("packed_executed_over_useful") is not None:
            text += f" (packed {lst['packed_executed_over_useful']:.2f}x)"
        parts.append(text)
    if data["uncovered_calls"]:
        n = data["uncovered_calls"]
        parts.append(f"{n} call{'' if n == 1 else 's'} above the largest bucket")
    return "\n".join(textwrap.wrap("ViT buckets - " + "; ".join(parts), TITLE_WIDTH))


def draw_bucket_plan(report: dict[str, Any], path: Path) -> dict[str, Any]:
    """Draw the bucket-plan picture into ``path`` (.png / .svg); returns what was plotted."""
    data = bucket_plan_data(report)
    draw(path, lambda figure_cls: bucket_plan_figure(data, figure_cls))
    return data


def bucket_plan_figure(data: dict[str, Any], figure_cls: Any) -> Any:
    """The figure of ``bucket_plan_data``: top, where the segments land; below, padding and ViT calls per bucket
    (a test lays it out and checks the labels, ticks and legend on it)."""
    fig = figure_cls(figsize=(11, 7.5), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[1.2, 1])
    _distribution(fig.add_subplot(grid[0, :]), data)
    _padding(fig.add_subplot(grid[1, 0]), data)
    _calls(fig.add_subplot(grid[1, 1]), data)
    fig.suptitle(_title(data), fontsize=10)
    return fig
