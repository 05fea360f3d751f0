"""`qvl bench-serve`: load-test a running `qvl serve` (one engine or a fleet) with vLLM's own `vllm bench serve`, or,
with ``--emulate --time-model``, a timed emulated server of its own measured in device time.

The command line is built in ``qwenvl_rbln/serving/`` (``bench.py``, ``timed_bench.py``) and printed (``--dry-run``)
or run, exactly as `qvl serve`'s is; the options and helpers both commands share live in ``serve_cmd``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from qwenvl_rbln.commands import serve_fleet
from qwenvl_rbln.commands.common import JsonOpt
from qwenvl_rbln.commands.serve_cmd import (
    BenchHostOpt,
    DirArg,
    DryRunOpt,
    EmulateOpt,
    KeyFileOpt,
    NameOpt,
    PassThrough,
    PortOpt,
    PresetArgOpt,
    _emulated,
    _run,
    _split,
)


def _timed_bench(
    opts: Any, model_file: Path | None, scale: float, rates: list[float] | None, *, dry_run: bool, as_json: bool
) -> None:
    """``bench-serve --emulate --time-model``: a timed emulated server of its own, benchmarked at each rate."""
    import dataclasses
    import math
    import os

    from qwenvl_rbln.backends.emulator import timed
    from qwenvl_rbln.errors import InputError, QvlError
    from qwenvl_rbln.serving.bench import bench_command
    from qwenvl_rbln.serving.command import serve_command
    from qwenvl_rbln.serving.launch import find_vllm
    from qwenvl_rbln.serving.options import ServeOptions
    from qwenvl_rbln.serving.timed_bench import TimedRun, free_port, run
    from qwenvl_rbln.tuning.device_time import model_for_flag
    from qwenvl_rbln.views import render

    if not opts.emulate or model_file is None:
        raise InputError(
            "--time-model and --request-rate go together, and only with --emulate (the timed emulator)",
            "qvl bench-serve DIR --emulate --time-model model.json --time-scale 100 --request-rate 2",
        )
    if not (math.isfinite(scale) and scale > 0):
        raise InputError(f"--time-scale {scale} is not a positive number", "e.g. --time-scale 100")
    bad = [r for r in rates or [] if not r > 0]
    if bad:
        raise InputError(f"--request-rate {bad[0]} is not a positive rate", "requests per device second, e.g. 2")
    from qwenvl_rbln.serving.command import resolve_directory

    directory, _ = resolve_directory(opts.directory, opts.preset, "bench-serve")
    try:
        model = model_for_flag(str(model_file), directory)
    except (OSError, ValueError, KeyError, TypeError, QvlError) as exc:
        raise InputError(
            f"--time-model {model_file} cannot be read as a device-time model ({exc})",
            "roofline:HUB_ID, timings:timings.json, or a DeviceTimeModel.to_json file",
        ) from None
    opts = dataclasses.replace(opts, directory=directory, port=free_port())
    bench, warnings = bench_command(opts, os.environ)
    _emulated(bench, serve=False)
    serve_opts = ServeOptions(directory=opts.directory, preset=opts.preset, port=opts.port,
                              served_model_name=opts.served_model_name, emulate=True)  # fmt: skip
    serve, _ = serve_command(serve_opts, os.environ)
    _emulated(serve, serve=True)
    plan = TimedRun(model.to_json(), timed.model_name(model), scale, tuple(rates or [float("inf")]))
    for line in warnings:
        render.warn("emulated NPU: " + line)
    if dry_run:
        render.emit({"serve": serve.to_dict(), "bench": bench.to_dict(), "rates": list(plan.rates)},
                    as_json=as_json, human=lambda c, d: c.print_json(data=d))  # fmt: skip
        return
    doc = run(serve, bench, plan, os.environ, find_vllm(serve.exec_env(os.environ)), timed)
    render.emit(doc, as_json=as_json, human=_timed_human)
    if not doc["valid"]:
        raise typer.Exit(1)


def _why_invalid(run: dict[str, Any]) -> str:
    calls = run["calls"]
    why = [f"{calls['overruns']} of {calls['calls']} calls overran their hold"] if calls["overruns"] else []
    if run["failed"] or not run["completed"]:
        why.append(f"{run['failed']} of {run['completed'] + run['failed']} requests failed")
    return "; ".join(why)


def _timed_human(console: Any, d: dict[str, Any]) -> None:
    console.print(d["label"], markup=False, highlight=False)
    console.print("figures in device time (the scale taken out); latencies in ms", markup=False, highlight=False)
    for r in d["runs"]:
        calls = r["calls"]
        mark = "valid" if r["valid"] else f"INVALID: {_why_invalid(r)}"
        console.print(
            f"rate {r['rate']:g} req/s: {r['completed']} done, {r['failed']} failed, "
            f"{r['request_throughput']:.3f} req/s, {r['output_throughput']:.1f} tok/s; "
            + "; ".join(
                f"{m.upper()} p50/p90/p99 {r[f'p50_{m}_ms']:.3f}/{r[f'p90_{m}_ms']:.3f}/{r[f'p99_{m}_ms']:.3f}"
                for m in ("ttft", "tpot", "itl")
            )
            + f"; CPU share {calls['cpu_share']:.1%} (worst call {calls['worst_cpu_share']:.0%}); {mark}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def register(app: typer.Typer) -> None:
    @app.command("bench-serve")
    def bench_serve(
        directory: Path = DirArg,
        vllm_args: list[str] = PassThrough,
        preset: str = PresetArgOpt,
        host: str = BenchHostOpt,
        port: int = PortOpt,
        served_model_name: str = NameOpt,
        num_prompts: int = typer.Option(100, "--num-prompts", min=1, help="Requests to send."),
        input_len: int = typer.Option(128, "--input-len", min=1, help="Random text tokens per request."),
        output_len: int = typer.Option(128, "--output-len", min=1, help="Tokens to generate per request."),
        seed: int = typer.Option(0, "--seed", help="Random seed of the generated requests."),
        api_key_file: Path = KeyFileOpt,
        emulate: bool = EmulateOpt,
        workers: int = serve_fleet.BenchWorkersOpt,
        time_model: str = typer.Option(
            None,
            "--time-model",
            help="With --emulate: start a timed emulated server for this run, every graph call held for its device "
            "time under this model, and report in device time: roofline:HUB_ID (that model's roofline at DIR's "
            "compiled shapes), timings:FILE (qvl profile's timings.json) or a DeviceTimeModel JSON file.",
            show_default=False,
        ),
        time_scale: float = typer.Option(
            1.0, "--time-scale", help="With --time-model: wall seconds per device second (keep the CPU's share small)."
        ),
        request_rate: list[float] = typer.Option(
            None,
            "--request-rate",
            help="With --time-model: Poisson arrivals at this many requests per device second (repeat for several "
            "runs on one server; default: all at once).",
            show_default=False,
        ),
        dry_run: bool = DryRunOpt,
        as_json: bool = JsonOpt,
    ) -> None:
        """Load-test a running `qvl serve` with vLLM's own `vllm bench serve` (random images sized to the buckets)."""
        import os

        from qwenvl_rbln.backends.emulator import refuse_real_rebel, requested
        from qwenvl_rbln.serving.bench import bench_command
        from qwenvl_rbln.serving.options import BenchOptions

        directory, extra = _split(directory, vllm_args)
        opts = BenchOptions(
            directory=directory,
            preset=preset,
            host=host,
            port=port,
            served_model_name=served_model_name,
            num_prompts=num_prompts,
            input_len=input_len,
            output_len=output_len,
            seed=seed,
            extra=extra,
            api_key_file=api_key_file,
            emulate=requested(emulate),
            workers=workers if workers is not None or dry_run else serve_fleet.fleet_size(host, port),
        )
        if opts.emulate:
            refuse_real_rebel("--emulate")
        if time_model is not None or request_rate:
            _timed_bench(opts, time_model, time_scale, request_rate, dry_run=dry_run, as_json=as_json)
            return
        launch, warnings = bench_command(opts, os.environ)
        if opts.emulate:
            _emulated(launch, serve=False)
        if dry_run:
            _run(launch, warnings, dry_run=dry_run, as_json=as_json)
            return
        _bench(launch, warnings)


def _bench(launch: Any, warnings: list[str]) -> None:
    """``vllm bench serve`` as qvl's child (its output passed through, labelled under --emulate): its exit code is 0
    even when every request failed, so its summary decides (``bench.Outcome``)."""
    import os
    import shlex

    from qwenvl_rbln.errors import EXIT_INTERRUPTED, BackendError
    from qwenvl_rbln.serving import emulated, supervise
    from qwenvl_rbln.serving.bench import Outcome
    from qwenvl_rbln.serving.launch import find_vllm
    from qwenvl_rbln.views import render

    label = "emulated NPU: " if launch.emulated else ""
    for line in warnings:
        render.warn(label + line)
    env = launch.exec_env(os.environ)
    argv = [find_vllm(env), *launch.argv[1:]]
    render.info(f"qvl: {label}{shlex.join(launch.argv)}")
    outcome = Outcome()
    code = supervise.run(argv, env, emulated.LABEL if launch.emulated else "", watch=outcome.see)
    if code == EXIT_INTERRUPTED:
        raise typer.Exit(code)
    if code != 0:
        raise BackendError(
            f"`vllm bench serve` exited with code {code} (its output is above)",
            "read the first error line above; rerun with --dry-run to see the exact command and environment",
        )
    problem = outcome.problem()
    if problem is not None:
        raise BackendError(
            f"`vllm bench serve`: {problem}, so its figures measure no server (the errors are above)",
            "check that `qvl serve` is up on --host/--port and answers /health (the port is --port, default 8000)",
        )
