"""Human view of ``qvl tune``: the needs, the best configurations with their estimate and verdict, why each
neighbour lost (or, when nothing meets the needs, the nearest configurations), the commands and the preset."""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.views.render import Col, markup, print_left_out, print_table

GiB = 1 << 30


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def _where(row: dict[str, Any]) -> str:
    return "own NPU (1)" if row["npus"] == 2 else "beside LM (0)"


def _config_cols(needs: dict[str, Any]) -> list[Col]:
    """The table's columns; a narrow console drops the droppable ones first (and says so), never the objective's
    own column, and with two NPUs the ViT placement last (it is what tells two otherwise equal rows apart)."""
    latency = 0 if needs.get("objective") == "latency" else 4
    vit = 5 if needs.get("devices", 1) > 1 else 3
    return [
        Col("#"),
        Col("batch"),
        Col("decoder graphs", justify="left", fold=True),
        Col("max_seq_len"),
        Col("partition", drop=2),
        Col("ViT", justify="left", drop=vit),
        Col("verdict", justify="left"),
        Col("margin GiB", drop=1),  # the binding one: the card's or its fullest chiplet's
        Col("tok/s"),
        Col("TTFT ms"),
        Col("TPOT ms"),
        Col("latency ms", drop=latency),
    ]


def _config_row(i: int, row: dict[str, Any]) -> list[str]:
    est = row.get("estimate") or {}
    margin = row.get("margin_binding_bytes")
    return [
        str(i),
        str(row["batch_size"]),
        ",".join(map(str, row["decoder_batch_sizes"])),
        str(row["max_seq_len"]),
        str(row["kvcache_partition_len"]),
        _where(row),
        row["verdict"],
        "-" if margin is None else f"{margin / GiB:+.2f} {row['margin_binds']}",
        _fig(est, "output_tokens_per_s", 1, ".0f"),
        _fig(est, "ttft_s"),
        _fig(est, "tpot_s"),
        _fig(est, "latency_s"),
    ]


# --- the corrected cost model: MoE ranges and the lighter load --------------------------------------------------


def _fig(est: dict[str, Any] | None, key: str, scale: float = 1000, fmt: str = ".2f") -> str:
    """One figure, or a MoE's range "low–high" (routed experts only to every expert) when the two ends differ."""
    if not est or est.get(key) is None:
        return "-"
    span = (est.get("moe_range") or {}).get(key)
    if span:
        return f"{span['low'] * scale:{fmt}}–{span['high'] * scale:{fmt}}"
    return f"{est[key] * scale:{fmt}}"


def _load_cols(data: dict[str, Any]) -> list[Col]:
    """The lighter-load throughput column (no batch trace only): what throughput is ranked by."""
    load = (data["cost_model"].get("load") or {}).get("lighter_load")
    return [Col(f"tok/s at {load}")] if load else []


def _load_cells(row: dict[str, Any], data: dict[str, Any]) -> list[str]:
    if not _load_cols(data):
        return []
    est = row.get("estimate") or {}
    light = est.get("lighter_load")
    if not light:
        return ["-"]
    return [_fig({**light, "moe_range": (est.get("moe_range") or {}).get("lighter")}, "output_tokens_per_s", 1, ".0f")]


def _cost_notes(console: Any, data: dict[str, Any]) -> None:
    """What the figures assume: the load (full batch without a trace, and the rule tune ranks by), a MoE's range."""
    cm = data["cost_model"]
    load = cm.get("load") or {}
    if load.get("rule"):
        console.print(markup("[bold]load[/bold] {}", load["rule"]))
    if cm.get("moe_range"):
        console.print(markup("[bold]MoE[/bold] {}", cm["moe_range"]))


def _step(graph: dict[str, Any]) -> str:
    span = graph.get("step_s_range")
    if span:
        return f"{graph['graph']}: {span['low'] * 1000:.2f}–{span['high'] * 1000:.2f} ms"
    return f"{graph['graph']}: {graph['step_s'] * 1000:.2f} ms"


def _needs(console: Any, data: dict[str, Any]) -> None:
    n, w = data["needs"], data["workload"]
    console.print(
        markup(
            "[bold]needs[/bold] {}: context {}, batch >= {}, {} NPU(s), objective {}",
            n["model"],
            n["context"],
            n["min_batch"],
            n["devices"],
            n["objective"],
        )
    )
    trace = f", batch trace {w['batch_trace']} ({w['trace_steps']:,} steps)" if w["batch_trace"] else ""
    console.print(
        markup(
            "[bold]workload[/bold] {}: {} requests, {} distinct sizes, ~{} input tokens each{}",
            w["path"],
            f"{w['requests']:,}",
            f"{w['distinct_sizes']:,}",
            f"{w['mean_input_tokens']:.0f}",
            trace,
        )
    )
    console.print(
        markup(
            "[bold]ViT buckets[/bold] {} (exact DP on the {} cost, as bucket-plan --optimize {})",
            w["vit_buckets"],
            w["vit_cost"],
            n["max_buckets"],
        )
    )
    if w.get("vit_buckets_note"):
        console.print(markup("  [dim]{}[/dim]", w["vit_buckets_note"]))
    cm = data["cost_model"]
    console.print(
        markup("[bold]estimates[/bold] [yellow]{}[/yellow]: {}", cm["label"], _figures(cm["npu"])), highlight=False
    )
    _cost_notes(console, data)


def _figures(npu: dict[str, Any]) -> str:
    return (
        f"{npu['sku']} {npu['fp16_flops'] / 1e15:g} PFLOPS FP16, {npu['hbm_bytes_per_s'] / 1e12:g} TB/s HBM "
        "(peak; sources in --json cost_model.npu.sources)"
    )


def print_human(console: Any, data: dict[str, Any]) -> None:
    _needs(console, data)
    if data.get("best"):
        rows = [_config_row(i + 1, r) + _load_cells(r, data) for i, r in enumerate(data["candidates"])]
        cols = _config_cols(data["needs"]) + _load_cols(data)
        print_left_out(console, print_table(console, cols, rows, title="best configurations (every one fits)"))
        if data.get("capacity"):
            _capacity(console, data)  # its footer names the host time and the sampler, the same as the estimate's
        else:
            _host_and_sampler(console, data["cost_model"])
        _timing_sources(console, data)
        console.print(markup("decoder graphs: {}", data.get("decoder_graphs_from") or ""))
        capped = [f["largest_batch"] for f in data["frontier"] if f["batch_cap_reached"]]
        if capped:  # the binary search stops there: the largest batch shown is a floor, not the most that fits
            console.print(markup("batch {} is the search's cap: a larger batch may fit too", capped[0]))
        _breakdown(console, data["best"])
        _neighbours(console, data["neighbours"])
        _searched(console, data)
        _hand_over(console, data)
        if data.get("preset_replaced"):  # -o named a preset tune wrote before (anything else needs --force)
            console.print(markup("[bold]replaced[/bold] the file that was at {}", data["preset_path"]))
        return
    elif not data["nearest"]:  # nothing fits at any batch or context: an empty table would say nothing
        console.print("[bold]nothing meets the needs[/bold], and no configuration fits at all (the reason follows)")
    else:
        rows = [[*_config_row(i + 1, r)[:8], "; ".join(r["gives_up"])] for i, r in enumerate(data["nearest"])]
        cols = [*_config_cols(data["needs"])[:8], Col("gives up", justify="left", fold=True)]
        print_left_out(
            console, print_table(console, cols, rows, title="nothing meets the needs; the nearest configurations")
        )
    _searched(console, data)


def _at_rate(console: Any, data: dict[str, Any]) -> None:
    """--rate without targets: what each row shows on one replica at that rate (simulated)."""
    sec = data["capacity"]
    cols = [Col("#"), Col("batch")]
    cols += [Col(f"{m} p{q} ms") for m in ("ttft", "tpot", "latency") for q in (50, 90, 99)]
    cols += [Col("req/s done"), Col("tok/s"), Col("preempted"), Col("NPU busy")]
    rows = []
    for i, row in enumerate(data["candidates"], 1):
        at = (row.get("capacity") or {}).get("at_rate") or {}
        cells = [str(i), str(row["batch_size"])]
        cells += [_ms((at.get(m) or {}).get(f"p{q}")) for m in ("ttft", "tpot", "latency") for q in (50, 90, 99)]
        cells += [
            f"{at.get('requests_per_s', 0):.2f}",
            f"{at.get('output_tokens_per_s', 0):.0f}",
            str(at.get("preemptions", 0)),
            _share(at.get("npu_busy_share")),
        ]
        rows.append(cells)
    title = f"at {sec['rate_rps']:g} req/s on one replica (vllm-rbln's scheduler simulated; {sec['time_model']})"
    print_left_out(console, print_table(console, cols, rows, title=title))
    _simulation_footer(console, sec, "{} requests, seed {}; arrivals: {}", sec["arrivals"])
    _charged(console, sec)


def _simulation_footer(console: Any, sec: dict[str, Any], runs: str, last: Any) -> None:
    """The dim line under a simulated table: the scheduler, the percentile definition, the runs and ``last``."""
    console.print(
        markup(f"[dim]{{}}; percentiles: {{}}; {runs}[/dim]", sec["scheduler"], sec["percentiles"],
               sec["requests_per_run"], sec["seed"], last),
        highlight=False,
    )  # fmt: skip


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _charged(console: Any, sec: dict[str, Any]) -> None:
    """What every simulated step is charged besides the graphs: the host time (its source, never 0 in silence), the
    sampler (an assumption), the decode rows' context end, and what the NPU busy share is."""
    _host_and_sampler(console, sec)
    ctx = sec.get("decode_context") or {}
    if ctx.get("rule"):
        console.print(markup("[bold]decode rows[/bold] {}", ctx["rule"]), highlight=False)
    if sec.get("npu_busy_share"):
        rest = "the rest is host time and waiting for requests: the gap to the card's limit"
        console.print(markup("[dim]{}; {}[/dim]", sec["npu_busy_share"], rest), highlight=False)


def _host_and_sampler(console: Any, sec: dict[str, Any]) -> None:
    """What every step is charged besides its graphs, estimated or simulated: the host time (its source, in yellow
    unless measured: never 0 in silence) and the sampler (an assumption). Printed once, under the last table."""
    host = sec.get("host_time") or {}
    colour = "" if host.get("measured") else "yellow"
    line = f"[bold]host time[/bold] [{colour}]{{}}[/{colour}]" if colour else "[bold]host time[/bold] {}"
    console.print(markup(line, host.get("source", "none")), highlight=False)
    if host.get("front_end"):
        colour = "" if host.get("front_end_counted") else "yellow"
        line = f"[bold]API server[/bold] [{colour}]{{}}[/{colour}]" if colour else "[bold]API server[/bold] {}"
        console.print(markup(line, host["front_end"]), highlight=False)
    console.print(markup("[bold]sampler[/bold] {}", sec.get("sampler") or "none"), highlight=False)


def _capacity(console: Any, data: dict[str, Any]) -> None:
    """Each row's simulated capacity under the latency targets, the figures there, and the fleet for --rate."""
    sec = data["capacity"]
    targets = sec["targets"]
    if not targets:
        _at_rate(console, data)
        return
    fleet = sec.get("rate_rps") is not None
    cols = [Col("#"), Col("batch"), Col("NPUs/replica"), Col("req/s per replica"), Col("req/s per NPU")]
    cols += [Col("own-context req/s", drop=2), Col("NPU busy")]
    cols += [Col(f"{t.split('=')[0]} ms") for t in targets]
    cols += [Col("replicas"), Col("NPUs")] if fleet else []
    cols.append(Col("bound by", justify="left", fold=True))
    rows = []
    for i, row in enumerate(data["candidates"], 1):
        cap = row.get("capacity") or {}
        at = cap.get("at_capacity") or cap.get("at_lightest") or {}
        figs = []
        for t in targets:
            metric, pct = t.split("=")[0].rsplit("_", 1)
            figs.append(_ms((at.get(metric) or {}).get(pct)))
        cells = [
            str(i),
            str(row["batch_size"]),
            str(row["npus"]),
            f"{cap.get('capacity_rps', 0):.2f}",
            f"{cap.get('capacity_per_npu_rps', 0):.2f}",
            f"{(cap.get('own_context') or {}).get('capacity_rps') or 0:.2f}",
            _share(cap.get("npu_busy_share")),
            *figs,
        ]
        if fleet:
            cells += [str(cap.get("replicas") or "-"), str(cap.get("npus") or "-")]
        cells.append(cap.get("unreachable_text") or cap.get("binding") or "-")
        rows.append(cells)
    title = f"capacity under {','.join(targets)} (vllm-rbln's scheduler simulated; device times: {sec['time_model']})"
    print_left_out(console, print_table(console, cols, rows, title=title))
    _simulation_footer(console, sec, "{} requests per run, seed {}; search top {}", sec["search_top"])
    _charged(console, sec)
    near = [i for i, row in enumerate(data["candidates"], 1) if (row.get("capacity") or {}).get("near_saturation")]
    if near:
        text = data["candidates"][near[0] - 1]["capacity"]["near_saturation"]
        console.print(markup("[yellow]{}[/yellow]: {}", ", ".join(f"#{i}" for i in near), text), highlight=False)
    best = sec.get("best")
    if best and fleet:
        console.print(
            markup(
                "[bold]fleet[/bold] {} req/s: {} of #1, {} NPU(s) ({} req/s per replica)",
                f"{sec['rate_rps']:g}",
                f"{best['replicas']} replica(s)",
                best["npus"],
                f"{best['capacity_rps']:.2f}",
            )
        )


def _timing_sources(console: Any, data: dict[str, Any]) -> None:
    """Where each row's figures come from (measured, fitted, roofline bound), and which rows rest on estimates."""
    cm = data["cost_model"]
    parts = []
    for i, row in enumerate(data["candidates"], 1):
        label = (row.get("timing") or {}).get("label", "roofline bound")
        parts.append(f"#{i} {label}")
    console.print(markup("[bold]ranked on[/bold] {}", cm.get("ranked_by") or "the roofline bound"), highlight=False)
    console.print(markup("[bold]figures[/bold] {}", " | ".join(parts)), highlight=False)
    if cm.get("measured_graphs"):
        for key, label in (cm.get("sources") or {}).items():
            if label != "roofline bound":
                console.print(markup("  [dim]{}: {}[/dim]", key, label), highlight=False)
        if cm.get("rows_on_estimates"):
            console.print(
                markup(
                    "  [yellow]{} row(s) rest partly on bounds[/yellow] (scaled by the measured ratio where their "
                    "kind was measured, else bare): profile their graphs (qvl profile) to measure them",
                    cm["rows_on_estimates"],
                )
            )
        if cm.get("rows_extrapolated"):
            console.print(
                markup(
                    "  [yellow]{} row(s) use figures extrapolated[/yellow] past the contexts qvl profile measured "
                    "(never below the last measured time): profile an artifact compiled for that context",
                    cm["rows_extrapolated"],
                )
            )


def _searched(console: Any, data: dict[str, Any]) -> None:
    console.print(
        markup(
            "[dim]searched {} configurations with the memory planner in {} s[/dim]",
            data["searched"],
            data["search_s"],
        )
    )


def _breakdown(console: Any, best: dict[str, Any]) -> None:
    """Where #1's time goes, per request and per graph, and where the figures came from."""
    est = best["estimate"]
    console.print(markup("#1 figures: {}", (best.get("timing") or {}).get("label", "roofline bound")))
    graphs = ", ".join(_step(g) for g in est["decode_graphs"])
    console.print(
        markup(
            "#1 per request: ViT {} ms (packed), prefill {} ms ({} chunks of {} ms), decode step by graph {}; "
            "mean running batch {}, bottleneck: {}",
            f"{est['vit_s_per_request'] * 1000:.2f}",
            _fig(est, "prefill_s_per_request"),
            f"{est['prefill_chunks_per_request']:.1f}",
            _fig(est, "prefill_s_per_chunk"),
            graphs,
            f"{est['mean_running_batch']:.2f}",
            est["bottleneck"],
        )
    )
    busy = est.get("npu_busy_share")
    console.print(
        markup(
            "#1 per step besides the graphs: sampler {} ms (prefill) / {} ms (decode), host {} ms (prefill) / {} ms "
            "(decode); NPU busy {} of each request (device time / device + host time)",
            _ms(est.get("prefill_sampler_s")),
            _ms(est.get("decode_sampler_s_per_step")),
            _ms(est.get("prefill_host_s")),
            _ms(est.get("decode_host_s_per_step")),
            _share(busy),
        )
    )


def _neighbours(console: Any, rows: list[dict[str, Any]]) -> None:
    cols = [
        Col("changed", justify="left", fold=True),
        Col("verdict", justify="left"),
        Col("why it lost", justify="left", fold=True),
    ]
    print_table(
        console,
        cols,
        [[r["change"], r["verdict"], r["why"]] for r in rows],
        title="rejected neighbours of #1",
    )


def _hand_over(console: Any, data: dict[str, Any]) -> None:
    import shlex

    cmds = data["commands"]
    console.print(markup("[bold]preset[/bold] verdict in its own dry run: {}", data["preset_verdict"]))
    console.print("[bold]compile and serve[/bold]")
    console.print(markup("  {}", cmds["dry_run"]))
    console.print(markup("  {}", cmds["compile"]))
    console.print(markup("  {}", cmds["serve"]))
    if cmds.get("deploy"):  # --rate: the replicas that carry it (serve runs one)
        word = "replica" if cmds["replicas"] == 1 else "replicas"
        console.print(markup("  {}  [dim]({} {})[/dim]", cmds["deploy"], cmds["replicas"], word))
    env = " ".join(f"{k}={v}" for k, v in cmds["env"].items())
    # one line, never wrapped: it is the exact command `qvl serve` runs (serving.command.vllm_launch)
    console.print(markup("  [dim]which runs: {} {}[/dim]", env, shlex.join(cmds["vllm"])), soft_wrap=True)
    if data.get("preset_path"):
        console.print(markup("[bold]written[/bold] {}", data["preset_path"]))
    else:
        console.print("[bold]tuned preset[/bold] (save it as tuned.yaml, or pass -o tuned.yaml)")
        console.print(data["preset_yaml"], markup=False, highlight=False, end="")
