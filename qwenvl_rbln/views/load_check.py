"""Human view of a load-check report (``load_check.run_load_check``), from its dict alone."""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.units import fmt_json

OK = "[green]ok[/green]"
BAD = "[red bold]problem[/red bold]"


def verifying_line(files: int, total_bytes: int) -> str:
    """The progress line printed before the manifest's sha256 check (it reads every file)."""
    from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME
    from qwenvl_rbln.views.render import fmt_bytes

    return f"qvl load-check: verifying {files} files ({fmt_bytes(total_bytes)}) against {MANIFEST_NAME}"


def _layout_cell(layout: dict[str, Any]) -> str:
    from rich.markup import escape

    lines = [OK if layout["ok"] else BAD]
    for label, key in (("missing", "missing"), ("changed after compile", "modified"), ("unexpected", "unexpected")):
        if layout[key]:
            lines.append(f"{label}: {escape(', '.join(layout[key]))}")
    lines.extend(escape(p) for p in layout["problems"])
    lines.extend(f"[dim]{escape(n)}[/dim]" for n in layout["notes"])
    return "\n".join(lines)


def _placement_cell(placement: dict[str, Any]) -> str:
    from rich.markup import escape

    req = placement["requested"]
    pl = [f"LM on device {req['device']}, visual on device {req['visual_device']}"]
    if placement.get("compiled"):
        c = placement["compiled"]
        pl.append(
            f"[dim]compiled for: LM {c.get('device')}, visual {c.get('visual_device')} "
            f"({escape(placement['compiled_source'])})[/dim]"
        )
    pl.extend(f"[red]{escape(p)}[/red]" for p in placement["problems"])
    pl.extend(f"[yellow]{escape(n)}[/yellow]" for n in placement["notes"])
    return "\n".join(pl)


def _summary(console: Any, d: dict[str, Any]) -> None:
    """Artifact, target, layout, manifest and placement as one two-column table."""
    from rich.markup import escape
    from rich.table import Table

    layout, target = d["layout"], d["target"]
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    table.add_row("artifact", f"{escape(d['artifact_dir'])}  [dim]({d['kind']})[/dim]")
    table.add_row(
        "target",
        f"{escape(str(target.get('npu')))}, num_devices {target['num_devices']} "
        f"(visual {target['visual_num_devices']})",
    )
    if target.get("model_moe"):
        table.add_row("model", escape(target["model_moe"]))
    table.add_row("layout", _layout_cell(layout))
    processor = d.get("processor") or {}
    if processor.get("warnings"):
        lines = [f"[yellow]warning[/yellow]: {escape(w)}" for w in processor["warnings"]]
        table.add_row("processor", "\n".join(lines))
    elif d["kind"] == "rbln":
        table.add_row("processor", OK + " (image and video caps fit the largest ViT bucket)")
    man = layout["manifest"]
    if man.get("present"):
        table.add_row("manifest", OK + " (every file matches its sha256)" if man["ok"] else BAD)
    table.add_row("placement", _placement_cell(d["placement"]))
    console.print(table)


def _device_table(console: Any, memory: dict[str, Any]) -> None:
    """Exact or emulated allocations per device, with each device's verdict."""
    from rich.table import Table

    from qwenvl_rbln.views.render import fmt_bytes

    title = (
        "memory per device (exact: from the compiled graphs)"
        if memory["source"] == "exact"
        else "memory per device (emulated: tensor sizes of the emulated graphs, not NPU figures)"
    )
    mt = Table(title=title, title_justify="left", show_edge=False)
    for col in ("device", "graphs", "allocated", "usable", "fullest chiplet", "verdict"):
        mt.add_column(col)
    for dev in memory["devices"]:
        chips = dev.get("per_chiplet_bytes") or []
        verdict = {True: "[green]fits[/green]", False: "[red bold]does not fit[/red bold]", None: "-"}[dev.get("fits")]
        mt.add_row(
            str(dev["device"]),
            ", ".join(dev["graphs"]),
            fmt_bytes(dev["total_bytes"]),
            fmt_bytes(dev.get("usable_bytes")),
            f"{fmt_bytes(max(chips) if chips else None)} of {fmt_bytes(dev.get('usable_per_chiplet_bytes'))}",
            verdict,
        )
    console.print(mt)


def _emulated_graphs(console: Any, memory: dict[str, Any]) -> None:
    """Emulated sizes per graph, then the planner's estimate beside them."""
    from rich.table import Table

    from qwenvl_rbln.views.memory import print_memory
    from qwenvl_rbln.views.render import fmt_bytes

    gt = Table(title="graphs (emulated sizes)", title_justify="left", show_edge=False)
    for col in ("graph", "device", "weights", "io buffers", "KV cache"):
        gt.add_column(col)
    for name, g in (memory.get("graphs") or {}).items():
        by_key = g.get("by_key") or {}
        kv = fmt_bytes(by_key.get("DramTensor")) if "DramTensor" in by_key else "-"
        if g.get("kv_shared"):
            kv += " (shared)"
        gt.add_row(name, str(g["device"]), fmt_bytes(by_key.get("Weight")), fmt_bytes(by_key.get("IOBuffer")), kv)
    console.print(gt)
    if (memory.get("estimate") or {}).get("source") == "estimate":
        console.print("[bold]planner estimate[/bold] [dim](beside the emulated sizes)[/dim]")
        print_memory(console, memory["estimate"])


def _calibration(console: Any, calibration: dict[str, Any] | None) -> None:
    from rich.markup import escape

    if calibration and calibration.get("recorded"):
        console.print(
            f"[green]calibration: {len(calibration['entries'])} workspaces recorded in "
            f"{escape(calibration['path'])}[/green]"
        )
    elif calibration:
        console.print(f"[yellow]calibration: nothing recorded ({escape(str(calibration.get('reason')))})[/yellow]")


def _memory(console: Any, memory: dict[str, Any]) -> None:
    """Exact/emulated tables, the planner's estimate, or the reason there is none; then --calibrate's outcome."""
    from rich.markup import escape

    from qwenvl_rbln.views.memory import print_memory

    if memory.get("source") in ("exact", "emulated"):
        _device_table(console, memory)
        if memory["source"] == "emulated":
            _emulated_graphs(console, memory)
    elif memory.get("source") == "estimate":
        console.print("[bold]memory per device[/bold] [dim](planner estimate: rebel is not importable here)[/dim]")
        print_memory(console, memory)
    else:
        console.print(f"[dim]memory: {escape(str(memory.get('reason') or 'unavailable'))}[/dim]")
    _calibration(console, memory.get("calibration"))


def _diagnosis(console: Any, diag: dict[str, Any]) -> None:
    """After ``Lack of device memory``: each device's graphs and use, then the fixes."""
    from rich.markup import escape

    from qwenvl_rbln.views.render import fmt_bytes

    for dev in diag["devices"]:
        nums = ""
        if dev.get("used_bytes") is not None:
            nums = f": {fmt_bytes(dev['used_bytes'])} of {fmt_bytes(dev.get('usable_bytes'))}"
        console.print(f"  device {dev['device']}: {escape(', '.join(dev['graphs']))}{nums}")
    console.print("[bold]fixes[/bold]")
    for fix in diag["fixes"]:
        console.print(f"  • {escape(fix)}")
    for flag in diag.get("load_flags") or []:
        console.print(f"  • load with {escape(flag)} (no recompile)")
    for cli in diag.get("recompile") or [f"recompile with {cli}" for cli in diag["set"]]:
        console.print(f"  • {escape(cli)}")


def _runtime(console: Any, runtime: dict[str, Any]) -> None:
    from rich.markup import escape

    if runtime.get("ok") is True:
        extra = f" in {runtime['seconds']}s" if runtime.get("seconds") is not None else ""
        console.print(f"[green]runtime: {escape(runtime.get('note') or 'created')}{extra}[/green]")
    elif runtime.get("attempted") is False:
        reason = runtime.get("reason") or runtime.get("error") or "skipped"
        console.print(f"[dim]runtime: not created ({escape(str(reason))})[/dim]")
    else:
        console.print(f"[red bold]runtime: failed[/red bold] {escape(str(runtime.get('error')))}")
        if runtime.get("diagnosis"):
            _diagnosis(console, runtime["diagnosis"])


def human(console: Any, d: dict[str, Any]) -> None:
    """The whole report: summary table, memory, runtime, then one ok/failed line."""
    _summary(console, d)
    _memory(console, d["memory"])
    _runtime(console, d["runtime"])
    console.print(verdict_line(d))


def verdict_line(d: dict[str, Any]) -> str:
    """The last line: ok, ok with what was accepted or warned, or failed."""
    from rich.markup import escape

    if not d["ok"]:
        return "[red bold]load-check: failed[/red bold]"
    extra = []
    warnings = (d.get("processor") or {}).get("warnings") or []
    if warnings:
        fix, line = (d.get("processor") or {}).get("fix"), (d.get("processor") or {}).get("fix_line")
        said = escape(line) if line else f"`{escape(fix)}` fixes them"
        extra.append(f"{len(warnings)} processor-file warning{'s' * (len(warnings) != 1)}: {said}")
    extra.extend(escape(a) for a in d.get("accepted") or [])
    if extra:
        return f"[yellow bold]load-check: ok, with {'; '.join(extra)}[/yellow bold]"
    return "[green bold]load-check: ok[/green bold]"


def fix_processor_human(console: Any, d: dict[str, Any]) -> None:
    """`qvl fix-processor`: each file's key changes and its backup, then one line saying what was done."""
    from rich.markup import escape

    if not d["files"]:
        console.print(
            f"[green]fix-processor: nothing to change in {escape(d['artifact_dir'])}[/green] (its processor "
            "files fit the largest ViT bucket)"
        )
        return
    verb = "would change" if d["dry_run"] else "changed"
    for entry in d["files"]:
        console.print(
            f"[bold]{escape(entry['file'])}[/bold] ({verb}; old file {'to be ' if d['dry_run'] else ''}"
            f"kept as {escape(entry['backup'])})"
        )
        added = set(entry.get("added") or ())
        for key, (old, new) in entry["keys"].items():
            before = "(not set)" if key in added else fmt_json(old)  # JSON's spelling (null, true), never Python's
            console.print(f"  {escape(key)}: {escape(before)} -> {escape(fmt_json(new))}")
    if d["manifest"] != "none":
        console.print(
            f"[dim]qvl-manifest.json: {'to be ' if d['dry_run'] else ''}rehashed (new files, backups, caps)[/dim]"
        )
    if d["dry_run"]:
        console.print("[yellow]fix-processor: dry run, nothing written[/yellow]")
    else:
        console.print(
            f"[green bold]fix-processor: done[/green bold]; `qvl load-check {escape(d['artifact_dir'])}` "
            "should show no processor warning"
        )
