"""What long work reports while it runs: a compile's stages (``Progress``) and inference's work events (``report``).

At the package root, below every layer, because both sides of a display meet here: the backends and jobs that do
the work record into it, and ``views/live.py`` reads it. A view never imports a backend or the inference runner
to learn how far the work has got. Importing this module imports nothing heavy (no rich, no torch).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any


def fmt_elapsed(seconds: float) -> str:
    """``4.2s``, ``3m07s``, ``1h02m03s``: short enough for a stage line or a board column."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{sec:02d}s"


class Progress:
    """Stage lines with elapsed time, a heartbeat while a stage runs long, and per-stage timings.

    ``emit`` receives finished lines (the CLI sends them to stderr). ``heartbeat_s`` <= 0 disables the
    background heartbeat (tests). ``clock`` is the time source (tests pass a fake one). A live display
    (``views/live.py``) reads ``current``, ``stages``, ``details`` and the graph counts while it runs and sets
    ``quiet_stages``: stage and heartbeat lines are then recorded but not emitted (the display shows them);
    every other line still is, without its ``[elapsed]`` stamp (``qvl compile: compile cache off: ...``): printed
    just above the board, a time that never moves read as the board's stale header beside the footer's running
    total. ``lines`` keeps every line stamped. A stage cut short by an exception (the ``with`` block or
    ``stop(ended=...)``) is recorded with ``ended``: ``interrupted`` (Ctrl-C, SIGTERM) or ``failed``, so nobody
    shows it as done.
    """

    def __init__(
        self,
        emit: Callable[[str], None] | None = None,
        *,
        heartbeat_s: float = 30.0,
        prefix: str = "",
        clock: Callable[[], float] = time.monotonic,
    ):
        self._emit = emit or (lambda line: None)
        self.prefix = prefix
        self.clock = clock
        self.t0 = clock()
        self.current: str | None = None
        self._stage_t0 = self.t0
        self.stages: list[dict[str, Any]] = []
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.heartbeat_s = heartbeat_s
        self.details: list[str] = []  # each stage's detail, in the order of stages (+ the current one)
        self.graphs_planned: int | None = None  # graphs the backend will compile (None: not a graph compile)
        self.graphs_done = 0
        self.quiet_stages = False

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def say(self, message: str, *, stage_line: bool = False) -> None:
        line = f"{self.prefix}[{fmt_elapsed(self.elapsed())}] {message}"
        with self._lock:
            self.lines.append(line)
        if not self.quiet_stages:
            self._emit(line)
        elif not stage_line:  # above a live board: its footer keeps the running total, so no frozen time here
            self._emit(f"{self.prefix.rstrip()}: {message.strip()}" if self.prefix.strip() else message.strip())

    def _close_stage(self, now: float, ended: str | None = None) -> None:
        if self.current is not None:
            record: dict[str, Any] = {
                "stage": self.current,
                "started_s": round(self._stage_t0 - self.t0, 3),
                "seconds": round(now - self._stage_t0, 3),
            }
            if ended is not None:
                record["ended"] = ended
            self.stages.append(record)

    def stage(self, name: str, detail: str = "") -> None:
        now = self.clock()
        with self._lock:
            self._close_stage(now)
            self.current = name
            self._stage_t0 = now
            self.details.append(detail)
        self.say(f"{name}{': ' + detail if detail else ''}", stage_line=True)

    def graph_done(self) -> None:
        """One compiled graph finished (the backend's hook calls it after each graph)."""
        with self._lock:
            self.graphs_done += 1

    def stage_elapsed(self) -> float:
        """Seconds in the current stage."""
        return self.clock() - self._stage_t0

    def note(self, message: str) -> None:
        self.say(f"  {message}")

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with self._lock:
                current, since = self.current, self.clock() - self._stage_t0
            if current:
                self.say(f"still in {current} ({fmt_elapsed(since)} in this stage)", stage_line=True)

    def start(self) -> Progress:
        if self.heartbeat_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="qvl-progress", daemon=True)
            self._thread.start()
        return self

    def stop(self, ended: str | None = None) -> None:
        """Close the current stage: finished, or ``ended`` (``interrupted`` / ``failed``) when the work was cut."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)
            self._thread = None
        with self._lock:
            self._close_stage(self.clock(), ended)
            self.current = None

    def timings(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for item in self.stages:
            out[item["stage"]] = round(out.get(item["stage"], 0.0) + item["seconds"], 3)
        out["total"] = round(self.elapsed(), 3)
        return out

    def __enter__(self) -> Progress:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.stop()
        else:
            self.stop("interrupted" if issubclass(exc_type, (KeyboardInterrupt, SystemExit)) else "failed")


# ---------------------------------------------------------------------------------------------- work events
# Progress events of long inference work (batch requests, video decoding), for whoever watches. The core reports
# what it has done (``report``); a command that wants a display installs a sink for the duration of the call
# (``watching``). Without a sink, ``report`` is a no-op. A context variable, not a parameter, so the decoders
# deep inside request preparation need no new argument on every function between them and the command.
# The events are listed in ``inference/work.py``, where the inference code reports them.

Sink = Callable[[str, dict[str, Any]], None]
_sink: ContextVar[Sink | None] = ContextVar("qvl_work_sink", default=None)


def report(event: str, **fields: Any) -> None:
    """Tell the watcher, if any; a watcher's failure never stops the work."""
    sink = _sink.get()
    if sink is None:
        return
    with contextlib.suppress(Exception):
        sink(event, fields)


def watched() -> bool:
    return _sink.get() is not None


@contextlib.contextmanager
def watching(sink: Sink | None) -> Iterator[None]:
    """Send ``report``'s events to ``sink`` inside the block (None: nobody watches)."""
    token = _sink.set(sink)
    try:
        yield
    finally:
        _sink.reset(token)
