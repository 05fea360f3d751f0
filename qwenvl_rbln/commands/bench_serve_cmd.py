"""`qvl bench-serve`: load-test a running `qvl serve` (one engine or a fleet) with vLLM's own `vllm bench serve`, or,
with ``--emulate --time-model`` (or ``--host-time`` on an NPU host), a server of its own (``bench_timed.py``): figures
in device time and the host's time per engine step.

The command line is built in ``qwenvl_rbln/serving/`` (``bench.py``, ``timed_bench.py``) and printed (``--dry-run``)
or run, exactly as `qvl serve`'s is; the options and helpers both commands share live in ``serve_cmd``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from qwenvl_rbln.commands import bench_timed, emulate_speed, serve_fleet
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
            "time under this model, and report in device time and the host's time per engine step: "
            + emulate_speed.TimeModelHelp
            + ".",
            show_default=False,
        ),
        time_scale: float = typer.Option(
            None,
            "--time-scale",
            help="With --time-model: wall seconds per device second (default 1 with --emulate-speed device, else "
            f"{emulate_speed.DEFAULT_CPU_SCALE:g}: the tiny model's CPU work must fit inside every hold).",
            show_default=False,
        ),
        speed: str = emulate_speed.EmulateSpeedOpt,
        host_time: bool = bench_timed.HostTimeOpt,
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
        if time_model is not None or request_rate or time_scale is not None or speed != "cpu" or host_time:
            bench_timed.timed_bench(opts, time_model, time_scale, request_rate, speed=speed, host_time=host_time,
                                    dry_run=dry_run, as_json=as_json)  # fmt: skip
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
