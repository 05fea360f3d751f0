"""`qvl serve`: hand a compiled artifact to vllm-rbln, checked before anything starts (`qvl bench-serve`, in
``bench_serve_cmd``, shares its options and helpers).

The command builds its command line in ``qwenvl_rbln/serving/`` (preflight, argv, environment, as data) and
then either print it (``--dry-run``; ``--json``: ``{"argv": [...], "env": {...}, "checks": [...]}``) or exec
``vllm`` with exactly that argv and environment. The human ``--dry-run`` output is a shell script: the checks as
comments, the environment as ``export``/``unset`` lines, then the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from qwenvl_rbln.commands import emulate_speed, serve_fleet
from qwenvl_rbln.commands.common import JsonOpt
from qwenvl_rbln.commands.serve_fleet import unshown  # noqa: F401  (deploy_cmd and the tests import it here)

DirArg = typer.Argument(
    None,
    metavar="[DIR]",
    help="Compiled artifact directory; default as for `qvl infer`: the directory the last `qvl compile` wrote, "
    "else the preset's output_dir.",
    show_default=False,
)
PassThrough = typer.Argument(
    None,
    metavar="[-- VLLM_ARGS]",
    help="Anything after `--` goes to vllm unchanged (conflicts are refused).",
    show_default=False,
)
DryRunOpt = typer.Option(
    False, "--dry-run", help="Print the checks, the environment and the exact argv; start nothing."
)
HostOpt = typer.Option("127.0.0.1", "--host", help="Address the server listens on (0.0.0.0: every interface).")
BenchHostOpt = typer.Option(
    "127.0.0.1", "--host", help="Address of the running `qvl serve` to connect to (e.g. 127.0.0.1 or its host name)."
)
PortOpt = typer.Option(8000, "--port", min=1, max=65535, help="Server port.")
NameOpt = typer.Option(
    None, "--served-model-name", help="Model name clients send (default: the compiled model's hub id, else DIR's name)."
)
KeyFileOpt = typer.Option(
    None,
    "--api-key-file",
    help="File whose first line is the API key (default: $VLLM_API_KEY); handed to vLLM in its environment, never "
    "in argv.",
    show_default=False,
)
PresetArgOpt = typer.Option(
    None, "--preset", "-p", help="Preset for the default DIR and runtime choices (default: the artifact's own)."
)


def _split(directory: Path | None, extra: list[str] | None) -> tuple[Path | None, list[str]]:
    """`qvl serve -- --flag x` (no DIR): click hands the first pass-through word over as DIR; give it back."""
    extra = list(extra or [])
    if directory is not None and str(directory).startswith("-"):
        return None, [str(directory), *extra]
    return directory, extra


def human(console: Any, d: dict[str, Any]) -> None:
    import shlex

    from qwenvl_rbln.serving.options import REDACTED

    for check in d["checks"]:
        mark = "ok  " if check["ok"] else "warn"
        console.print(f"# {mark} {check['check']}: {check['detail']}", markup=False, highlight=False, soft_wrap=True)
    for key, value in d["env"].items():
        line = f"unset {key}" if value is None else f"export {key}={shlex.quote(value)}"
        if value == REDACTED:  # a key is never printed: the auth check says where it comes from
            line = f"# {key} is set for vllm ({REDACTED}; see the auth check)"
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(shlex.join(d["argv"]), markup=False, highlight=False, soft_wrap=True)


VllmRblnOpt = typer.Option(
    None,
    "--vllm-rbln",
    metavar="VERSION",
    help="The vllm-rbln version the line is for (serve: default the installed one; without one, and for deploy, "
    "0.11.1a1; the check 'engine' says which): 0.11 takes --additional-config and RBLN_DEVICES, 0.12+ "
    "--rbln-optimum-overrides and RBLN_VISIBLE_DEVICES.",
    show_default=False,
)
EmulateOpt = typer.Option(
    False,
    "--emulate",
    help="For an artifact from `qvl compile --emulate`: the real vLLM and vllm-rbln over qvl's CPU emulator of the "
    "NPU (also QVL_EMULATE_NPU=1); loopback only, every answer and line says emulated.",
)


def _run(launch: Any, warnings: list[str], *, dry_run: bool, as_json: bool, held: Any = None) -> None:
    """Print the launch (``--dry-run``) or start it; ``held``: the port qvl holds for it (``serving/port.py``)."""
    import os
    import shlex
    import sys

    from qwenvl_rbln.serving.launch import VLLM_INSTALL_HINT, find_vllm
    from qwenvl_rbln.views import render

    label = "emulated NPU: " if launch.emulated else ""  # under --emulate, every line qvl prints says so too
    for line in unshown(warnings, launch.checks) if dry_run and not as_json else warnings:
        render.warn(label + line)
    if dry_run:
        render.emit(launch.to_dict(), as_json=as_json, human=human)
        return
    env = launch.exec_env(os.environ)
    found = find_vllm(env)
    if held is not None:
        held = held.for_vllm(found)
    if launch.emulated:
        _supervised([found, *launch.argv[1:]], env, held)
        return
    if held is not None:
        env.update(held.for_exec())  # the listening socket goes on into the process vLLM becomes
    render.info(f"qvl: exec {shlex.join(launch.argv)}")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(launch.argv[0], launch.argv, env)
    except OSError as exc:  # found but not runnable (bad interpreter line, no permission)
        from qwenvl_rbln.errors import DependencyMissing

        raise DependencyMissing(f"`vllm` ({found}) could not be started: {exc}", VLLM_INSTALL_HINT) from None


def _emulated(launch: Any, *, serve: bool) -> None:
    """``--emulate``: the emulator's environment (its ``rebel`` shim first on PYTHONPATH) on the launch."""
    import os

    from qwenvl_rbln.backends import emulator
    from qwenvl_rbln.serving import emulated

    emulated.apply(launch, emulator.engine_environment(os.environ), serve=serve)


def _supervised(argv: list[str], env: dict[str, str], held: Any = None) -> None:
    """``--emulate``: vLLM as qvl's child, every line labelled, its whole process group ended with qvl."""
    import shlex

    from qwenvl_rbln.errors import EXIT_INTERRUPTED, BackendError
    from qwenvl_rbln.serving import emulated, supervise
    from qwenvl_rbln.views import render

    render.info(f"qvl: emulated NPU (qvl's CPU emulator, no NPU): {shlex.join(argv)}")
    code = supervise.run(argv, env, emulated.LABEL, held)
    if code == EXIT_INTERRUPTED:
        render.info("qvl: emulated NPU: stopped; no process of the emulated server is left")
        raise typer.Exit(code)
    if code != 0:
        raise BackendError(
            f"`vllm {argv[1]}` on the emulated NPU exited with code {code} (its output is above, every line "
            f"prefixed '{emulated.LABEL.strip()}')",
            "read the first error line above; rerun with --dry-run to see the exact command and environment",
        )


def _before_start(opts: Any, launch: Any) -> Any:
    """What must hold before vLLM starts here: a --vllm-rbln line of the installed generation (the engine the line
    was built for), and a free port, held by qvl from now on and handed to vLLM (vLLM binds with SO_REUSEPORT: it
    would start beside a server listening there; ``serving/port.py``)."""
    from qwenvl_rbln.serving import port
    from qwenvl_rbln.serving.engine import check_runnable

    check_runnable(launch.engine)
    return port.hold(opts.host, opts.port)


def _speed(opts: Any, speed: str, time_model: str | None, *, fleet: bool) -> str:
    """``--emulate-speed`` / ``--time-model`` on serve: device speed only, one engine (checked before anything)."""
    from qwenvl_rbln.errors import InputError

    speed, _ = emulate_speed.resolve(emulate=opts.emulate, speed=speed, time_model=time_model, scale=None)
    if time_model is not None and speed != "device":
        raise InputError("qvl serve takes --time-model only with --emulate-speed device",
                         "add --emulate --emulate-speed device, or time it with qvl bench-serve")  # fmt: skip
    if speed == "device" and fleet:
        raise InputError("--emulate-speed device serves one engine, not a fleet (--workers / --devices)",
                         "drop --workers and --devices")  # fmt: skip
    return speed


def _device_speed(launch: Any, opts: Any, time_model: str) -> None:
    """``--emulate-speed device``: every graph call returns zeros and holds for its device time (scale 1)."""
    from qwenvl_rbln.serving.command import resolve_directory
    from qwenvl_rbln.serving.preflight import ok

    art, _ = resolve_directory(opts.directory, opts.preset, "serve")
    model = emulate_speed.load_model(time_model, art)
    launch.env.update(emulate_speed.serve_environment(model, "device"))
    ok(launch.checks, "emulate speed", f"device: no graph computed, each call held for its device time under "
       f"{time_model} (scale 1); the host's time is real and the output tokens are meaningless")  # fmt: skip


def register(app: typer.Typer) -> None:
    _register_serve(app)


def _register_serve(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        directory: Path = DirArg,
        vllm_args: list[str] = PassThrough,
        preset: str = PresetArgOpt,
        device: str = typer.Option(
            None, "--device", help="NPU id(s) for the LM graphs, e.g. 0 or 0,1 (default: as compiled)."
        ),
        visual_device: str = typer.Option(
            None, "--visual-device", help="NPU id(s) for the ViT (default: as compiled, else --device)."
        ),
        host: str = HostOpt,
        port: int = PortOpt,
        served_model_name: str = NameOpt,
        vit_packing: bool = typer.Option(
            None,
            "--vit-packing/--no-vit-packing",
            help="Packed ViT calls inside vLLM (default: the preset's runtime.vit_packing, else on).",
            show_default=False,
        ),
        force: bool = typer.Option(
            False, "--force", help="Serve an artifact compiled for num_devices > 1 on a Rebel100 anyway."
        ),
        api_key_file: Path = KeyFileOpt,
        no_auth: bool = typer.Option(
            False, "--no-auth", help="Off loopback, serve without an API key (anyone who reaches the port may call)."
        ),
        uncertain_ok: bool = typer.Option(
            False,
            "--uncertain-ok",
            help="Serve a --device/--visual-device placement whose memory verdict is 'uncertain' (as load-check).",
        ),
        emulate: bool = EmulateOpt,
        speed: str = emulate_speed.EmulateSpeedOpt,
        time_model: str = typer.Option(
            None,
            "--time-model",
            help="With --emulate-speed device: " + emulate_speed.TimeModelHelp + ".",
            show_default=False,
        ),
        vllm_rbln: str = VllmRblnOpt,
        workers: int = serve_fleet.WorkersOpt,
        devices: str = serve_fleet.DevicesOpt,
        router_args: str = serve_fleet.RouterArgsOpt,
        dry_run: bool = DryRunOpt,
        as_json: bool = JsonOpt,
    ) -> None:
        """Serve a compiled artifact with vllm-rbln (OpenAI API), after checking it: `vllm serve DIR ...`."""
        import os

        from qwenvl_rbln.backends.emulator import refuse_real_rebel, requested
        from qwenvl_rbln.memory.placement import parse_device
        from qwenvl_rbln.serving.command import serve_command
        from qwenvl_rbln.serving.options import ServeOptions

        directory, extra = _split(directory, vllm_args)
        opts = ServeOptions(
            directory=directory,
            preset=preset,
            device=parse_device(device, "--device"),
            visual_device=parse_device(visual_device, "--visual-device"),
            host=host,
            port=port,
            served_model_name=served_model_name,
            vit_packing=vit_packing,
            extra=extra,
            force=force,
            api_key_file=api_key_file,
            no_auth=no_auth,
            uncertain_ok=uncertain_ok,
            emulate=requested(emulate),
            vllm_rbln=vllm_rbln,
        )
        if opts.emulate:
            refuse_real_rebel("--emulate")
        speed = _speed(opts, speed, time_model, fleet=workers is not None or devices is not None)
        if serve_fleet.serve_fleet(opts, workers, devices, router_args, dry_run=dry_run, as_json=as_json):
            return
        launch, warnings = serve_command(opts, os.environ)
        if opts.emulate:
            _emulated(launch, serve=True)
        if speed == "device":
            _device_speed(launch, opts, time_model)
        held = None if dry_run else _before_start(opts, launch)
        _run(launch, warnings, dry_run=dry_run, as_json=as_json, held=held)
