"""``qvl infer``'s batch-job flags (``--output``, ``--resume``, ``--workers``, ``--devices``, ``--ray-address``) and
the call that runs the job: ``--output`` switches ``--batch-file`` from one in-memory run (the report of every
batch, printed at the end) to the streamed job that writes each request's line as it completes
(``batch/driver.py``). Kept apart so ``infer_cmd.py`` stays a thin command."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

OutputOpt = typer.Option(
    None,
    "--output",
    "-o",
    help="With --batch-file: run it as a streamed job, one JSON line per request written to this file as it "
    "completes (never overwritten: see --resume). Docs: docs/many-npus.md.",
)
ResumeOpt = typer.Option(
    False, "--resume", help="Continue the job in --output: skip the ids already there; a torn last line is redone."
)
WorkersOpt = typer.Option(None, "--workers", help="Run N workers, one NPU each, on Ray (local unless --ray-address).")
DevicesOpt = typer.Option(None, "--devices", help="One worker per listed NPU of this host, e.g. --devices 0,1,2,3.")
RayAddressOpt = typer.Option(
    None, "--ray-address", help="Run the workers on an existing Ray cluster: HOST:PORT of its head, or auto."
)


def prepare_job(
    opts: Any,
    *,
    output: Path,
    resume: bool,
    workers: int | None,
    devices: str | None,
    ray_address: str | None,
) -> Any:
    """Check the flags and build the job (``batch.driver.BatchOptions``); nothing is read or written yet, so a
    caller that writes the batch file itself (``qvl eval``) can refuse bad flags before it does."""
    from qwenvl_rbln.batch import options
    from qwenvl_rbln.batch.driver import BatchOptions
    from qwenvl_rbln.batch.worker import WorkerSpec

    device_ids = options.parse_devices(devices)
    options.check_workers(workers)
    address = options.check_ray_address(ray_address)
    options.check_combination(
        batch_file=opts.batch_file,
        output=output,
        resume=resume,
        workers=workers,
        devices=device_ids,
        ray_address=address,
        single={"--device": opts.device, "--visual-device": opts.visual_device},
    )
    mixed = [f for f, v in (("--prompt", opts.prompt), ("--image", opts.images), ("--video", opts.videos)) if v]
    if mixed:
        from qwenvl_rbln.errors import InputError

        raise InputError(
            f"--batch-file cannot be combined with {', '.join(mixed)}",
            "put every request in the batch file (keys prompt, images, video), or drop --batch-file",
        )
    worker_opts = replace(opts, images=[], videos=[], prompt=None, batch_file=None)  # requests come from the file
    spec = WorkerSpec(worker_opts, batch_file=str(opts.batch_file))
    return BatchOptions(spec, opts.batch_file, output, resume, opts.system, workers, device_ids, address)


def execute(job: Any, *, as_json: bool) -> dict[str, Any]:
    """Run a prepared job with its progress view (stderr); its summary."""
    from qwenvl_rbln.batch.driver import run_batch
    from qwenvl_rbln.views import batch_live

    with batch_live.batch_watch(as_json) as watch:
        return run_batch(job, watch=watch)


def run_job(
    opts: Any,
    *,
    output: Path,
    resume: bool,
    workers: int | None,
    devices: str | None,
    ray_address: str | None,
    as_json: bool,
) -> None:
    """Check the flags, run the job with its progress view, print the summary (or the --json document)."""
    from qwenvl_rbln.batch.driver import BatchInterrupted
    from qwenvl_rbln.views import batch_live, render

    job = prepare_job(opts, output=output, resume=resume, workers=workers, devices=devices, ray_address=ray_address)
    try:
        summary = execute(job, as_json=as_json)
    except BatchInterrupted as stop:  # the counts so far, with the error beside them (--json: one document)
        if stop.summary is not None:
            render.emit(stop.summary, as_json=as_json, human=batch_live.human, error=stop)
        raise
    render.emit(summary, as_json=as_json, human=batch_live.human)
