"""Renders a bucket-plan report (``jobs.bucket_plan_job.run_bucket_plan``) as tables readable at 80 columns."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from qwenvl_rbln.views.render import Col, fmt_bytes, markup, plural, print_left_out, print_table
from qwenvl_rbln.vision.buckets import fmt_flops


def _fmt_int(n: Any) -> str:
    return "-" if n is None else f"{n:,}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _print_header(console: Any, data: dict[str, Any]) -> None:
    s = data["summary"]
    p = s["processor"]
    console.print(
        markup(
            "[bold]{}[/bold]: ViT buckets {} [dim]({})[/dim]",
            s["preset"],
            ", ".join(str(b) for b in s["vit_buckets"]),
            s["unit"],
        )
    )
    if s.get("model_moe"):
        console.print(f"model: {s['model_moe']} (ViT FLOPs and workspaces use these)", markup=False)
    console.print(
        f"processor: images {p['min_pixels']:,}..{p['max_pixels']:,} px, videos {p['video_min_pixels']:,}.."
        f"{p['video_max_pixels']:,} px over all frames"
        + (f" and {p['video_max_frame_pixels']:,} px per frame" if p.get("video_max_frame_pixels") else "")
        + f", {p['fps']:g} fps",
        markup=False,
    )
    if data.get("workload"):
        w = data["workload"]
        console.print(
            f"workload {w['path']}: {plural(w['requests'], 'request')} on {plural(w['lines'], 'line')}, aggregated "
            f"into {plural(w['distinct'], 'distinct size')}",
            markup=False,
        )


OVERSIZE_MARK = "†"  # a dagger: resized by the oversize policy, not by the processor caps (*)


def _item_row(it: dict[str, Any]) -> list[str]:
    size = f"{it['width']}x{it['height']}" if it["width"] else "-"
    resized = f"{it['resized_width']}x{it['resized_height']}" if it["resized_width"] else "-"
    if it.get("oversize_capped"):  # the oversize policy's cap, not the plan's processor caps
        resized += OVERSIZE_MARK
    elif it.get("capped"):
        resized += "*"
    bucket = str(it["bucket"]) if it["bucket"] else ("[red]none[/red]" if it["patches"] else "[red]error[/red]")
    return [
        escape(it["input"]),
        size,
        resized,
        _fmt_int(it["patches"]),
        bucket,
        "-" if it["padding_pct"] is None else f"{it['padding_pct']:.1f}",
        _fmt_int(it["lm_tokens"]),
        _fmt_int(it["vit_calls"]),
        _fmt_int(it.get("vit_calls_packed")),
        _fmt_int(it["count"]),
    ]


def _print_inputs(console: Any, data: dict[str, Any], rows_limit: int) -> None:
    items = data["items"]
    s = data["summary"]
    shown = items if rows_limit <= 0 else items[:rows_limit]
    cols = [
        Col("input", "left", fold=True, max_width=48),
        Col("size", drop=2),
        Col("resized", drop=4),
        Col("patches"),
        Col("bucket"),
        Col("pad %"),
        Col("LM tokens", drop=1),
        Col("ViT calls", drop=3),
        Col("packed", drop=3),
        Col("count"),
    ]
    rows = [_item_row(it) for it in shown]
    if "packed" not in s:  # --no-vit-packing / runtime.vit_packing: false
        cols, rows = cols[:-2] + cols[-1:], [r[:-2] + r[-1:] for r in rows]
    if not any(it["count"] != 1 for it in items):
        cols, rows = cols[:-1], [r[:-1] for r in rows]
    print_left_out(console, print_table(console, cols, rows, title="inputs"))
    if len(shown) < len(items):
        what = "distinct sizes" if data.get("workload") else "items"
        console.print(
            f"[dim]{len(items) - len(shown):,} more {what} not shown (--rows 0 shows all; --json has every item)[/dim]"
        )
    _print_cap_notes(console, items, s)


def _print_cap_notes(console: Any, items: list[dict[str, Any]], s: dict[str, Any]) -> None:
    """One footnote per cap that applied: the plan's processor caps (``*``) or, above the largest bucket, the
    oversize policy's per-request resize (``OVERSIZE_MARK``), so a resize is never blamed on the wrong cap."""
    oversize = [it for it in items if it.get("oversize_capped")]
    by_oversize = sum(it["count"] for it in oversize)
    by_caps = s["capped_inputs"] - by_oversize
    if by_caps:
        frame = s["processor"].get("video_max_frame_pixels")
        frame_txt = f", video frames at video_max_frame_pixels={frame:,}" if frame else ""
        console.print(
            f"[dim]* downscaled by processor.max_pixels={s['processor']['max_pixels']:,}{frame_txt} (qvl caps them at "
            f"the largest bucket x 256 so nothing overflows; above it: --on-oversize {s.get('on_oversize', 'resize')})"
            f"; {by_caps:,} input(s) affected[/dim]"
        )
    if by_oversize:
        before = max(it["patches_before_cap"] for it in oversize)
        origin = f"from {before:,} patches" if len(oversize) == 1 else f"from up to {before:,} patches"
        console.print(
            f"[dim]{OVERSIZE_MARK} capped by --on-oversize resize ({origin}): above the largest ViT bucket "
            f"{s['vit_buckets'][-1]:,}, so resized into it for its own request, as infer runs it; "
            f"{by_oversize:,} input(s) affected[/dim]"
        )


def _print_errors(console: Any, items: list[dict[str, Any]], rows_limit: int) -> None:
    errors = [it["error"] for it in items if it["error"]]
    if not errors:
        return
    console.print(f"[bold red]{len(errors):,} input(s) cannot run:[/bold red]")
    limit = len(errors) if rows_limit <= 0 else max(rows_limit, 20)
    for e in errors[:limit]:
        console.print(f"  {e}", markup=False)
    if len(errors) > limit:
        console.print(f"  ... {len(errors) - limit:,} more (see --json)", markup=False)


BUCKET_COLS = (
    Col("bucket"),
    Col("~square", drop=3),
    Col("inputs", drop=5),
    Col("ViT calls"),
    Col("share", drop=6),
    Col("mean pad %"),
    Col("executed"),
    Col("useful", drop=4),
    Col("exec/useful"),
    Col("attn mask", drop=1),
    Col("workspace", drop=2),
    Col("fits as largest", drop=3),
)


def _bucket_rows(s: dict[str, Any]) -> list[list[str]]:
    rows = []
    for r in s["buckets"]:
        rows.append(
            [
                f"{r['bucket']:,}",
                f"{r['square_px']}²",
                _fmt_int(r["inputs"]),
                _fmt_int(r["calls"]),
                f"{100 * r['share']:.1f}%",
                "-" if r["mean_padding_pct"] is None else f"{r['mean_padding_pct']:.1f}",
                fmt_flops(r["executed_flops"]) if r["calls"] else "-",
                fmt_flops(r["useful_flops"]) if r["calls"] else "-",
                _ratio(r["executed_over_useful"]),
                fmt_bytes(r["attn_mask_bytes"]),
                fmt_bytes(r["workspace_bytes"]) if r["workspace_bytes"] is not None else "-",
                _yes_no(r.get("plan_fits_with_this_as_largest")),
            ]
        )
    u = s["uncovered"]
    if u["calls"]:
        share = f"{100 * u['calls'] / s['vit_calls']:.1f}%"
        rows.append(["[red]> largest[/red]", "-", _fmt_int(u["inputs"]), _fmt_int(u["calls"]), share, "-", "fails"])
        rows[-1] += ["-"] * 5
    total_inputs = sum(r["inputs"] for r in s["buckets"]) + u["inputs"]
    executed, useful = fmt_flops(s["executed_flops"]), fmt_flops(s["useful_flops"])
    ratio = _ratio(s["executed_over_useful"])
    rows.append(["[bold]total[/bold]", "", _fmt_int(total_inputs), _fmt_int(s["vit_calls"]), "", "", executed, useful])
    rows[-1] += [ratio, "", "", ""]
    return rows


def _yes_no(value: bool | str | None) -> str:
    if value == "uncertain":
        return "[yellow]uncertain[/yellow]"
    return "-" if value is None else ("yes" if value else "[red]no[/red]")


def _print_buckets(console: Any, s: dict[str, Any]) -> None:
    if not s["vit_calls"]:
        return
    print_left_out(console, print_table(console, BUCKET_COLS, _bucket_rows(s), title="per bucket"))
    console.print(
        f"[dim]compute = ViT FLOPs per call at the bucket (executed) vs at the real patch count (useful); "
        f"LM tokens in total {s['lm_tokens']:,}[/dim]"
    )
    _print_packed(console, s)
    _print_memory_line(console, s.get("memory"))


def _print_packed(console: Any, s: dict[str, Any]) -> None:
    """Unpacked and packed side by side: calls, executed compute, mask bytes (each request's segments packed)."""
    p = s.get("packed")
    if not p:
        return
    console.print(
        f"packed ViT calls (a request's images / temporal patches share calls): {s['vit_calls']:,} -> "
        f"{plural(p['vit_calls'], 'call')}, executed {fmt_flops(s['executed_flops'])} -> "
        f"{fmt_flops(p['executed_flops'])} "
        f"({_ratio(s['executed_over_useful'])} -> {_ratio(p['executed_over_useful'])} useful), attn mask "
        f"{fmt_bytes(p['unpacked_attn_mask_bytes'])} -> {fmt_bytes(p['attn_mask_bytes'])} sent "
        "(--no-vit-packing: one call each)",
        markup=False,
    )


def _print_memory_line(console: Any, mem: dict[str, Any] | None) -> None:
    """The whole plan's verdict (LM + KV + ViT per device), so a bucket list that cannot load is seen here."""
    if not mem:
        return
    devices = ", ".join(
        f"device {d['device']} {fmt_bytes(d['total_bytes'])} of {fmt_bytes(d['usable_bytes'])}" for d in mem["devices"]
    )
    verdict = mem.get("verdict") or {True: "fits", False: "does_not_fit"}.get(mem.get("fits"), "uncertain")
    if verdict == "fits":
        console.print(f"[dim]memory (whole plan, as compile --dry-run): fits: {devices}[/dim]")
        return
    fix = f"; try {mem['suggestions'][0]}" if mem["suggestions"] else "; see `qvl compile --dry-run`"
    style, text = ("red", "does not fit") if verdict == "does_not_fit" else ("yellow", "uncertain")
    # the headline names what decides the verdict (card, chiplet, KV-block minimum, budget); the totals follow
    headline = mem.get("headline") or text
    console.print(f"[{style}]memory (whole plan): {headline} ({devices}){fix}[/{style}]")


def _print_optimized(console: Any, opt: dict[str, Any], preset: str) -> None:
    console.print(
        f"[bold]optimised ViT buckets[/bold] (K={opt['k']}, {opt['distinct_values']:,} distinct patch counts; "
        f"cost = {'packed ' if opt.get('cost') == 'packed' else ''}ViT FLOPs; every list on the same "
        f"{plural(opt['vit_calls'], 'ViT call')})"
    )
    rep = opt.get("replanned")
    if rep:
        console.print(
            f"{rep['inputs']:,} input(s) ({plural(rep['vit_calls'], 'ViT call')}, up to "
            f"{rep['max_patches_before']:,} patches) "
            f"are above --max-bucket {rep['max_bucket']:,}; every list below costs them resized as {rep['set']} "
            f"does (part of the suggested --set)",
            markup=False,
        )
    names = {"preset": "preset", "single_largest": "single largest", "powers_of_two": "powers of two"}
    lists = [("[bold]optimised[/bold]", opt)] + [(label, opt["baselines"][key]) for key, label in names.items()]
    cols = [
        Col("list", "left", fold=True, fold_min=10),
        Col("n", drop=1),
        Col("buckets", "left", fold=True, fold_min=14),
        Col("executed"),
        Col("exec/useful", drop=3),
        Col("uncovered", drop=2 if not any(b["uncovered_calls"] for _, b in lists) else 0),
    ]
    rows = [
        [
            label,
            str(len(b["buckets"])),
            ", ".join(map(str, b["buckets"])),
            fmt_flops(b["executed"]),
            _ratio(b["executed_over_useful"]),
            _fmt_int(b["uncovered_calls"]),
        ]
        for label, b in lists
    ]
    print_left_out(console, print_table(console, cols, rows))
    if opt["speedup_vs_preset"] is not None:
        console.print(f"{opt['speedup_vs_preset']:.2f}x less ViT compute executed than the preset's list", markup=False)
    elif opt.get("speedup_note"):
        console.print(opt["speedup_note"], markup=False)
    if opt["uncovered_calls"]:
        console.print(
            f"{opt['uncovered_calls']:,} ViT call(s) are still above --max-bucket "
            f"(up to {opt['uncovered_max']:,} patches) and have no bucket in any list",
            markup=False,
        )
    _recommendation_line(console, opt["set"], opt.get("memory"))
    if not rep:
        console.print(
            f"[dim]with this list qvl caps processor.max_pixels at {opt['processor_max_pixels']:,} px "
            f"(top bucket x 256) unless the preset sets it[/dim]"
        )


def _print_decoder_optimized(console: Any, do: dict[str, Any]) -> None:
    console.print(f"[bold]optimised decoder_batch_sizes[/bold] (K={do['k']}; cost = rows computed per step)")
    cols = [
        Col("list", "left", fold=True),
        Col("decoder_batch_sizes", "left", fold=True),
        Col("computed rows"),
        Col("padded rows"),
        Col("computed/real"),
    ]

    def row(label: str, b: dict[str, Any]) -> list[str]:
        return [
            label,
            str(b["decoder_batch_sizes"]),
            _fmt_int(b["computed_rows"]),
            _fmt_int(b["padded_rows"]),
            _ratio(b["computed_over_rows"]),
        ]

    rows = [row("[bold]optimised[/bold]", do)]
    for key, label in (("preset", "preset"), ("single_largest", "batch_size only"), ("powers_of_two", "powers of two")):
        b = do["baselines"][key]
        n = b["uncovered_steps"]
        extra = f" ({plural(n, 'step')} {'does' if n == 1 else 'do'} not fit)" if n else ""
        rows.append(row(label + extra, b))
    print_table(console, cols, rows)
    _recommendation_line(console, do["set"], do.get("memory"))


def _print_decoder(console: Any, dec: dict[str, Any], rows_limit: int) -> None:
    console.print(
        f"[bold]decoder graphs[/bold] {dec['decoder_batch_sizes']} (batch_size {dec['batch_size']}): "
        f"{plural(dec['steps'], 'decode step')}, {plural(dec['rows'], 'real row')}, "
        f"{plural(dec['padded_rows'], 'padded row')} "
        f"({dec['padded_pct'] if dec['padded_pct'] is not None else 0:.1f}% of computed)"
    )
    per = dec["per_batch"]
    rows = [
        [
            str(e["batch"]),
            _fmt_int(e["steps"]),
            str(e["graph"]) if e["graph"] else "[red]none[/red]",
            _fmt_int(e["padded_rows"]),
        ]
        for e in (per if rows_limit <= 0 else per[:rows_limit])
    ]
    print_table(console, [Col("running batch"), Col("steps"), Col("graph"), Col("padded rows")], rows)
    if dec["uncovered_steps"]:
        for e in per:
            if e["error"]:
                console.print(f"  {e['error']}", markup=False)
    if dec.get("optimized"):
        _print_decoder_optimized(console, dec["optimized"])
    console.print(f"[dim]note: {dec['note']}[/dim]")


def print_human(console: Any, data: dict[str, Any], rows_limit: int) -> None:
    """Tables that stay readable at 80 columns: columns are left out (and said so) before a number is cut."""
    _print_header(console, data)
    if data["items"]:
        _print_inputs(console, data, rows_limit)
    _print_errors(console, data["items"], rows_limit)
    _print_buckets(console, data["summary"])
    if data.get("optimized"):
        _print_optimized(console, data["optimized"], data["summary"]["preset"])
    if data.get("decoder"):
        _print_decoder(console, data["decoder"], rows_limit)


def _recommendation_line(console: Any, use: str, own: dict[str, Any] | None) -> None:
    """'use: --set ...' only for a configuration whose own dry run fits; otherwise say plainly that it does not."""
    if own is None or own["verdict"] == "fits":
        console.print(f"use: {use}", markup=False)
        return
    what = {
        "does_not_fit": "does not fit",
        "uncertain": "is uncertain to fit (verdict uncertain)",
        "invalid": "is refused by the planner",
    }[own["verdict"]]
    extra = f" ({own['reason']})" if own.get("reason") else ""
    fix = f"; its dry run's first fix: {use} {own['fix']}" if own.get("fix") else ""
    console.print(f"not recommended as is: {use} {what} in its own dry run{extra}{fix}", markup=False)
