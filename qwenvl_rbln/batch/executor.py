"""How a batch job's requests reach the workers: the ``Executor`` protocol and the one-NPU ``InProcessExecutor``.

An executor pulls ``WorkItem``s from an iterator as workers free up (the input is streamed: nothing reads ahead
more than a worker's batch), calls ``emit(record)`` once per finished request in completion order, and reports
progress through ``event(name, fields)``:

- ``worker.state`` {worker, npu, state: loading | idle | busy | dead}
- ``worker.done`` {worker, requests, tokens}: what that worker has finished so far (cumulative);
- ``worker.note`` {worker, message}: a warning of its load (the tiny-model notice, "emulated", a flag ignored), or
  a restart and why.

``InProcessExecutor`` runs one ``BatchWorker`` in this process (no Ray, not even imported); the Ray pool
(``batch/ray_pool.py``) runs one per NPU. Both follow one rule when a worker fails (``GenerateFailed``, or any
exception out of ``run``): the worker is restarted (loaded afresh), never dropped for one failure, and each request
it held runs once more, alone; a request that fails on two worker processes is written as failed with both
errors (``records.failed_twice``). A worker that fails ``MAX_RESTARTS`` times in a row without a call that
finished is given up (its NPU or the artifact is broken), so a dead device stops the job instead of failing every
request; what is not written then is left for ``--resume``.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from qwenvl_rbln.batch import records
from qwenvl_rbln.batch.source import WorkItem
from qwenvl_rbln.errors import BackendError, QvlError

Emit = Callable[[dict[str, Any]], None]
Event = Callable[[str, dict[str, Any]], None]

MAX_RESTARTS = 3  # restarts of one worker in a row without a call that finished: then it is given up


class Executor(Protocol):
    def run(self, items: Iterator[WorkItem], emit: Emit, event: Event) -> None: ...

    def close(self) -> None: ...


def one_line(exc: BaseException) -> str:
    """A worker's exception as one line for a record or a note (qvl's errors with their fix)."""
    text = exc.one_line() if isinstance(exc, QvlError) else str(exc)
    return " ".join(f"{type(exc).__name__}: {text or 'no message'}".split())[:400]


def given_up(name: str, npu: Any, restarts: int, why: str) -> BackendError:
    """The error of a worker that failed ``restarts`` times in a row."""
    return BackendError(
        f"{name} (NPU {npu}) failed {restarts} times in a row without finishing a call, so it was given up: {why}",
        "check the NPU and the artifact (`qvl load-check DIR`), then rerun with --resume (completed lines are kept)",
    )


class InProcessExecutor:
    """One worker, this process: load the artifact once, then batch after batch of up to ``max_batch`` items; a
    worker that fails is loaded afresh (see the module docstring)."""

    def __init__(self, spec: Any, worker_cls: Any = None, max_restarts: int = MAX_RESTARTS):
        self.spec = spec
        self.worker_cls = worker_cls
        self.max_restarts = max_restarts
        self.worker: Any = None
        self.restarts = 0  # in a row, without a call that finished
        self.done = self.tokens = 0

    def _make(self) -> Any:
        if self.worker_cls is not None:
            return self.worker_cls(self.spec)
        from qwenvl_rbln.batch.worker import BatchWorker

        return BatchWorker(self.spec)

    def _state(self, event: Event, state: str) -> None:
        event("worker.state", {"worker": self.spec.name, "npu": self.spec.npu, "state": state})

    def _load(self, event: Event) -> None:
        self._state(event, "loading")
        try:
            self.worker = self._make()
        except BaseException:
            self._state(event, "dead")
            raise

    def run(self, items: Iterator[WorkItem], emit: Emit, event: Event) -> None:
        self._load(event)
        for line in dict.fromkeys(getattr(self.worker, "warnings", [])):
            event("worker.note", {"worker": self.spec.name, "message": line})
        items, size = iter(items), max(1, int(self.worker.max_batch))
        try:
            while batch := list(itertools.islice(items, size)):
                self._state(event, "busy")
                self._call(batch, emit, event)
                event("worker.done", {"worker": self.spec.name, "requests": self.done, "tokens": self.tokens})
                self._state(event, "idle")
        except BaseException:
            self._state(event, "dead")
            raise

    def _ready(self, event: Event) -> Any:
        """The worker, loaded afresh first when a failure closed it."""
        if self.worker is None:
            self._load(event)
            self._state(event, "busy")
        return self.worker

    def _write(self, record: dict[str, Any], emit: Emit) -> None:
        emit(record)
        self.done += 1
        self.tokens += int(record.get("num_tokens") or 0)

    def _call(self, batch: list[WorkItem], emit: Emit, event: Event) -> None:
        """One batch; a failed worker restarted, and each request it held run once more alone."""
        out, suspects, why = self._try(batch, event)
        for record in out:
            self._write(record, emit)
        if not suspects:
            return
        self._restart(why, event)
        for item, first in suspects:
            out, again, why = self._try([item], event)
            for record in out:
                self._write(record, emit)
            if again:  # it failed on the fresh worker too: its line, with both errors; the worker is suspect again
                self._write(records.failed_twice(item, [first, again[0][1]]), emit)
                self._restart(why, event)

    def _try(
        self, batch: list[WorkItem], event: Event
    ) -> tuple[list[dict[str, Any]], list[tuple[WorkItem, dict]], str]:
        """(records written, (item, error) of the requests to run again, why the worker failed) of one call."""
        from qwenvl_rbln.batch.worker import GenerateFailed

        worker = self._ready(event)
        try:
            out = worker.run(batch)
        except GenerateFailed as exc:
            return exc.records, exc.failed, str(exc)
        except Exception as exc:  # noqa: BLE001 - out of run itself: the worker broke; every request is a suspect
            why = one_line(exc)
            err = records.error_dict(records.WORKER_FAILED, why, self.spec.name, getattr(worker, "npu", None))
            return [], [(item, dict(err)) for item in batch], why
        self.restarts = 0
        return out, [], ""

    def _restart(self, why: str, event: Event) -> None:
        """Close the failed worker; a fresh one loads before the next call. Given up after ``max_restarts`` in a
        row (BackendError: what is not written is left for --resume)."""
        self.restarts += 1
        worker, self.worker = self.worker, None
        if worker is not None and hasattr(worker, "close"):
            with contextlib.suppress(Exception):  # a broken worker may fail to close; the fresh one is what matters
                worker.close()
        if self.restarts > self.max_restarts:
            raise given_up(self.spec.name, self.spec.npu, self.restarts, why)
        event("worker.note", {"worker": self.spec.name, "message": f"{self.spec.name} restarted after: {why}"})

    def close(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None and hasattr(worker, "close"):
            worker.close()
