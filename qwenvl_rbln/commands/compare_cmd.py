"""`qvl compare A.json B.json`: token agreement and first divergence between two `qvl infer --json` runs.

Exit codes: 0 every request identical; 7 at least one request diverges or is missing from one file
(the report is printed first); 2 a file is missing or is not `qvl infer --json` output, or a request ran
different inputs in the two files (prompt, system, images/videos; `--ignore-inputs` compares anyway).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from qwenvl_rbln.commands.common import JsonOpt


def human(console: Any, d: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    console.print(
        f"[bold]A[/bold] {escape(d['a']['path'])} [dim]({d['a']['backend']}, {d['a']['requests']} requests)[/dim]\n"
        f"[bold]B[/bold] {escape(d['b']['path'])} [dim]({d['b']['backend']}, {d['b']['requests']} requests)[/dim]"
    )
    t = Table(show_edge=False)
    for col in ("request", "tokens A", "tokens B", "agreement", "first divergence"):
        t.add_column(col)
    for r in d["requests"]:
        if "missing_in" in r:
            t.add_row(escape(r["id"]), "-", "-", "-", f"[red]missing in {r['missing_in'].upper()}[/red]")
            continue
        fd = r["first_divergence"]
        where = (
            "[green]identical[/green]"
            if fd is None
            else (
                f"[red]index {fd['index']}[/red]: A {fd['a'] if fd['a'] is not None else 'end'} / "
                f"B {fd['b'] if fd['b'] is not None else 'end'}"
            )
        )
        if r.get("inputs_differ"):
            where += f" [yellow](inputs differ: {escape(', '.join(r['inputs_differ']))})[/yellow]"
        t.add_row(escape(r["id"]), str(r["tokens_a"]), str(r["tokens_b"]), f"{r['agreement_pct']:.1f} %", where)
    console.print(t)
    s = d["summary"]
    verdict = "[green bold]identical[/green bold]" if s["identical"] else "[red bold]diverged[/red bold]"
    console.print(
        f"{verdict}: {s['identical_requests']}/{s['requests']} requests identical, "
        f"{s['agreement_pct']:.1f} % of {s['tokens_compared']} tokens agree"
    )
    for note in d["notes"]:
        console.print(f"[yellow]note: {escape(note)}[/yellow]")


def register(app: typer.Typer) -> None:
    @app.command("compare")
    def compare(
        a: Path = typer.Argument(..., metavar="A.json", help="`qvl infer --json` output (e.g. the NPU run)."),
        b: Path = typer.Argument(..., metavar="B.json", help="`qvl infer --json` output (e.g. the torch reference)."),
        ignore_inputs: bool = typer.Option(
            False,
            "--ignore-inputs",
            help="Compare tokens even when a request's prompt, system prompt or images/videos differ between "
            "the runs (default: refuse with exit 2, naming the request and field).",
        ),
        as_json: bool = JsonOpt,
    ) -> None:
        """Compare the tokens of two `qvl infer --json` runs: agreement and first divergence per request.

        Requests are matched by id and must have run the same inputs (prompt, system, images/videos).
        Exit 0 when every request is identical, 7 when any diverges, 2 for unreadable files or different inputs.
        """
        from qwenvl_rbln import render
        from qwenvl_rbln.inference.compare import compare_runs

        report = compare_runs(a, b, ignore_inputs=ignore_inputs)
        render.emit(report, as_json=as_json, human=human)
        if report["exit_code"]:
            raise SystemExit(report["exit_code"])
