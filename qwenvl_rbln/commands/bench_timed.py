"""``qvl bench-serve`` with a server of its own: the timed emulator (``--emulate --time-model``, at CPU or device
speed) or, on an NPU host, the real engine (``--host-time``). Every such run logs each engine step
(``serving/step_log.py``) and reports the host's time per step by kind, fitted (``tuning/host_measure.py``); a valid
run at scale 1 (device speed, or the NPU) records it in timings.json's ``host_time`` section."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import typer

from qwenvl_rbln.commands.emulate_speed import load_model, resolve
from qwenvl_rbln.commands.serve_cmd import _emulated
from qwenvl_rbln.errors import InputError

HostTimeOpt = typer.Option(
    False,
    "--host-time",
    help="On an NPU host: start a server of its own with the engine-step log, benchmark it, and record the host's "
    "time per engine step (step wall time less the runtime's device time) in timings.json. With --emulate "
    "--emulate-speed device this is always done.",
)


def timed_bench(opts: Any, time_model: str | None, scale: float | None, rates: list[float] | None, *, speed: str,
                host_time: bool, dry_run: bool, as_json: bool) -> None:  # fmt: skip
    """Start the server (timed emulator or the NPU), benchmark it at each rate, report and record host time."""
    from qwenvl_rbln.backends.emulator import timed
    from qwenvl_rbln.serving.bench import bench_command
    from qwenvl_rbln.serving.command import resolve_directory, serve_command
    from qwenvl_rbln.serving.launch import find_vllm
    from qwenvl_rbln.serving.options import ServeOptions
    from qwenvl_rbln.serving.timed_bench import TimedRun, free_port, run
    from qwenvl_rbln.views import render
    from qwenvl_rbln.views.timed_bench import human

    if opts.emulate:
        speed, scale = resolve(emulate=True, speed=speed, time_model=time_model, scale=scale)
        if time_model is None:
            raise InputError(
                "--request-rate and --host-time go with --time-model here (the timed emulator)",
                "qvl bench-serve DIR --emulate --emulate-speed device --time-model roofline:Qwen/Qwen3-VL-2B-Instruct",
            )
    elif time_model is not None or scale is not None or speed != "cpu" or not host_time:
        raise InputError(
            "--time-model, --time-scale, --emulate-speed and --request-rate need --emulate (the timed emulator), or "
            "--host-time on an NPU host (a server of bench-serve's own)",
            "qvl bench-serve DIR --emulate --emulate-speed device --time-model roofline:Qwen/Qwen3-VL-2B-Instruct",
        )
    else:
        speed, scale = "npu", 1.0
    bad = [r for r in rates or [] if not r > 0]
    if bad:
        raise InputError(f"--request-rate {bad[0]} is not a positive rate", "requests per device second, e.g. 2")
    directory, _ = resolve_directory(opts.directory, opts.preset, "bench-serve")
    model = load_model(time_model, directory) if time_model is not None else None
    opts = dataclasses.replace(opts, directory=directory, port=free_port())
    bench, warnings = bench_command(opts, os.environ)
    serve_opts = ServeOptions(directory=opts.directory, preset=opts.preset, port=opts.port,
                              served_model_name=opts.served_model_name, emulate=opts.emulate)  # fmt: skip
    serve, _ = serve_command(serve_opts, os.environ)
    if opts.emulate:
        _emulated(bench, serve=False)
        _emulated(serve, serve=True)
    name = timed.model_name(model) if model is not None else "the NPU's own"
    plan = TimedRun(model.to_json() if model is not None else None, name, scale, tuple(rates or [float("inf")]),
                    speed)  # fmt: skip
    for line in warnings:
        render.warn(("emulated NPU: " if opts.emulate else "") + line)
    if dry_run:
        render.emit({"serve": serve.to_dict(), "bench": bench.to_dict(), "rates": list(plan.rates), "speed": speed,
                     "time_scale": scale}, as_json=as_json, human=lambda c, d: c.print_json(data=d))  # fmt: skip
        return
    doc = run(serve, bench, plan, os.environ, find_vllm(serve.exec_env(os.environ)), timed)
    doc["host_time"] = host_time_section(doc, plan, directory)
    render.emit(doc, as_json=as_json, human=human)
    if not doc["valid"]:
        raise typer.Exit(1)


def host_time_section(doc: dict[str, Any], plan: Any, directory: Path) -> dict[str, Any] | None:
    """The host time per step of every run, fitted by kind; recorded in timings.json when the run is valid and at
    the NPU's pace (scale 1: device speed, or the NPU itself)."""
    from datetime import UTC, datetime

    from qwenvl_rbln.serving.step_log import PROFILE_ENV, Step
    from qwenvl_rbln.tuning import host_measure, host_time

    steps = [Step.from_dict(s) for r in doc["runs"] for s in r["steps"]]
    if not steps:
        return None
    host = host_measure.host_info()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    where = (f"{host['cpu']}, {host['cores']} cores ({host['usable_cores']} usable), load average "
             f"{'/'.join(f'{x:g}' for x in host['loadavg'])}")  # fmt: skip
    if plan.model is None:
        how = "the NPU's engine (step wall time less the runtime's device time)"
    else:
        how = f"the real vLLM + vllm-rbln over the emulator ({plan.speed} speed, scale {plan.scale:g}), host time real"
    source = f"measured {when} by qvl bench-serve on {where}: {how}"
    fit = host_measure.fit(steps, source, {**host, "artifact": directory.name, "time_model": plan.model_name})
    at_pace = plan.scale == 1 and plan.speed in ("device", "npu")
    if not at_pace:
        recorded = (f"not recorded: at scale {plan.scale:g} with the graphs computed on the CPU the host time is not "
                    "the NPU's pace (use --emulate-speed device)")  # fmt: skip
    elif os.environ.get(PROFILE_ENV):
        recorded = f"not recorded: the steps ran under cProfile ({PROFILE_ENV}), which slows the host"
    elif not doc["valid"]:
        recorded = "not recorded: the run is invalid"
    elif not fit.kinds:
        recorded = "not recorded: too few steps to fit"
    else:
        key = f"{host['hostname']} | {host['cpu']} | " + ("npu" if plan.model is None else "emulated device speed")
        path = host_time.record(fit.model, key, None)
        recorded = f"recorded in {path}, host_time[{key!r}]"
    return {"steps": len(steps), "fit": fit.to_dict(), "recorded": recorded, "host": host}
