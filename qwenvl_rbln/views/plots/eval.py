"""``qvl eval --plot``: accuracy per category with its 95 % Wilson interval, this run beside the baseline.

One point per category (and ``all``) with its interval as an error bar; with a baseline a second series beside
it, on the shared questions. The title names the set, the metric and the backends, and says ``emulated`` when a
run was. The numbers are the report's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qwenvl_rbln.views.plots.figure import draw

THIS, BASE = "#0072B2", "#E69F00"  # Okabe-Ito blue / orange


def _series(d: dict[str, Any]) -> tuple[list[str], list[dict[str, Any] | None], list[dict[str, Any] | None]]:
    names = [*d["by_category"], "all"]
    this = [*d["by_category"].values(), {"accuracy": d["accuracy"], "ci95": d["ci95"]}]
    if "baseline" not in d:
        return names, this, []
    base_cats = d.get("baseline_by_category") or {}
    base = [base_cats.get(n) for n in d["by_category"]]
    base.append({"accuracy": d["baseline_accuracy"], "ci95": d["baseline_ci95"]})
    return names, this, base


def _plot(ax: Any, xs: list[float], blocks: list[dict[str, Any] | None], colour: str, label: str) -> None:
    pts = [(x, b) for x, b in zip(xs, blocks, strict=True) if b and b.get("accuracy") is not None]
    if not pts:
        return
    x = [p[0] for p in pts]
    y = [p[1]["accuracy"] * 100 for p in pts]
    lower = [(p[1]["accuracy"] - p[1]["ci95"][0]) * 100 for p in pts]
    upper = [(p[1]["ci95"][1] - p[1]["accuracy"]) * 100 for p in pts]
    ax.errorbar(x, y, yerr=[lower, upper], fmt="o", color=colour, capsize=4, label=label)
    for xi, yi in zip(x, y, strict=True):
        ax.annotate(f"{yi:.1f}", (xi, yi), textcoords="offset points", xytext=(6, -3), fontsize=7, color=colour)


def _label(backend: Any, emulated: bool, what: str) -> str:
    return f"{what} ({backend or 'mixed'}{', emulated' if emulated else ''})"


def plot_eval(d: dict[str, Any], path: Path) -> Path:
    names, this, base = _series(d)

    def build(figure_cls: Any) -> Any:
        fig = figure_cls(figsize=(max(5.0, 1.1 * len(names) + 2.5), 4.0))
        ax = fig.add_subplot(1, 1, 1)
        shift = 0.12 if base else 0.0
        xs = list(range(len(names)))
        _plot(ax, [x - shift for x in xs], this, THIS, _label(d["backend"], d["emulated"], "this run"))
        if base:
            label = _label(d.get("baseline_backend"), d.get("baseline_emulated", False), "baseline, shared ids")
            _plot(ax, [x + shift for x in xs], base, BASE, label)
        ax.set_xticks(xs)
        ax.set_xticklabels(names)
        ax.set_ylim(0, 105)
        ax.set_ylabel("accuracy, % (95 % Wilson interval)")
        ax.axvline(len(names) - 1.5, color="#999999", linewidth=0.8)
        emulated = d["emulated"] or d.get("baseline_emulated")
        title = (
            f"qvl eval {d['data'] or ''}: {d['n']} questions, metric {d['metric']}{' (emulated)' if emulated else ''}"
        )
        if base and d.get("delta_points") is not None:
            lo, hi = d["delta_ci95"]
            title += (
                f"\ndifference {d['delta_points']:+.2f} points (95 % CI {lo:+.2f} to {hi:+.2f}) on "
                f"{d['n_shared']} shared, exact McNemar p = {d['mcnemar_p']:.3g}"
            )
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        fig.tight_layout()
        return fig

    return draw(path, build)
