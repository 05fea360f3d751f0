"""`qvl tune`: from a workload and its needs to the preset that fits and costs least, with the commands.

Options only: ``qwenvl_rbln/tuning/`` searches (the memory planner checks every configuration, a roofline bound
ranks them) and ``qwenvl_rbln/views/tune.py`` renders the result.
"""

from __future__ import annotations

from pathlib import Path

import typer

from qwenvl_rbln.commands.common import JsonOpt, ModelOpt, PlotOpt


def register(app: typer.Typer) -> None:
    @app.command("tune")
    def tune_cmd(
        model: str = ModelOpt,
        workload: Path = typer.Option(
            ...,
            "--workload",
            "-w",
            help='Image sizes from logs, as bucket-plan reads them: JSONL {"width","height","count"} (+ "images": '
            'N for N images in one request, "frames"/"fps" for videos) or CSV.',
        ),
        batch_trace: Path = typer.Option(
            None, "--batch-trace", help="Observed running-batch sizes: a JSON list or one integer per line."
        ),
        context: int = typer.Option(..., "--context", help="The longest request (tokens) the deployment must serve."),
        min_batch: int = typer.Option(1, "--min-batch", help="Requests that must run at once, each at --context."),
        devices: int = typer.Option(1, "--devices", help="NPUs to use: 2 allows the ViT on its own NPU (device 1)."),
        objective: str = typer.Option("throughput", "--objective", help="throughput (output tokens/s) or latency."),
        concurrency: int = typer.Option(
            None,
            "--concurrency",
            help="Requests in flight at once (no --batch-trace): throughput is ranked at this load "
            "(default: half the largest batch that fits).",
        ),
        max_buckets: int = typer.Option(
            3, "--max-buckets", "-k", help="At most K ViT buckets, and K decoder graphs (each is a compiled graph)."
        ),
        prompt_tokens: int = typer.Option(128, "--prompt-tokens", min=0, help="Text tokens per request (estimate)."),
        output_tokens: int = typer.Option(256, "--output-tokens", min=1, help="Generated tokens per request."),
        device_memory: str = typer.Option(
            None, "--device-memory", help="Usable memory per NPU if not the nominal 140 GiB (e.g. 120GiB)."
        ),
        slo: str = typer.Option(
            None,
            "--slo",
            help="Latency targets, e.g. ttft_p90=2s,tpot_p99=100ms (ttft, tpot or latency at p50/p90/p99): each "
            "candidate's capacity under them, from a simulation of vllm-rbln's scheduler.",
            show_default=False,
        ),
        rate: float = typer.Option(
            None,
            "--rate",
            help="Requests/s the fleet must carry: with --slo the replicas and NPUs (ranked by NPUs); alone, each "
            "candidate's simulated TTFT/TPOT/latency percentiles on one replica at that rate.",
        ),
        sim_requests: int = typer.Option(
            None, "--sim-requests", help="Requests per simulated run (--slo, --rate; default 1000).", show_default=False
        ),
        seed: int = typer.Option(
            0,
            "--seed",
            help="The simulated runs' seed (--slo, --rate): same seed, same answer; the arrivals are those `vllm "
            "bench serve --seed` sends.",
        ),
        arrivals: Path = typer.Option(
            None,
            "--arrivals",
            help="Replay these arrival times (seconds; JSON list or one per line) instead of Poisson arrivals "
            "(--slo, --rate): the trace's shape, scaled to each rate simulated.",
        ),
        output: Path = typer.Option(None, "--output", "-o", help="Write the tuned preset here (default: stdout)."),
        force: bool = typer.Option(
            False, "--force", help="Let -o replace a file that qvl tune did not write (its own presets need not)."
        ),
        plot: Path = PlotOpt,
        as_json: bool = JsonOpt,
    ) -> None:
        """Search batch, context, KV partition, ViT buckets, decoder graphs and placement for a workload; every
        configuration checked by the memory planner, ranked by a roofline estimate (a bound) except where `qvl
        profile` measured a graph; every row says which. With --slo (and --rate), ranked by the capacity a simulation
        of vllm-rbln's scheduler finds under the latency targets (and the NPUs the rate needs)."""
        from qwenvl_rbln.commands.common import check_plot
        from qwenvl_rbln.tuning.capacity import check_rate, parse_slo, read_arrivals
        from qwenvl_rbln.tuning.result import check_output, write_preset
        from qwenvl_rbln.tuning.search import Needs
        from qwenvl_rbln.tuning.tune import run_tune
        from qwenvl_rbln.views import render
        from qwenvl_rbln.views.tune import print_human

        plot = check_plot(plot)
        slos = tuple(parse_slo(slo)) if slo is not None else ()
        check_rate(rate, list(slos))
        for given, what in ((arrivals, "--arrivals replays a trace"), (sim_requests, "--sim-requests sizes the runs")):
            if given is not None and not slos and rate is None:
                from qwenvl_rbln.errors import InputError

                raise InputError(f"{what} for the serving simulation", "add --slo and/or --rate")
        replay = read_arrivals(arrivals) if arrivals is not None else None
        if output is not None:
            check_output(output, force=force)
        needs = Needs(
            model=model,
            context=context,
            min_batch=min_batch,
            devices=devices,
            objective=objective,
            max_buckets=max_buckets,
            device_memory=device_memory,
            concurrency=concurrency,
            slos=slos,
            rate=rate,
            sim_requests=1000 if sim_requests is None else sim_requests,
            seed=seed,
            arrivals=replay,
        )
        data, error = run_tune(
            needs,
            workload,
            batch_trace,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            output=output,
        )
        if error is None and output is not None:
            data["preset_replaced"] = write_preset(output, data["preset_yaml"], force=force)
        render.emit(data, as_json=as_json, human=print_human, error=error)
        if plot is not None:
            _plot(data, plot)
        if error is not None:
            raise error


def _plot(data: dict, path: Path) -> None:
    """The candidates (or, on exit 4, the nearest configurations) on throughput against TTFT, after the report."""
    from qwenvl_rbln.commands.common import plotted
    from qwenvl_rbln.views import render
    from qwenvl_rbln.views.plots.tune import draw_tune, from_tune_report

    shape = from_tune_report(data)
    if not shape["candidates"]:  # nothing fits at all (a model too large for the card): nothing has a cost
        render.warn("--plot: no configuration fits, so none has an estimate to draw; no picture written")
        return
    draw_tune(shape, path)
    plotted(path)
