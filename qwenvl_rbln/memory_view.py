"""Human view of a memory report, from its dict alone (compile --dry-run, load-check and bucket-plan share it)."""

from __future__ import annotations

from typing import Any

GiB = 1 << 30


def _gib(n: float | int | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


def _kind(item: dict[str, Any]) -> str:
    if item.get("calibrated"):
        return "calibrated"
    return "exact" if item.get("exact") else "modelled"


def print_memory(console: Any, report: dict[str, Any] | None, *, show_assumptions: bool = False) -> None:
    """Per device: items (GiB, exact/modelled/calibrated), a verdict with the margin; then notes and suggestions."""
    from rich.markup import escape
    from rich.table import Table

    if not report or not report.get("devices"):
        console.print("[dim]memory: no estimate[/dim]")
        return
    source = report.get("usable_source", "")
    npu = report.get("npu", "")
    for dev in report["devices"]:
        usable = dev["usable_bytes"]
        table = Table(
            title=f"memory on device {dev['device']} ({escape(npu)}, usable {_gib(usable)} GiB: {escape(source)})",
            title_justify="left",
            show_edge=False,
            pad_edge=False,
        )
        table.add_column("item")
        table.add_column("GiB", justify="right")
        table.add_column("kind")
        table.add_column("how", overflow="fold")
        for item in dev["items"]:
            kind = _kind(item)
            style = {"exact": "", "modelled": "yellow", "calibrated": "cyan"}[kind]
            table.add_row(
                item["name"],
                _gib(item["bytes"]),
                f"[{style}]{kind}[/{style}]" if style else kind,
                escape(item.get("note") or item.get("formula") or ""),
            )
        table.add_section()
        table.add_row("[bold]total[/bold]", f"[bold]{_gib(dev['total_bytes'])}[/bold]", "", "")
        console.print(table)
        free = dev.get("free_bytes", usable - dev["total_bytes"])
        chip = dev.get("chiplets") or {}
        chip_text = ""
        if chip:
            chip_text = (
                f"  [dim](fullest of {chip['count']} chiplets {_gib(chip['fullest_bytes'])} of "
                f"{_gib(chip['usable_per_chiplet_bytes'])} GiB: {'fits' if chip['fits'] else 'over'})[/dim]"
            )
        if dev["fits"]:
            console.print(f"[green]device {dev['device']}: fits[/green], {free / GiB:.2f} GiB free{chip_text}")
        else:
            over = f"over by {-free / GiB:.2f} GiB" if free < 0 else f"{free / GiB:.2f} GiB free but see below"
            console.print(f"[red bold]device {dev['device']}: does not fit[/red bold], {over}{chip_text}")
        for note in dev.get("notes") or []:
            console.print(f"  [yellow]•[/yellow] {escape(note)}")
    for note in report.get("notes") or []:
        console.print(f"[yellow]•[/yellow] {escape(note)}")
    verdict = report.get("fits")
    if verdict is True:
        console.print("[green bold]memory: fits[/green bold]")
    elif verdict is False:
        console.print("[red bold]memory: does not fit[/red bold]")
    suggestions = report.get("suggestions") or []
    if suggestions:
        console.print("[bold]suggestions[/bold] (each re-estimated; append to the same command):")
        for i, sug in enumerate(suggestions, 1):
            sets = " ".join(f"--set {s}" for s in sug.get("set") or [])
            margin = sug.get("margin_bytes")
            margin_text = f"  [dim]-> fits, {margin / GiB:.2f} GiB free[/dim]" if margin is not None else ""
            console.print(f"  {i}. [bold]{escape(sets)}[/bold]{margin_text}")
            console.print(f"     {escape(sug.get('text', ''))}")
    if show_assumptions:
        for line in report.get("assumptions") or []:
            console.print(f"[dim]assumes: {escape(line)}[/dim]")
    else:
        console.print("[dim]modelled items are estimates (formulas: --json 'assumptions', docs/memory-model.md)[/dim]")
