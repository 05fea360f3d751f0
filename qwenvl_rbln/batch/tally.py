"""A batch job's running count: what is done and left, failures by cause, each worker's state and throughput.

The driver feeds it every record written and every executor event; the progress views (``views/batch_live.py``)
read ``snapshot()``, and ``--json`` prints ``summary()``. Plain data, no rich: the batch layer never draws.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Tally:
    """Counts of one run: ``total`` requests in the file, ``skipped`` (already in the output: --resume)."""

    def __init__(self, total: int, skipped: int = 0, *, clock: Callable[[], float] = time.monotonic):
        self.total = total
        self.skipped = skipped
        self.clock = clock
        self.t0 = clock()
        self.done = 0  # written this run (ok or failed)
        self.failed = 0
        self.tokens = 0
        self.by_cause: dict[str, int] = {}
        self.workers: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []  # a torn line cut by --resume; the workers' load warnings (once each)
        self._lock = threading.Lock()

    def _worker(self, name: Any) -> dict[str, Any]:
        key = str(name)
        if key not in self.workers:
            self.workers[key] = {"npu": None, "state": "loading", "requests": 0, "failed": 0, "tokens": 0}
        return self.workers[key]

    def record(self, rec: dict[str, Any]) -> None:
        """One record written."""
        with self._lock:
            self.done += 1
            tokens = int(rec.get("num_tokens") or 0)
            self.tokens += tokens
            w = self._worker(rec.get("worker")) if rec.get("worker") is not None else None
            if w is not None:
                w["requests"] += 1
                w["tokens"] += tokens
                if w["npu"] is None:
                    w["npu"] = rec.get("npu")
            err = rec.get("error")
            if err:
                self.failed += 1
                cause = str(err.get("cause") or "internal")
                self.by_cause[cause] = self.by_cause.get(cause, 0) + 1
                if w is not None:
                    w["failed"] += 1

    def event(self, name: str, fields: dict[str, Any]) -> None:
        """An executor's progress event (``batch/executor.py``): a worker's state."""
        if name == "worker.note" and fields.get("message"):
            with self._lock:
                if fields["message"] not in self.notes:
                    self.notes.append(str(fields["message"]))
            return
        if name != "worker.state" or fields.get("worker") is None:
            return
        with self._lock:
            w = self._worker(fields["worker"])
            w["state"] = str(fields.get("state") or w["state"])
            if fields.get("npu") is not None:
                w["npu"] = fields["npu"]

    @property
    def left(self) -> int:
        return max(0, self.total - self.skipped - self.done)

    def snapshot(self) -> dict[str, Any]:
        """What a progress view shows now."""
        with self._lock:
            elapsed = max(self.clock() - self.t0, 1e-9)
            rate = self.done / elapsed
            return {
                "total": self.total,
                "done": self.done,
                "skipped": self.skipped,
                "failed": self.failed,
                "left": self.left,
                "elapsed_s": elapsed,
                "requests_per_s": rate,
                "tokens_per_s": self.tokens / elapsed,
                "eta_s": self.left / rate if rate > 0 and self.left else None,
                "workers": {k: dict(w) for k, w in self.workers.items()},
            }

    def summary(self, output: str, *, interrupted: bool = False) -> dict[str, Any]:
        """The ``--json`` document (and the human summary's data)."""
        snap = self.snapshot()
        elapsed = snap["elapsed_s"]
        return {
            "output": output,
            "complete": snap["left"] == 0 and not interrupted,
            "interrupted": interrupted,
            "counts": {
                "total": self.total,
                "done": self.done,
                "ok": self.done - self.failed,
                "failed": self.failed,
                "skipped_by_resume": self.skipped,
                "left": snap["left"],
            },
            "notes": list(self.notes),
            "failures_by_cause": dict(sorted(self.by_cause.items())),
            "throughput": {
                "seconds": round(elapsed, 3),
                "requests_per_s": round(snap["requests_per_s"], 3),
                "tokens_per_s": round(snap["tokens_per_s"], 3),
            },
            "workers": [
                {
                    "worker": name,
                    "npu": w["npu"],
                    "state": w["state"],
                    "requests": w["requests"],
                    "failed": w["failed"],
                    "tokens": w["tokens"],
                    "requests_per_s": round(w["requests"] / elapsed, 3),
                    "tokens_per_s": round(w["tokens"] / elapsed, 3),
                }
                for name, w in sorted(snap["workers"].items())
            ],
        }
