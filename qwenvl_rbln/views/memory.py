"""Human view of a memory report, from its dict alone (compile --dry-run, load-check and bucket-plan share it)."""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.memory.binding import device_decided_by, headline

GiB = 1 << 30


def _gib(n: float | int | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


VERDICT_STYLE = {"fits": "green", "does_not_fit": "red bold", "uncertain": "yellow bold"}
VERDICT_TEXT = {"fits": "fits", "does_not_fit": "does not fit", "uncertain": "uncertain"}


def verdict_of(data: dict[str, Any]) -> str | None:
    """``verdict`` (fits | does_not_fit | uncertain), read from an older ``fits`` boolean when absent."""
    if data.get("verdict") in VERDICT_TEXT:
        return data["verdict"]
    return {True: "fits", False: "does_not_fit"}.get(data.get("fits"))


def _range(item: dict[str, Any]) -> str:
    low, high = item.get("low_bytes"), item.get("high_bytes")
    if low is None or high is None or low == high:
        return ""
    return f"{_gib(low)}-{_gib(high)}"


def _kind(item: dict[str, Any]) -> str:
    if item.get("calibrated"):
        return "calibrated"
    return "exact" if item.get("exact") else "modelled"


def _decided_text(decided: dict[str, Any]) -> str:
    """What decides a device's verdict, for its verdict line: a memory limit with its margin, the KV-block
    minimum, or (observed, split) a pointer to the note below."""
    kind = decided.get("constraint")
    if kind == "observed":
        return "as observed in the product document (below)"
    if kind == "chiplet":  # the card's margin follows on the same line, so the chiplet's is given here
        worst, best = decided["margin_worst_bytes"] / GiB, decided["margin_best_bytes"] / GiB
        span = f"{worst:+.2f}" if worst == best else f"{worst:+.2f} .. {best:+.2f}"
        return f"{decided['text']} (fullest chiplet margin {span} GiB)"
    return decided.get("text", "")


def print_memory(console: Any, report: dict[str, Any] | None, *, show_assumptions: bool = False) -> None:
    """Per device: items (GiB, exact/modelled/calibrated), a verdict with the margin; then notes and suggestions."""
    from rich.markup import escape
    from rich.table import Table

    if not report or not report.get("devices"):
        console.print("[dim]memory: no estimate[/dim]")
        return
    source = report.get("usable_source", "")  # one source for every device (D27: not the verdict's)
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
        table.add_column("range", justify="right")
        table.add_column("kind")
        table.add_column("how", overflow="fold")
        for item in dev["items"]:
            kind = _kind(item)
            style = {"exact": "", "modelled": "yellow", "calibrated": "cyan"}[kind]
            table.add_row(
                item["name"],
                _gib(item["bytes"]),
                _range(item),
                f"[{style}]{kind}[/{style}]" if style else kind,
                escape(item.get("note") or item.get("formula") or ""),
            )
        table.add_section()
        total_range = _range({"low_bytes": dev.get("total_low_bytes"), "high_bytes": dev.get("total_high_bytes")})
        table.add_row("[bold]total[/bold]", f"[bold]{_gib(dev['total_bytes'])}[/bold]", total_range, "", "")
        console.print(table)
        free = dev.get("free_bytes", usable - dev["total_bytes"])
        chip = dev.get("chiplets") or {}
        chip_text = ""
        if chip:
            chip_text = (
                f"  [dim](fullest of {chip['count']} chiplets {_gib(chip['fullest_bytes'])} of "
                f"{_gib(chip['usable_per_chiplet_bytes'])} GiB at the estimate, up to "
                f"{_gib(chip.get('fullest_high_bytes', chip['fullest_bytes']))})[/dim]"
            )
        verdict = verdict_of(dev) or "uncertain"
        style = VERDICT_STYLE[verdict]
        high, low = dev.get("total_high_bytes"), dev.get("total_low_bytes")
        if high is not None and low is not None and high != low:
            margin = (
                f"margin {(usable - high) / GiB:+.2f} .. {(usable - low) / GiB:+.2f} GiB (estimate {free / GiB:+.2f})"
            )
        else:
            margin = f"{free / GiB:.2f} GiB free" if free >= 0 else f"over by {-free / GiB:.2f} GiB"
        decided = _decided_text(device_decided_by(dev, report.get("kv")))
        # the card total is not always what decides: name what does before the card's (maybe all-positive) margin
        margin = f"{decided}, {margin}" if decided.startswith("card total") else f"{decided}; card {margin}"
        console.print(
            f"[{style}]device {dev['device']}: {VERDICT_TEXT[verdict]}:[/{style}] {escape(margin)}{chip_text}"
        )
        observed = dev.get("verdict_source") or ""
        if observed.startswith("observed"):
            console.print(f"  [cyan]•[/cyan] {escape(observed)}")
        for note in dev.get("notes") or []:
            console.print(f"  [yellow]•[/yellow] {escape(note)}")
    for note in report.get("notes") or []:
        console.print(f"[yellow]•[/yellow] {escape(note)}")
    verdict = verdict_of(report)
    if verdict:
        style = VERDICT_STYLE[verdict]
        line = str(report.get("headline") or "")
        if not line.startswith(VERDICT_TEXT[verdict]):  # absent (an older report) or not this verdict's
            line = headline({**report, "verdict": verdict})
        console.print(f"[{style}]memory: {escape(line)}[/{style}]")
        if verdict == "uncertain":
            console.print(
                "[yellow]uncertain: the margin lies inside the range of the modelled items; a dry run exits 4 "
                "unless --uncertain-ok[/yellow]"
            )
    suggestions = report.get("suggestions") or []
    if suggestions:
        how = report.get("suggestions_how") or "append to the same command"  # load-check: a recompile or a flag
        console.print(f"[bold]suggestions[/bold] (each re-estimated and fitting in every scenario; {escape(how)}):")
        for i, sug in enumerate(suggestions, 1):
            sets = sug.get("apply") or " ".join(f"--set {s}" for s in sug.get("set") or [])
            margin = sug.get("margin_low_bytes", sug.get("margin_bytes"))
            chip = sug.get("chiplet_margin_low_bytes")
            margin_text = (
                f"  [dim]-> fits with every modelled item at its high end: >= {margin / GiB:.2f} GiB free"
                + (f", fullest chiplet >= {chip / GiB:.2f} GiB free" if chip is not None else "")
                + "[/dim]"
                if margin is not None
                else ""
            )
            console.print(f"  {i}. [bold]{escape(sets)}[/bold]{margin_text}")
            console.print(f"     {escape(sug.get('text', ''))}")
    if show_assumptions:
        for line in report.get("assumptions") or []:
            console.print(f"[dim]assumes: {escape(line)}[/dim]")
    else:
        console.print("[dim]modelled items are estimates (formulas: --json 'assumptions', docs/memory-model.md)[/dim]")
