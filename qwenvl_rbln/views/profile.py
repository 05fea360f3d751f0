"""``qvl profile`` for people: each graph's measured time (median, p10-p90) beside the roofline bound and the
ratio, the fit over context with its error, where the entry was written, and the --check verdict. Emulated runs
say so in the title and on every line that names a figure."""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.views.render import Col, markup, print_left_out, print_table


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.4g}"


def _fit_text(fit: dict[str, Any] | None) -> str:
    if not fit:
        return "-"
    return f"+-{fit['rms_rel_error']:.0%} ({fit['points']} pts)"


def _rows(data: dict[str, Any]) -> list[list[str]]:
    rows = []
    for g in data["graphs"]:
        ok = g.get("within_tol")
        flag = "" if ok is None else (" ok" if ok else " OFF")
        for i, p in enumerate(g["points"]):
            rows.append(
                [
                    g["key"] if i == 0 else "",
                    str(g["device"]) if i == 0 else "",
                    "-" if g["kind"] == "vit" else str(p["context"]),
                    _ms(p["median_s"]),
                    f"{_ms(p['p10_s'])}-{_ms(p['p90_s'])}",
                    _ms(p["roofline_s"]),
                    f"{p['ratio']:.2f}x" + (flag if i == 0 else ""),
                    _fit_text(g.get("fit")) if i == 0 else "",
                ]
            )
    return rows


def _throughput(console: Any, data: dict[str, Any]) -> None:
    """Tokens per second of each LM graph at its shortest and longest context (prefill: the chunk's tokens)."""
    tag = " (emulated)" if data["emulated"] else ""
    for g in data["graphs"]:
        pts = [p for p in g["points"] if p.get("tokens_per_s")]
        if g["kind"] == "vit" or not pts:
            continue
        lo, hi = pts[0], pts[-1]
        console.print(markup("  [dim]{}: {} tokens/s at context {} .. {} at {}{}[/dim]", g["key"],
                             f"{lo['tokens_per_s']:,.0f}", lo["context"], f"{hi['tokens_per_s']:,.0f}", hi["context"],
                             tag), highlight=False)  # fmt: skip


def print_human(console: Any, data: dict[str, Any]) -> None:
    origin = data["label"]
    clocks = sorted({g["time_source"] for g in data["graphs"]})
    console.print(markup("[bold]qvl profile[/bold] {} ({})", data["artifact"], origin), highlight=False)
    console.print(
        markup(
            "  {} | rebel {} | optimum-rbln {} | graphs {}",
            data["npu"],
            data["rebel"],
            data["optimum_rbln"],
            data["graph_hash"][:16],
        ),
        highlight=False,
    )
    for clock in clocks:
        console.print(markup("  [dim]time: {}{}[/dim]", clock, " (emulated: CPU time)" if data["emulated"] else ""))
    if data.get("manifest"):
        console.print(markup("  [dim]artifact: {}[/dim]", data["manifest"]), highlight=False)
    measured = "emulated ms" if data["emulated"] else "measured ms"
    cols = [
        Col("graph", justify="left", fold=True),
        Col("dev"),
        Col("context"),
        Col(measured),
        Col(f"{data['spread']} ms", drop=2),
        Col("roofline bound ms"),
        Col("ratio"),
        Col("fit c0+a*n+b*n^2", justify="left", drop=1),
    ]
    title = f"{'emulated (CPU, not an NPU)' if data['emulated'] else 'measured'} against the roofline bound"
    print_left_out(console, print_table(console, cols, _rows(data), title=title))
    _throughput(console, data)
    check = data["check"]
    if check["tolerance"] is not None:
        what = "emulated figures" if data["emulated"] else "measured figures"
        if check["ok"]:
            console.print(markup("[bold]check[/bold] every graph within +-{} of the roofline ({})",
                                 f"{check['tolerance']:.0%}", what))  # fmt: skip
        else:
            console.print(markup("[bold red]check[/bold red] off by more than +-{}: {} ({})",
                                 f"{check['tolerance']:.0%}", ", ".join(check["failing"]), what))  # fmt: skip
    if data.get("timings_file"):
        console.print(markup("[bold]recorded[/bold] {} [{}] as {}", data["timings_file"], data["timings_section"],
                             data["entry_key"]), highlight=False)  # fmt: skip
        if data.get("kept_graphs"):
            kept = data["kept_graphs"]
            console.print(markup("  kept {} graph(s) this run did not time, each with its own date: {}", len(kept),
                                 ", ".join(kept)), highlight=False)  # fmt: skip
        if data["emulated"]:
            console.print("  [dim]emulated entries are kept apart: tune never reads them for an NPU[/dim]")
    else:
        console.print("[dim]not recorded (--no-save)[/dim]")
