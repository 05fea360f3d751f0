"""`qvl tune --plot`: the tuning trade, candidates on throughput against time to first token.

The input is a small documented structure (``TUNE_SHAPE``) so the picture does not depend on how the tune report
spells its other fields: a caller maps its candidates into it. The chosen candidate is a star; the rejected
candidates nearest to it carry their reason, so a reviewer sees what was given up and why.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.views.plots.figure import VERDICT_COLOUR, draw

TUNE_SHAPE = """\
{"throughput_unit": "tokens/s",            # the y axis' unit (optional)
 "objective": "throughput",                # throughput | latency: what the y axis shows (optional)
 "candidates": [{"label": "batch 4, buckets [1024, 16384]",
                 "throughput": 812.0,      # higher is better
                 "ttft_s": 0.42,           # time to first token in seconds, lower is better
                 "latency_s": 1.9,         # seconds per request, lower is better (needed for objective latency)
                 "verdict": "fits",        # fits | uncertain | does_not_fit (memory), or null
                 "meets_needs": true,      # false: it fits but gives up a need (optional, default true)
                 "chosen": false,          # exactly one candidate is chosen
                 "rejected": "TTFT above the 0.5 s target"}]}   # why not chosen (null for the chosen one)"""

NEIGHBOURS = 5  # rejected candidates annotated with their reason: the nearest to the chosen one


def tune_data(tune: dict[str, Any]) -> dict[str, Any]:
    """The candidates, checked against ``TUNE_SHAPE``, with the chosen one and its nearest rejected neighbours."""
    cands = tune.get("candidates")
    if not isinstance(cands, list) or not cands:
        raise InputError("tune plot: no candidates to draw", f"pass the structure documented as:\n{TUNE_SHAPE}")
    latency = tune.get("objective") == "latency"
    rows = []
    for i, c in enumerate(cands):
        try:
            rows.append(
                {
                    "label": str(c.get("label", f"candidate {i}")),
                    "throughput": float(c["throughput"]),
                    "ttft_s": float(c["ttft_s"]),
                    "latency_s": float(c["latency_s"]) if latency else c.get("latency_s"),
                    "verdict": c.get("verdict"),
                    "meets_needs": bool(c.get("meets_needs", True)),
                    "chosen": bool(c.get("chosen")),
                    "rejected": c.get("rejected"),
                }
            )
        except (KeyError, TypeError, ValueError):
            raise InputError(
                f"tune plot: candidate {i} lacks a numeric throughput or ttft_s", f"expected:\n{TUNE_SHAPE}"
            ) from None
    chosen = [r for r in rows if r["chosen"]]
    if len(chosen) > 1:
        raise InputError(f"tune plot: {len(chosen)} candidates are marked chosen", "mark exactly one")
    pick = chosen[0] if chosen else None
    for r in rows:  # the y axis is what the objective optimises
        r["y"] = r["latency_s"] if latency else r["throughput"]
    tmax = max(r["y"] for r in rows) or 1.0
    fmax = max(r["ttft_s"] for r in rows) or 1.0

    def dist(r: dict[str, Any]) -> float:  # on axes scaled to [0, 1]: what the eye calls near
        assert pick is not None
        return math.hypot((r["y"] - pick["y"]) / tmax, (r["ttft_s"] - pick["ttft_s"]) / fmax)

    rejected = [r for r in rows if not r["chosen"] and r["rejected"]]
    near = sorted(rejected, key=dist)[:NEIGHBOURS] if pick else rejected[:NEIGHBOURS]
    return {
        "throughput_unit": tune.get("throughput_unit") or "tokens/s",
        "objective": "latency" if latency else "throughput",
        "candidates": rows,
        "chosen": pick,
        "annotated": [r["label"] for r in near],
    }


def from_tune_report(doc: dict[str, Any]) -> dict[str, Any]:
    """``qvl tune``'s --json document as ``TUNE_SHAPE``: its ranked candidates (#1 chosen) and the costed rejected
    neighbours, or, when nothing meets the needs (exit 4), the nearest configurations and what each gives up. Only
    rows with an estimate are drawn: a configuration that does not fit has no cost."""
    rows = []
    if doc.get("best"):
        for i, r in enumerate(doc["candidates"]):
            where = ", ViT on device 1" if r["npus"] == 2 else ""
            reason = None if i == 0 else f"ranked #{i + 1} by {doc['needs']['objective']}"
            rows.append((f"#{i + 1} batch {r['batch_size']}, {r['max_seq_len']}{where}", r, reason))
        rows += [(r["change"], r, _short(r["why"])) for r in doc.get("neighbours") or []]
    else:
        rows += [(f"nearest {i + 1}", r, "gives up " + "; ".join(r["gives_up"])) for i, r in enumerate(doc["nearest"])]
    cands = [
        {
            "label": label + _source_tag(r),
            "throughput": (r["estimate"].get("lighter_load") or r["estimate"])["output_tokens_per_s"],  # what ranks
            "ttft_s": r["estimate"]["ttft_s"],
            "latency_s": r["estimate"]["latency_s"],
            "verdict": r["verdict"],
            # a nearest configuration gives up a need; a neighbour may (batch below --min-batch, a short context)
            "meets_needs": bool(doc.get("best")) and r.get("meets_needs", True),
            "chosen": reason is None,
            "rejected": reason,
        }
        for label, r, reason in rows
        if r.get("estimate")
    ]
    cost = doc["cost_model"]
    label = cost["label"] + (", some graphs measured (qvl profile)" if cost.get("measured_graphs") else "")
    if cost.get("measured_graphs") and cost.get("rows_on_estimates"):
        label += f"; {cost['rows_on_estimates']} row(s) partly on bounds"
    light = (cost.get("load") or {}).get("lighter_load")
    label += f", at {light} requests in flight" if light else ""
    return {"throughput_unit": f"output tokens/s, {label}", "objective": doc["needs"]["objective"], "candidates": cands}


def _source_tag(row: dict[str, Any]) -> str:
    """ " [measured]" / " [measured/fitted]" / " [mixed]" after a point's label; nothing for a roofline bound (the axis
    says so for every point)."""
    label = (row.get("timing") or {}).get("label", "roofline bound")
    if label == "roofline bound":
        return ""
    return f" [{label.split(':')[0].split(';')[0]}]"


def _short(why: str) -> str:
    """A neighbour's reason up to its first aside ("slower by 2.7 %", "no faster"): the picture's label; the whole
    reason stays in the report."""
    return why.split(" (")[0].split(";")[0]


LINE = 0.032  # one 7-point label line, in axes fraction of the figure's plot height
SAME = 1e-9  # relative: neighbours at the chosen point (often: a change that costs nothing in the estimate)


def _at(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(abs(a[k] - b[k]) <= SAME * max(abs(a[k]), abs(b[k]), 1.0) for k in ("ttft_s", "y"))


def _blocks(data: dict[str, Any]) -> list[tuple[dict[str, Any] | None, list[str], dict[str, Any]]]:
    """The labels as (point for a leader line or None, lines, style) blocks for the column beside the plot: the
    chosen one (one line to the star), the neighbours at its very point (no line: it would end under the star),
    then one block per other point (its neighbours together, one leader line)."""
    pick = data["chosen"]
    named = [next(c for c in data["candidates"] if c["label"] == label) for label in data["annotated"]]
    grey = {"color": "#444444"}
    blocks: list[tuple[dict[str, Any] | None, list[str], dict[str, Any]]] = []
    if pick is not None:
        unit = data["throughput_unit"]
        head = [f"chosen: {pick['label']}", f"{pick['throughput']:.1f} {unit}, TTFT {pick['ttft_s']:.3f} s"]
        if data["objective"] == "latency":
            head.append(f"latency {pick['latency_s']:.3f} s per request (the objective)")
        blocks.append((pick, head, {"fontweight": "bold"}))
        same = [r for r in named if _at(r, pick)]
        if same:
            blocks.append(
                (
                    None,
                    ["at the same estimate as the chosen one:"] + [f"{r['label']}: {r['rejected']}" for r in same],
                    grey,
                )
            )
        named = [r for r in named if not _at(r, pick)]
    while named:
        first = named[0]
        group = [r for r in named if _at(r, first)]
        named = [r for r in named if not _at(r, first)]
        blocks.append((first, [_wrap(f"{r['label']}: {r['rejected']}") for r in group], grey))
    # top to bottom as their points stand, so the leader lines do not cross (the chosen one's block stays
    # with the block of the neighbours at its point)
    return sorted(blocks, key=lambda b: -(b[0] or pick or {"y": 0})["y"])


def _wrap(text: str, width: int = 68) -> str:
    """A long reason on more lines, indented: the column beside the plot stays narrow."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width, subsequent_indent="    ")) or text


def _legend(data: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """(verdict, meets the needs, label) for each kind of point drawn: "fits" alone is never said of a point
    that gives up a need."""
    kinds = sorted({(str(r["verdict"]), r["meets_needs"]) for r in data["candidates"]})
    out = []
    for verdict, meets in kinds:
        if verdict != "fits":
            out.append((verdict, meets, verdict))
        elif meets:
            out.append((verdict, meets, "fits, meets the needs"))
        else:
            out.append((verdict, meets, "fits in memory, gives up a need (hollow)"))
    return out


def draw_tune(tune: dict[str, Any], path: Path) -> dict[str, Any]:
    """Draw the tune picture into ``path`` (.png / .svg); returns what was plotted. The labels stand in a column
    beside the plot with a leader line to their point, so no line meets the star or crosses a label; both axes
    start at 0, so a 3 % gap looks like one."""
    data = tune_data(tune)
    latency = data["objective"] == "latency"

    def build(figure_cls: Any) -> Any:
        from matplotlib.lines import Line2D

        fig = figure_cls(figsize=(13, 6), layout="constrained")
        ax = fig.add_subplot()
        for r in data["candidates"]:
            colour = VERDICT_COLOUR.get(r["verdict"], VERDICT_COLOUR[None])
            face = colour if r["meets_needs"] else "none"
            if r["chosen"]:
                ax.scatter(r["ttft_s"], r["y"], marker="*", s=260, color=colour, edgecolor="black", zorder=3)
            else:
                ax.scatter(r["ttft_s"], r["y"], s=36, facecolor=face, edgecolor=colour, alpha=0.8, zorder=2)
        top = 1.0
        for point, lines, style in _blocks(data):
            arrow = (
                None if point is None else {"arrowstyle": "-", "color": "#999999", "linewidth": 0.6, "relpos": (0, 0.5)}
            )
            anchor = point or data["chosen"]
            xy = (anchor["ttft_s"], anchor["y"])
            ax.annotate("\n".join(lines), xy, xytext=(1.02, top), textcoords="axes fraction", va="top", fontsize=7,
                        arrowprops=arrow, annotation_clip=False, **style)  # fmt: skip
            top -= LINE * sum(1 + line.count("\n") for line in lines) + LINE / 2
        ax.set_xlim(0, max(r["ttft_s"] for r in data["candidates"]) * 1.1 or 1.0)
        ax.set_ylim(0, max(r["y"] for r in data["candidates"]) * 1.1 or 1.0)
        ax.set_xlabel("time to first token (s), lower is better")
        if latency:
            ax.set_ylabel("latency per request (s), lower is better (the objective)")
        else:
            ax.set_ylabel(f"throughput ({data['throughput_unit']}), higher is better")
        handles = [
            Line2D([], [], marker="o", linestyle="", markerfacecolor=VERDICT_COLOUR.get(v, VERDICT_COLOUR[None])
                   if meets else "none", markeredgecolor=VERDICT_COLOUR.get(v, VERDICT_COLOUR[None]), label=label)
            for v, meets, label in _legend(data)
        ]  # fmt: skip
        n = len(data["candidates"])
        what = "latency" if latency else "throughput"
        if data["chosen"] is not None:
            handles.append(Line2D([], [], marker="*", linestyle="", color="black", markersize=12, label="chosen"))
            title = f"tune: {n} candidates, {what} against TTFT"
        else:  # exit 4: nothing meets the needs, the nearest configurations and what each gives up
            title = f"tune: nothing meets the needs; the {n} nearest configurations, {what} against TTFT"
        ax.legend(handles=handles, fontsize=8, loc="lower right" if latency else "lower left")
        fig.suptitle(title, fontsize=10)
        return fig

    draw(path, build)
    return data
