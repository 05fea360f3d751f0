"""``qvl eval`` for people: accuracy per category with its 95 % interval (beside the baseline's, when given), the
paired comparison in words, the unshared ids by name, each gate's verdict and the notes. Emulated runs say so in
the title. The numbers are the report's (``evaluation/report.py``): this view computes nothing."""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.views.render import Col, markup, print_left_out, print_table

SHOWN_IDS = 10  # unshared ids named in the terminal; --json lists every one


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def interval(ci: list[float] | None) -> str:
    return "-" if ci is None else f"{ci[0] * 100:.1f} - {ci[1] * 100:.1f} %"


def _who(backend: Any, emulated: bool, mixed: bool = True) -> str:
    named = backend or ("mixed backends" if mixed else "backend not recorded")
    return f"{named}{', emulated' if emulated else ''}"


def _rows(d: dict[str, Any]) -> list[list[str]]:
    base = d.get("baseline_by_category") or {}
    rows = []
    for name, b in [*d["by_category"].items(), ("all", d)]:
        row = [name, str(b["n"]), str(b["correct"]), pct(b["accuracy"]), interval(b["ci95"])]
        if "baseline" in d:
            other = (
                base.get(name) if name != "all" else {"accuracy": d["baseline_accuracy"], "ci95": d["baseline_ci95"]}
            )
            row += [pct(other and other["accuracy"]), interval(other and other["ci95"])]
        rows.append(row)
    return rows


def _ids(ids: list[str]) -> str:
    shown = ", ".join(ids[:SHOWN_IDS])
    return shown + (f", ... ({len(ids) - SHOWN_IDS} more in --json)" if len(ids) > SHOWN_IDS else "")


def _paired(console: Any, d: dict[str, Any]) -> None:
    console.print(
        markup(
            "[bold]baseline[/bold] {} [dim]({})[/dim]: paired on {} shared questions",
            d["baseline"],
            _who(d["baseline_backend"], d["baseline_emulated"], d.get("baseline_backend_mixed", True)),
            d["n_shared"],
        )
    )
    if d["n_shared"]:
        console.print(
            f"  both right {d['both_right']} · only this run {d['only_this']} · only the baseline "
            f"{d['only_baseline']} · both wrong {d['both_wrong']}",
            markup=False,
            highlight=False,
        )
        lo, hi = d["delta_ci95"]
        console.print(
            f"  difference {d['delta_points']:+.2f} points (this run - baseline), 95 % CI {lo:+.2f} to {hi:+.2f} "
            f"(Newcombe, paired); exact McNemar p = {d['mcnemar_p']:.4g}",
            markup=False,
            highlight=False,
        )
    un = d["unshared"]
    if un["count"]:
        for ids, where in ((un["only_this_run"], "only in this run"), (un["only_baseline"], "only in the baseline")):
            if ids:
                console.print(markup("  [yellow]{} {}[/yellow] (not compared): {}", len(ids), where, _ids(ids)))
    else:
        console.print("  every id is in both runs", markup=False, highlight=False)


def human(console: Any, d: dict[str, Any]) -> None:
    console.print(
        markup(
            "[bold]qvl eval[/bold] {} [dim]({}; metric {}; {})[/dim]",
            d["data"] or "(results file)",
            _who(d["backend"], d["emulated"], d.get("backend_mixed", True)),
            d["metric"],
            d["results"],
        )
    )
    cols = [Col("category", justify="left", fold=True), Col("n"), Col("right"), Col("accuracy"), Col("95 % CI")]
    if "baseline" in d:
        cols += [Col("baseline"), Col("baseline 95 % CI", drop=1)]
    print_left_out(console, print_table(console, cols, _rows(d)))
    if d["failed"]:
        console.print(markup("[yellow]{} requests did not run[/yellow] (counted wrong; see their error)", d["failed"]))
    if d.get("annotated"):
        console.print(
            f"VQA accuracy {d['vqa_accuracy'] * 100:.2f} % (official VQA metric, mean over the questions)",
            markup=False,
        )
    if d.get("anls") is not None:
        console.print(f"ANLS {d['anls']:.4f} (mean of the items' scores, threshold 0.5)", markup=False)
    if "baseline" in d:
        _paired(console, d)
    for gate in d["gates"]:
        verdict = "[green]passed[/green]" if gate["passed"] else "[red bold]FAILED[/red bold]"
        console.print(markup(f"gate --{{}} {verdict}: {{}}", gate["gate"], gate["message"]))
    for note in d["notes"]:
        console.print(markup("[dim]note: {}[/dim]", note))
