"""How a batch job's requests reach the workers: the ``Executor`` protocol and the one-NPU ``InProcessExecutor``.

An executor pulls ``WorkItem``s from an iterator as workers free up (the input is streamed: nothing reads ahead
more than a worker's batch), calls ``emit(record)`` once per finished request in completion order, and reports
progress through ``event(name, fields)``:

- ``worker.state`` {worker, npu, state: loading | idle | busy | dead}
- ``worker.done`` {worker, requests, tokens}: what that worker has finished so far (cumulative);
- ``worker.note`` {worker, message}: a warning of its load (the tiny-model notice, "emulated", a flag ignored).

``InProcessExecutor`` runs one ``BatchWorker`` in this process (no Ray, not even imported); the Ray pool
(``batch/ray_pool.py``) runs one per NPU.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from qwenvl_rbln.batch.source import WorkItem

Emit = Callable[[dict[str, Any]], None]
Event = Callable[[str, dict[str, Any]], None]


class Executor(Protocol):
    def run(self, items: Iterator[WorkItem], emit: Emit, event: Event) -> None: ...

    def close(self) -> None: ...


class InProcessExecutor:
    """One worker, this process: load the artifact once, then batch after batch of up to ``max_batch`` items."""

    def __init__(self, spec: Any, worker_cls: Any = None):
        self.spec = spec
        self.worker_cls = worker_cls
        self.worker: Any = None

    def _make(self) -> Any:
        if self.worker_cls is not None:
            return self.worker_cls(self.spec)
        from qwenvl_rbln.batch.worker import BatchWorker

        return BatchWorker(self.spec)

    def run(self, items: Iterator[WorkItem], emit: Emit, event: Event) -> None:
        name, npu = self.spec.name, self.spec.npu
        event("worker.state", {"worker": name, "npu": npu, "state": "loading"})
        try:
            self.worker = self._make()
        except BaseException:
            event("worker.state", {"worker": name, "npu": npu, "state": "dead"})
            raise
        for line in dict.fromkeys(getattr(self.worker, "warnings", [])):
            event("worker.note", {"worker": name, "message": line})
        done = tokens = 0
        items = iter(items)
        try:
            while batch := list(itertools.islice(items, max(1, int(self.worker.max_batch)))):
                event("worker.state", {"worker": name, "npu": npu, "state": "busy"})
                for record in self.worker.run(batch):
                    emit(record)
                    done += 1
                    tokens += int(record.get("num_tokens") or 0)
                event("worker.done", {"worker": name, "requests": done, "tokens": tokens})
                event("worker.state", {"worker": name, "npu": npu, "state": "idle"})
        except BaseException:
            event("worker.state", {"worker": name, "npu": npu, "state": "dead"})
            raise

    def close(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None and hasattr(worker, "close"):
            worker.close()
