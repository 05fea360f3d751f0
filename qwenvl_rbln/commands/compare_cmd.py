"""`qvl compare A.json B.json`: token agreement and first divergence between two `qvl infer --json` runs.

Exit codes: 0 the shared tokens of every request agree (a length difference is reported, not failed); 7 at
least one request's shared tokens differ, it is missing from one file, or lengths differ with --strict-length
(the report is printed first); 2 a file is missing or is not `qvl infer --json` output, or a request ran
different inputs in the two files (prompt, system, images/videos; `--ignore-inputs` compares anyway).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from qwenvl_rbln.commands.common import JsonOpt


def _length(r: dict[str, Any]) -> str:
    diff = r.get("length_difference")
    if not diff:
        return "same"
    return f"{diff['longer'].upper()} +{diff['extra_tokens']} from index {diff['from_index']}"


def _count(n: int, noun: str) -> str:
    """``1 request``, ``2 requests``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def human(console: Any, d: dict[str, Any]) -> None:
    from rich.table import Table

    from qwenvl_rbln.views.render import markup, one_line

    for side in ("a", "b"):
        x = d[side]
        console.print(
            markup(
                f"[bold]{side.upper()}[/bold] {{}} [dim]({{}}, {{}})[/dim]",
                x["path"],
                x["backend"],
                _count(x["requests"], "request"),
            )
        )
    t = Table(show_edge=False)
    for col in ("request", "tokens A", "tokens B", "agreement (shared)", "first divergence", "length"):
        t.add_column(col)
    for r in d["requests"]:
        if "missing_in" in r:
            t.add_row(
                markup("{}", one_line(r["id"])), "-", "-", "-", f"[red]missing in {r['missing_in'].upper()}[/red]", "-"
            )
            continue
        fd = r["first_divergence"]
        if fd is None:
            where = markup("[green]identical[/green]" if r["identical"] else "[green]shared tokens identical[/green]")
        else:
            where = markup("[red]index {}[/red]: A {} / B {}", fd["index"], fd["a"], fd["b"])
        if r.get("inputs_differ"):
            where.append_text(markup(" [yellow](inputs differ: {})[/yellow]", ", ".join(r["inputs_differ"])))
        length = _length(r)
        t.add_row(
            markup("{}", one_line(r["id"])),
            str(r["tokens_a"]),
            str(r["tokens_b"]),
            f"{r['agreement_pct']:.1f} %" if min(r["tokens_a"], r["tokens_b"]) else "- (none shared)",
            where,
            length if length == "same" else f"[yellow]{length}[/yellow]",
        )
    console.print(t)
    s = d["summary"]
    if s["identical"]:
        verdict = "[green bold]identical[/green bold]"
    elif d["exit_code"] == 0:
        verdict = "[green bold]agree[/green bold] (on the shared tokens; lengths differ)"
    else:
        verdict = "[red bold]diverged[/red bold]"
    console.print(
        f"{verdict}: {s['identical_requests']}/{_count(s['requests'], 'request')} identical, "
        + (
            f"{s['agreement_pct']:.1f} % of {_count(s['tokens_compared'], 'shared token')} agree"
            if s["tokens_compared"]
            else "no shared tokens to compare"
        )
        + (f", {s['length_differs_requests']} differ in length" if s["length_differs_requests"] else "")
    )
    for note in d["notes"]:
        console.print(markup("[yellow]note: {}[/yellow]", note))


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
        strict_length: bool = typer.Option(
            False,
            "--strict-length",
            help="Also fail (exit 7) when a request's runs produced different numbers of tokens (default: "
            "agreement is over the shared tokens and a length difference is only reported).",
        ),
        as_json: bool = JsonOpt,
    ) -> None:
        """Compare the tokens of two `qvl infer --json` runs: agreement and first divergence per request.

        Requests are matched by id and must have run the same inputs (prompt, system, images/videos).
        Agreement is over the tokens both runs produced; a length difference is reported on its own.
        Exit 0 when the shared tokens of every request agree, 7 when any differ (or lengths differ, with
        --strict-length) or a request is missing, 2 for unreadable files or different inputs.
        """
        from qwenvl_rbln.inference.compare import compare_runs, divergence_error
        from qwenvl_rbln.views import render

        report = compare_runs(a, b, ignore_inputs=ignore_inputs, strict_length=strict_length)
        error = divergence_error(report)
        render.emit(report, as_json=as_json, human=human, error=error)
        if error is not None:
            raise error
