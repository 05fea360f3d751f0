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
 "candidates": [{"label": "batch 4, buckets [1024, 16384]",
                 "throughput": 812.0,      # higher is better
                 "ttft_s": 0.42,           # time to first token in seconds, lower is better
                 "verdict": "fits",        # fits | uncertain | does_not_fit (memory), or null
                 "chosen": false,          # exactly one candidate is chosen
                 "rejected": "TTFT above the 0.5 s target"}]}   # why not chosen (null for the chosen one)"""

NEIGHBOURS = 5  # rejected candidates annotated with their reason: the nearest to the chosen one


def tune_data(tune: dict[str, Any]) -> dict[str, Any]:
    """The candidates, checked against ``TUNE_SHAPE``, with the chosen one and its nearest rejected neighbours."""
    cands = tune.get("candidates")
    if not isinstance(cands, list) or not cands:
        raise InputError("tune plot: no candidates to draw", f"pass the structure documented as:\n{TUNE_SHAPE}")
    rows = []
    for i, c in enumerate(cands):
        try:
            rows.append(
                {
                    "label": str(c.get("label", f"candidate {i}")),
                    "throughput": float(c["throughput"]),
                    "ttft_s": float(c["ttft_s"]),
                    "verdict": c.get("verdict"),
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
    tmax = max(r["throughput"] for r in rows) or 1.0
    fmax = max(r["ttft_s"] for r in rows) or 1.0

    def dist(r: dict[str, Any]) -> float:  # on axes scaled to [0, 1]: what the eye calls near
        assert pick is not None
        return math.hypot((r["throughput"] - pick["throughput"]) / tmax, (r["ttft_s"] - pick["ttft_s"]) / fmax)

    rejected = [r for r in rows if not r["chosen"] and r["rejected"]]
    near = sorted(rejected, key=dist)[:NEIGHBOURS] if pick else rejected[:NEIGHBOURS]
    return {
        "throughput_unit": tune.get("throughput_unit") or "tokens/s",
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
            "label": label,
            "throughput": r["estimate"]["output_tokens_per_s"],
            "ttft_s": r["estimate"]["ttft_s"],
            "verdict": r["verdict"],
            "chosen": reason is None,
            "rejected": reason,
        }
        for label, r, reason in rows
        if r.get("estimate")
    ]
    cost = doc["cost_model"]
    label = cost["label"] + (", some graphs measured" if cost.get("measured_graphs") else "")
    return {"throughput_unit": f"output tokens/s, {label}", "candidates": cands}


def _short(why: str) -> str:
    """A neighbour's reason up to its first aside ("slower by 2.7 %", "no faster"): the picture's label; the whole
    reason stays in the report."""
    return why.split(" (")[0].split(";")[0]


def draw_tune(tune: dict[str, Any], path: Path) -> dict[str, Any]:
    """Draw the tune picture into ``path`` (.png / .svg); returns what was plotted."""
    data = tune_data(tune)

    def build(figure_cls: Any) -> Any:
        from matplotlib.lines import Line2D

        fig = figure_cls(figsize=(9, 6), layout="constrained")
        ax = fig.add_subplot()
        for r in data["candidates"]:
            colour = VERDICT_COLOUR.get(r["verdict"], VERDICT_COLOUR[None])
            if r["chosen"]:
                ax.scatter(r["ttft_s"], r["throughput"], marker="*", s=260, color=colour, edgecolor="black", zorder=3)
                ax.annotate(
                    f"chosen: {r['label']}\n{r['throughput']:.1f} {data['throughput_unit']}, TTFT {r['ttft_s']:.3f} s",
                    (r["ttft_s"], r["throughput"]),
                    xytext=(10, 10),
                    textcoords="offset points",
                    fontsize=8,
                    fontweight="bold",
                )
            else:
                ax.scatter(r["ttft_s"], r["throughput"], s=36, color=colour, alpha=0.8, zorder=2)
        for i, label in enumerate(data["annotated"]):
            r = next(c for c in data["candidates"] if c["label"] == label)
            ax.annotate(
                f"{r['label']}: {r['rejected']}",
                (r["ttft_s"], r["throughput"]),
                xytext=(8, -12 - 11 * i),  # one line each: neighbours often share the chosen one's point
                textcoords="offset points",
                fontsize=7,
                color="#444444",
                arrowprops={"arrowstyle": "-", "color": "#999999", "linewidth": 0.6},
            )
        ax.set_xlabel("time to first token (s), lower is better")
        ax.set_ylabel(f"throughput ({data['throughput_unit']}), higher is better")
        verdicts = sorted({str(r["verdict"]) for r in data["candidates"]})
        handles = [
            Line2D([], [], marker="o", linestyle="", color=VERDICT_COLOUR.get(v, VERDICT_COLOUR[None]), label=v)
            for v in verdicts
        ]
        n = len(data["candidates"])
        if data["chosen"] is not None:
            handles.append(Line2D([], [], marker="*", linestyle="", color="black", markersize=12, label="chosen"))
            title = f"tune: {n} candidates, throughput against TTFT"
        else:  # exit 4: nothing meets the needs, the nearest configurations and what each gives up
            title = f"tune: nothing meets the needs; the {n} nearest configurations, throughput against TTFT"
        ax.legend(handles=handles, fontsize=8, loc="best")
        fig.suptitle(title, fontsize=10)
        return fig

    draw(path, build)
    return data
