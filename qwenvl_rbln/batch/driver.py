"""``qvl infer --batch-file F --output results.jsonl``: the streamed, resumable batch job.

Order (nothing done twice, nothing lost): the output is checked (an existing non-empty file is never overwritten:
``--resume`` continues it), the artifact is resolved (a wrong directory fails before a worker starts), the job
record beside the output is checked (``stamp``: a ``--resume`` of another job's results is refused), ``--resume``
reads the ids already finished (a torn last line is cut and redone), the batch file's ids are checked (duplicates
refused before any work, naming the lines), then the executor runs: in this process for one NPU (Ray is never
imported), or ``batch/ray_pool.py``'s pool for ``--workers``/``--devices``/``--ray-address``. Each finished
request is one line, written as it completes. Ctrl-C or SIGTERM stops the workers and leaves only complete lines.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from qwenvl_rbln.batch import ray_cluster, stamp
from qwenvl_rbln.batch.npus import WorkerNpus
from qwenvl_rbln.batch.results import CompletedIds, ResultsWriter, completed_ids
from qwenvl_rbln.batch.source import WorkItem, check_unique_ids, iter_items
from qwenvl_rbln.batch.tally import Tally
from qwenvl_rbln.batch.worker import WorkerSpec
from qwenvl_rbln.errors import EXIT_INTERRUPTED, DependencyMissing, InputError, QvlError, sigterm_as_interrupt

RAY_INSTALL = ray_cluster.INSTALL_LINE  # the one install line for Ray (ensure_ray's refusal says it)


class BatchInterrupted(QvlError):
    """Ctrl-C or SIGTERM during a batch job, after the workers stopped and the output was closed (exit 130);
    ``summary``: the job's summary so far (``interrupted`` true)."""

    exit_code = EXIT_INTERRUPTED
    summary: dict[str, Any] | None = None


@dataclass
class BatchOptions:
    """A batch job: the worker's spec (artifact, generation), the files, and where it runs."""

    spec: WorkerSpec
    batch_file: Path
    output: Path
    resume: bool = False
    system: str | None = None  # --system: the default system prompt of a line without one
    workers: int | None = None  # --workers N
    devices: list[int] | None = None  # --devices 0,1
    ray_address: str | None = None  # --ray-address ADDR|auto

    @property
    def pooled(self) -> bool:
        """Many NPUs (the Ray pool) rather than this process."""
        return self.workers is not None or self.devices is not None or self.ray_address is not None


def check_output(output: Path, resume: bool) -> None:
    """Refuse to overwrite results: an existing non-empty ``--output`` needs ``--resume``; its folder must exist."""
    if output.is_dir():
        raise InputError(f"--output {output} is a directory", "pass a file path, e.g. --output results.jsonl")
    if not output.parent.is_dir():
        raise InputError(
            f"--output {output}: folder {output.parent} does not exist", f"create it first: mkdir -p {output.parent}"
        )
    if not resume and output.exists() and output.stat().st_size > 0:
        raise InputError(
            f"--output {output} already holds results; qvl never overwrites them",
            "add --resume to continue that run (finished ids are skipped), or pass a new --output path",
        )


def _target_check(spec: WorkerSpec, system: str | None) -> tuple[WorkerNpus, str, dict[str, Any]]:
    """Resolve the artifact here, before any worker starts (a wrong DIR fails in milliseconds): (the NPUs one
    worker holds, from the placement ``qvl infer`` would use; its absolute path, which every worker loads,
    wherever its process runs; the job's identity, ``stamp.identity``)."""
    from qwenvl_rbln.inference import runner
    from qwenvl_rbln.inference.target import resolve_target

    opts = spec.opts
    target = resolve_target(opts.directory, opts.preset, opts.sets)
    emulated = runner.emulation(opts, target)
    directory = str(Path(target.directory).absolute())
    placement, _ = runner.place(opts, target, [])
    job = stamp.identity(opts, target, emulated, system)
    return WorkerNpus.of(placement["requested"] if placement else None), directory, job


def make_executor(opts: BatchOptions, npus: WorkerNpus) -> Any:
    """The in-process executor for one NPU; the Ray pool (imported only here, only then) for many."""
    if not opts.pooled:
        from qwenvl_rbln.batch.executor import InProcessExecutor

        return InProcessExecutor(opts.spec)
    try:
        from qwenvl_rbln.batch import ray_pool  # type: ignore[attr-defined]
    except ImportError:  # never Ray itself: ray_pool imports it only when the pool starts (ray_cluster.ensure_ray)
        raise DependencyMissing(
            "--workers/--devices/--ray-address need qvl's Ray pool (qwenvl_rbln.batch.ray_pool), missing here",
            "run one NPU without those flags, or install a qvl that has it",
        ) from None
    return ray_pool.RayExecutor(
        opts.spec, workers=opts.workers, devices=opts.devices, ray_address=opts.ray_address, npus=npus
    )


def _pending(items: Iterator[WorkItem], done: CompletedIds) -> Iterator[WorkItem]:
    """The items not finished yet (streamed; the finished ones are only counted, by the pre-pass)."""
    for item in items:
        if item.id not in done:
            yield item


Watch = Callable[[Tally, str], None]  # (tally, what happened: "start" | "record" | "event" | "end")


def run_batch(opts: BatchOptions, *, watch: Watch | None = None, executor: Any = None) -> dict[str, Any]:
    """Run the job; the summary (``Tally.summary``) once every request has a line in ``opts.output``.

    ``watch(tally, what)`` is called as the job moves (the command's progress view); ``executor`` replaces the
    chosen one (tests, benchmarks)."""
    output, batch_file = Path(opts.output), Path(opts.batch_file)
    check_output(output, opts.resume)
    npus, job, job_notes = WorkerNpus(), None, []
    if executor is None:
        npus, directory, job = _target_check(opts.spec, opts.system)
        spec = replace(opts.spec, opts=replace(opts.spec.opts, directory=Path(directory)))
        opts = replace(opts, spec=replace(spec, media_base=_media_base(batch_file)))
        job_notes = stamp.check(output, job, opts.resume)  # a --resume of another job's results: refused here
    done = completed_ids(output) if opts.resume else CompletedIds.empty()  # a torn last line is cut here
    torn = done.torn
    ids = check_unique_ids(batch_file, done)
    skipped = ids.already
    if ids.shared_hashes and len(done):  # two input ids share a hash (rare): tell them apart exactly
        done = completed_ids(output, ids.shared_hashes)
        skipped = _count_done(batch_file, done)
    tally = Tally(ids.count, skipped)
    tally.notes.extend(job_notes)
    if torn:
        tally.notes.append(f"{output}: a torn last line ({torn} bytes) was cut; its request runs again")
    if len(done) > skipped:
        tally.notes.append(
            f"{output} holds {len(done) - skipped} results whose ids are not in {batch_file} (another batch file?); "
            "they are kept, and the lines of this run are appended after them"
        )
    ex = executor if executor is not None else make_executor(opts, npus)
    if job is not None:
        stamp.record(output, job)
    notify = watch or (lambda t, what: None)

    def emit(record: dict[str, Any]) -> None:
        writer.write(record)
        tally.record(record)
        notify(tally, "record")

    def event(name: str, fields: dict[str, Any]) -> None:
        tally.event(name, fields)
        notify(tally, "event")

    notify(tally, "start")
    interrupted = False
    with ResultsWriter(output) as writer, sigterm_as_interrupt():
        try:
            ex.run(_pending(iter_items(batch_file, opts.system), done), emit, event)
        except KeyboardInterrupt:
            interrupted = True
        except QvlError as exc:  # a worker that cannot go on: what finished is kept, and says how to continue
            done_note = f"the {tally.skipped + tally.done} finished requests are in {output}; rerun with --resume"
            exc.hint = f"{exc.hint}; then {done_note}" if exc.hint else done_note
            raise
        finally:
            with contextlib.suppress(Exception):
                ex.close()
    notify(tally, "end")
    summary = tally.summary(str(output), interrupted=interrupted)
    if interrupted:
        stop = BatchInterrupted(
            f"interrupted after {tally.done} requests this run; {output} holds only complete lines "
            f"({tally.skipped + tally.done} of {tally.total} requests)",
            f"rerun the same command with --resume to finish the other {tally.left}",
        )
        stop.summary = summary  # the command reports the counts with the error (--json: one document)
        raise stop
    return summary


def _media_base(batch_file: Path) -> str:
    """The folder relative media paths of the batch file resolve against, absolute (a Ray worker's cwd differs)."""
    return str(batch_file.parent.absolute())


def _count_done(batch_file: Path, done: CompletedIds) -> int:
    """Requests of the batch file already finished in the output (a pass that keeps nothing)."""
    return sum(1 for item in iter_items(batch_file) if item.id in done)
