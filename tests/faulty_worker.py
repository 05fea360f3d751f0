"""A fault injected into a real ``BatchWorker``'s loaded backend: any generate whose batch holds a prompt with
``POISON`` raises, as optimum-rbln's generate did for a typed vision placeholder (H1 of the 2026-12-04 audit:
``TypeError: 'NoneType' object is not an iterator``). Importable by Ray actors (the repo is on their PYTHONPATH),
so the same fault runs in this process and in a pool."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qwenvl_rbln.batch.worker import BatchWorker

MARK = "POISON"


def h1_error() -> Exception:
    return TypeError("'NoneType' object is not an iterator")


def poisoned(run_batch: Any, fault: Callable[[], BaseException] = h1_error) -> Any:
    """``run_batch`` that raises ``fault()`` for a batch holding a POISON prompt, and generates otherwise."""

    def run(requests: list[Any], *args: Any, **kwargs: Any) -> Any:
        if any(MARK in (r.prompt or "") for r in requests):
            raise fault()
        return run_batch(requests, *args, **kwargs)

    return run


class PoisonedWorker(BatchWorker):
    """A ``BatchWorker`` whose backend raises TypeError for batches holding a POISON prompt."""

    loads = 0  # per process: how many times a worker was built here (a restart builds one more)

    def __init__(self, spec: Any, **kwargs: Any):
        super().__init__(spec, **kwargs)
        type(self).loads += 1
        self.backend.run_batch = poisoned(self.backend.run_batch)
