"""``qvl infer --batch-file F --output results.jsonl``: the streamed, resumable batch job.

Order (nothing done twice, nothing lost): the output is checked (an existing non-empty file is never overwritten:
``--resume`` continues it; a device, a pipe or an unwritable folder is refused), the results file is locked (one job
per file: ``results.results_lock``), ``--resume`` reads the ids already finished (a torn last line is cut and
redone), the batch file's ids are checked (duplicates refused before any work, naming the lines), then, unless
nothing is left to run, the artifact is resolved (a wrong directory fails before a worker starts), the job record
beside the output is checked (``stamp``: a ``--resume`` of another job's results is refused before a line is
written) and the executor runs: in this process for one NPU (Ray is never imported), or ``batch/ray_pool.py``'s
pool for ``--workers``/``--devices``/``--ray-address``. Each finished request is one line, written as it completes
(the file is created by the first). Ctrl-C or SIGTERM stops the workers and leaves only complete lines.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from qwenvl_rbln.batch import ray_cluster, stamp
from qwenvl_rbln.batch.npus import WorkerNpus
from qwenvl_rbln.batch.results import CompletedIds, ResultsWriter, completed_ids, results_lock
from qwenvl_rbln.batch.source import WorkItem, check_unique_ids, iter_items
from qwenvl_rbln.batch.tally import Tally
from qwenvl_rbln.batch.worker import WorkerSpec
from qwenvl_rbln.errors import EXIT_INTERRUPTED, DependencyMissing, InputError, QvlError, sigterm_as_interrupt
from qwenvl_rbln.inference.requests import shown

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


def check_output(output: Path, resume: bool, batch_file: Path | None = None) -> None:
    """Refuse, before any work, an ``--output`` the job cannot keep: an existing non-empty file without ``--resume``
    (never overwritten), a directory, a device or a pipe (the job appends, syncs and reads it back), the batch file
    itself, a missing or unwritable folder."""
    if output.is_dir():
        raise InputError(f"--output {output} is a directory", "pass a file path, e.g. --output results.jsonl")
    if not output.parent.is_dir():
        raise InputError(
            f"--output {output}: folder {output.parent} does not exist", f"create it first: mkdir -p {output.parent}"
        )
    if output.exists() and not output.is_file():
        raise InputError(
            f"--output {output} is not a regular file (a device or a pipe): the job appends to its results file, "
            "syncs it to disk and --resume reads it back",
            "pass a file path, e.g. --output results.jsonl (follow it as it grows with tail -f)",
        )
    if batch_file is not None and output.exists() and batch_file.is_file() and os.path.samefile(output, batch_file):
        raise InputError(f"--output {output} is the batch file", "pass another path, e.g. --output results.jsonl")
    if not resume and output.exists() and output.stat().st_size > 0:
        raise InputError(
            f"--output {output} already holds results; qvl never overwrites them",
            "add --resume to continue that run (finished ids are skipped), or pass a new --output path",
        )
    target = output if output.exists() else output.parent
    if not os.access(target, os.W_OK):
        why = "read-only file system" if os.statvfs(target).f_flag & os.ST_RDONLY else "permission denied"
        where = "the file" if target == output else f"in {target}"
        raise InputError(
            f"--output {output}: cannot write {where} ({why})",
            "pass an --output in a folder you can write",
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
    check_output(Path(opts.output), opts.resume, Path(opts.batch_file))
    with results_lock(opts.output):  # one job per results file: from before --resume reads it to its last line
        return _run_locked(opts, watch, executor)


def _run_locked(opts: BatchOptions, watch: Watch | None, executor: Any) -> dict[str, Any]:
    output, batch_file = Path(opts.output), Path(opts.batch_file)
    done = completed_ids(output) if opts.resume else CompletedIds.empty()  # a torn last line is cut here
    mended = done.torn, done.newline_added
    ids = check_unique_ids(batch_file, done)
    skipped = ids.already
    if ids.shared_hashes and len(done):  # two input ids share a hash (rare): tell them apart exactly
        done = completed_ids(output, ids.shared_hashes)
        skipped = _count_done(batch_file, done)
    tally = Tally(ids.count, skipped)
    done.torn, done.newline_added = mended  # what the first read did to the file
    tally.notes.extend(_resume_notes(output, batch_file, done, skipped))
    notify = watch or (lambda t, what: None)
    if tally.left == 0:  # --resume of a finished job: no worker, no artifact load
        tally.notes.append(f"nothing left to run: each of the {tally.total} requests of {batch_file} has its line")
        notify(tally, "start")
        notify(tally, "end")
        return tally.summary(str(output))
    npus, job = WorkerNpus(), None
    if executor is None:
        npus, directory, job = _target_check(opts.spec, opts.system)
        spec = replace(opts.spec, opts=replace(opts.spec.opts, directory=Path(directory)))
        opts = replace(opts, spec=replace(spec, media_base=_media_base(batch_file)))
    if job is not None:  # a --resume of another job's results is refused here, before a line is written
        tally.notes[:0] = stamp.check(output, job, opts.resume)
    ex = executor if executor is not None else make_executor(opts, npus)
    unrecorded = [job] if job is not None else []  # the job record is written with R's first line, not before

    def emit(record: dict[str, Any]) -> None:
        while unrecorded:
            stamp.record(output, unrecorded.pop())
        writer.write(record)
        tally.record(record)
        notify(tally, "record")

    def event(name: str, fields: dict[str, Any]) -> None:
        tally.event(name, fields)
        notify(tally, "event")

    notify(tally, "start")
    interrupted = False
    try:
        with ResultsWriter(output) as writer, sigterm_as_interrupt():  # the file is created by its first line
            try:
                ex.run(_pending(iter_items(batch_file, opts.system), done), emit, event)
            except KeyboardInterrupt:
                interrupted = True
            finally:
                with contextlib.suppress(Exception):
                    ex.close()
    except QvlError as exc:  # a worker or the results file cannot go on: what finished is kept, and says how to go on
        _resume_hint(exc, tally.skipped + tally.done, output)
        raise
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


def _resume_notes(output: Path, batch_file: Path, done: CompletedIds, skipped: int) -> list[str]:
    """What ``--resume`` found in the results file and did about it (the summary's notes)."""
    notes = []
    if done.torn:
        notes.append(f"{output}: a torn last line ({done.torn} bytes) was cut; its request runs again")
    if done.newline_added:
        notes.append(f"{output}: the last line was a whole result without its newline; the newline was added")
    if done.duplicates:
        named = "; ".join(
            f"{shown(rid)} on lines {', '.join(map(str, at))}" for rid, at in list(done.duplicates.items())[:5]
        )
        more = f" and {len(done.duplicates) - 5} more" if len(done.duplicates) > 5 else ""
        notes.append(
            f"{output} holds {len(done.duplicates)} ids on more than one line ({named}{more}): two jobs wrote it at "
            "once, or files were joined; this run adds none of them again; keep one line of each"
        )
    if len(done) > skipped:
        notes.append(
            f"{output} holds {len(done) - skipped} results whose ids are not in {batch_file} (another batch file?); "
            "they are kept, and the lines of this run are appended after them"
        )
    return notes


def _resume_hint(exc: QvlError, finished: int, output: Path) -> None:
    """Add to a job's error how many requests finished and that ``--resume`` goes on, only when some did (else
    the same command is the fix, and no results file was created)."""
    if not finished:
        return
    note = f"the {finished} finished requests are in {output}"
    if exc.hint and "--resume" in exc.hint:
        exc.hint = f"{exc.hint} ({note})"
    else:
        exc.hint = f"{exc.hint}; then rerun with --resume ({note})" if exc.hint else f"rerun with --resume ({note})"


def _media_base(batch_file: Path) -> str:
    """The folder relative media paths of the batch file resolve against, absolute (a Ray worker's cwd differs)."""
    return str(batch_file.parent.absolute())


def _count_done(batch_file: Path, done: CompletedIds) -> int:
    """Requests of the batch file already finished in the output (a pass that keeps nothing)."""
    return sum(1 for item in iter_items(batch_file) if item.id in done)
