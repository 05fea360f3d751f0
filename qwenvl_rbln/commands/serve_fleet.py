"""`qvl serve --workers N` / `--devices LIST`: the fleet's options, its dry run as one script, and its run (every
engine and the router as qvl's children, supervised: ``serving/fleet_run.py``); `qvl bench-serve`'s fleet size."""

from __future__ import annotations

from typing import Any

import typer

WorkersOpt = typer.Option(
    None,
    "--workers",
    help="Serve N replicas, one vLLM engine each on its own NPU(s) from 0 up, behind vllm-router on --host/--port "
    "(as `qvl infer --batch-file --workers`).",
    show_default=False,
)
DevicesOpt = typer.Option(
    None,
    "--devices",
    help="The NPUs of the replicas, e.g. 0,1,2,3: each replica takes the compiled placement's number of NPUs in "
    "order; one engine per replica behind vllm-router.",
    show_default=False,
)
RouterArgsOpt = typer.Option(
    None,
    "--router-args",
    help="Flags for vllm-router in front of the engines, e.g. '--policy round_robin --queue-size 50'.",
    show_default=False,
)
BenchWorkersOpt = typer.Option(
    None,
    "--workers",
    help="The fleet's engine count (`qvl serve --workers N`): measured as one service at N x the compiled batch "
    "(default: what the server's /readiness reports, else 1).",
    show_default=False,
)


def unshown(warnings: list[str], checks: list[dict[str, Any]]) -> list[str]:
    """The warnings no warning check carries already: a human dry run prints every check as a ``# warn`` line, so a
    warning that is also a check is said once, there (with --json, stdout is data: stderr still says it)."""
    said = [str(c.get("detail")) for c in checks if not c.get("ok")]
    return [line for line in warnings if not any(line in detail for detail in said)]


def serve_fleet(
    opts: Any, workers: int | None, devices: str | None, router_args: str | None, *, dry_run: bool, as_json: bool
) -> bool:
    """Serve (or print) a fleet when the flags ask for one; False for one engine (today's `qvl serve`)."""
    import os

    from qwenvl_rbln.batch.options import parse_devices
    from qwenvl_rbln.errors import InputError
    from qwenvl_rbln.serving.engine import check_runnable, resolve
    from qwenvl_rbln.serving.fleet import fleet_command, replicas_wanted

    ids = parse_devices(devices)
    if not replicas_wanted(workers, ids):
        if router_args is not None:
            raise InputError(
                "--router-args needs a fleet: one engine has no router", "add --workers N or --devices LIST"
            )
        return False
    emulator_env = None
    if opts.emulate:
        from qwenvl_rbln.backends import emulator

        emulator_env = emulator.engine_environment(os.environ)
    fleet, warnings = fleet_command(
        opts,
        os.environ,
        workers=workers,
        devices=ids,
        router_extra=router_args,
        emulator_env=emulator_env,
        host_npus=_host_npus(opts.emulate),
    )
    if not dry_run and opts.vllm_rbln is not None:
        check_runnable(resolve(opts.vllm_rbln))
    _fleet(fleet, warnings, dry_run=dry_run, as_json=as_json)
    return True


def _host_npus(emulate: bool) -> int | None:
    """The NPUs this host has (the emulated host's under --emulate); None where ``rebel`` does not answer here."""
    if emulate:
        from qwenvl_rbln.backends.emulator.rebel_api import device_count

        return device_count()
    from qwenvl_rbln.batch.ray_cluster import host_npu_count

    return host_npu_count()


def fleet_human(console: Any, d: dict[str, Any]) -> None:
    """The fleet as one shell script: the checks as comments, each engine in the background, the router last."""
    import shlex

    from qwenvl_rbln.serving.options import REDACTED

    for check in d["checks"]:
        mark = "ok  " if check["ok"] else "warn"
        console.print(f"# {mark} {check['check']}: {check['detail']}", markup=False, highlight=False, soft_wrap=True)
    console.print("trap 'kill 0' INT TERM HUP EXIT", markup=False, highlight=False)
    for proc in d["processes"]:
        if proc["name"] == "router":  # as qvl runs it: the router once every engine answers /health
            urls = " ".join(f"{e['url']}/health" for e in d["engines"])
            wait = f"for u in {urls}; do until curl -sf -o /dev/null $u; do sleep 1; done; done"
            console.print(f"# every engine up first (vllm-router would listen once one is)\n{wait}", markup=False)
        env = proc["env"]
        hidden = [k for k, v in env.items() if v == REDACTED]
        if hidden:
            console.print(f"# {proc['name']}: {', '.join(hidden)} set in its environment ({REDACTED})", markup=False)
        words = ["env", *(f"-u{k}" for k, v in env.items() if v is None)]
        words += [f"{k}={v}" for k, v in env.items() if v is not None and v != REDACTED]
        last = proc is d["processes"][-1]
        line = shlex.join([*words, *proc["argv"]]) + ("" if last else " &")
        console.print(f"# {proc['name']}\n{line}", markup=False, highlight=False, soft_wrap=True)


def _fleet(fleet: Any, warnings: list[str], *, dry_run: bool, as_json: bool) -> None:
    """``qvl serve --workers/--devices``: print the fleet, or run it (every process qvl's child, supervised)."""
    import os
    import shutil

    from qwenvl_rbln.errors import EXIT_INTERRUPTED, BackendError, DependencyMissing
    from qwenvl_rbln.serving import emulated, fleet_run
    from qwenvl_rbln.serving.fleet import ROUTER, ROUTER_INSTALL_HINT
    from qwenvl_rbln.serving.launch import find_vllm
    from qwenvl_rbln.views import render

    label = "emulated NPU: " if fleet.emulated else ""
    for line in unshown(warnings, fleet.checks) if dry_run and not as_json else warnings:
        render.warn(label + line)
    if dry_run:
        render.emit(fleet.to_dict(), as_json=as_json, human=fleet_human)
        return
    held = _ports_free(fleet)
    members = []
    prefix = emulated.LABEL if fleet.emulated else ""
    for name, launch in fleet.processes:
        env = launch.exec_env(os.environ)
        argv = list(launch.argv)
        if name.startswith("engine"):
            argv[0] = find_vllm(env)
            url = f"http://127.0.0.1:{fleet.ports[int(name.split('-')[1])]}/health"
        else:
            url = None
            if argv[0] == ROUTER:
                found = shutil.which(ROUTER, path=env.get("PATH", ""))
                if found is None:
                    raise DependencyMissing(f"`{ROUTER}` is not on PATH, so nothing was started", ROUTER_INSTALL_HINT)
                argv[0] = found
        engine = name.startswith("engine")
        listen = held[int(name.split("-")[1])].for_vllm(argv[0]) if engine else None
        members.append(
            fleet_run.Member(
                name,
                argv,
                env,
                f"{prefix}{name} | ",
                health_url=url,
                restart=engine,
                after_engines=not engine,
                listen=listen,
            )
        )
    render.info(f"qvl: {label}a fleet of {len(fleet.engines)} engines behind vllm-router: " + ", ".join(fleet.names))
    render.info(f"qvl: {label}metrics: {metrics_line(fleet.to_dict())}")
    say = lambda line: render.info(f"qvl: {label}{line}")  # noqa: E731
    try:
        code = fleet_run.Fleet(members, say, ready_url=public_health(fleet)).run()
    except fleet_run.FleetFailed as exc:
        raise BackendError(
            f"the fleet stopped: {exc} (its output is above, every line prefixed with its process's name); no "
            "process of it is left",
            "read the first error line above; rerun with --dry-run to see every command and environment",
        ) from None
    if code == EXIT_INTERRUPTED:
        render.info(f"qvl: {label}stopped; no process of the fleet is left")
        raise typer.Exit(code)


def metrics_line(d: dict[str, Any]) -> str:
    """Where the operator reads the fleet's metrics: the router's own and each engine's, each on loopback."""
    engines = ", ".join(f"{e['name']} {e['url']}/metrics" for e in d["engines"])
    return f"the router's {d['router']['metrics']}; {engines}"


def public_health(fleet: Any) -> str:
    """The fleet's public /health (the front door's, else the router's), as this host reaches it."""
    argv = (fleet.front or fleet.router).argv
    host, port = (argv[3], argv[4]) if fleet.front is not None else (argv[2], argv[4])
    from qwenvl_rbln.serving.options import host_port

    reach = "127.0.0.1" if host in ("0.0.0.0", "", "*") else ("::1" if host == "::" else host)
    return f"http://{host_port(reach, int(port))}/health"


def _ports_free(fleet: Any) -> list[Any]:
    """Every loopback port the fleet takes (its engines', the router's metrics, the router's own behind a front
    door) is free, or one line before anything starts: an engine that cannot bind would only be restarted until qvl
    gives up. Each engine's port is held by qvl from here and handed to that engine (``serving/port.py``)."""
    from qwenvl_rbln.serving import port

    checked = [fleet.metrics_port, *([fleet.router_port] if fleet.front is not None else [])]
    return port.hold_fleet(fleet.ports, checked)


def fleet_size(host: str, port: int) -> int | None:
    """The engines behind a running fleet's router (its public ``/readiness``: ``total_workers``); None for one
    engine (vLLM has no such route) or no answer."""
    import json
    import urllib.request

    from qwenvl_rbln.serving.options import host_port

    try:
        with urllib.request.urlopen(f"http://{host_port(host, port)}/readiness", timeout=3) as resp:
            total = json.loads(resp.read()).get("total_workers")
    except (OSError, ValueError, AttributeError):
        return None
    return total if type(total) is int and total > 0 else None
