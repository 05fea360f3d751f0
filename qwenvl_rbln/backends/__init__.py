"""Backends behind one small interface. Importing this package imports nothing heavy.

- ``rbln``: optimum-rbln 0.12.0 + rebel-compiler on an RBLN host (``backends/rbln/``).
- ``torch``: the reference backend; its "compile" copies the Hugging Face model into an artifact
  directory with the same manifest and config file shape (``backends/torch_ref_compile.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from qwenvl_rbln.paths import user_path


def fmt_elapsed(seconds: float) -> str:
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
    background heartbeat (tests). A live display (``views/live.py``) reads ``current``, ``stages``, ``details``
    and the graph counts while it runs and sets ``quiet_stages``: stage and heartbeat lines are then recorded but
    not emitted (the display shows them); every other line still is.
    """

    def __init__(self, emit: Callable[[str], None] | None = None, *, heartbeat_s: float = 30.0, prefix: str = ""):
        self._emit = emit or (lambda line: None)
        self.prefix = prefix
        self.t0 = time.monotonic()
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
        return time.monotonic() - self.t0

    def say(self, message: str, *, stage_line: bool = False) -> None:
        line = f"{self.prefix}[{fmt_elapsed(self.elapsed())}] {message}"
        with self._lock:
            self.lines.append(line)
        if not (stage_line and self.quiet_stages):
            self._emit(line)

    def _close_stage(self, now: float) -> None:
        if self.current is not None:
            self.stages.append(
                {
                    "stage": self.current,
                    "started_s": round(self._stage_t0 - self.t0, 3),
                    "seconds": round(now - self._stage_t0, 3),
                }
            )

    def stage(self, name: str, detail: str = "") -> None:
        now = time.monotonic()
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
        return time.monotonic() - self._stage_t0

    def note(self, message: str) -> None:
        self.say(f"  {message}")

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with self._lock:
                current, since = self.current, time.monotonic() - self._stage_t0
            if current:
                self.say(f"still in {current} ({fmt_elapsed(since)} in this stage)", stage_line=True)

    def start(self) -> Progress:
        if self.heartbeat_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="qvl-progress", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)
            self._thread = None
        with self._lock:
            self._close_stage(time.monotonic())
            self.current = None

    def timings(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for item in self.stages:
            out[item["stage"]] = round(out.get(item["stage"], 0.0) + item["seconds"], 3)
        out["total"] = round(self.elapsed(), 3)
        return out

    def __enter__(self) -> Progress:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def backend_module(name: str) -> Any:
    """The backend module for a plan's ``backend`` value (imported lazily, still without heavy imports)."""
    if name == "rbln":
        from qwenvl_rbln.backends.rbln import optimum as rbln

        return rbln
    if name == "torch":
        from qwenvl_rbln.backends import torch_ref_compile

        return torch_ref_compile
    from qwenvl_rbln.errors import InputError

    raise InputError(f"backend={name!r} is not one of rbln, torch", "set backend: rbln or backend: torch in the preset")


def resolve_source(model_id: str, *, backend: str) -> tuple[str, Any]:
    """(what to hand the backend, local directory or None) for a plan's model id.

    ``qvl:tiny`` (``qvl:tiny-moe``, ``qvl:tiny-8b``) is created on first use (``tiny_model.ensure_tiny_model``). A
    hub id in the local Hugging Face cache resolves to that snapshot, so it is hashed and the compile cache works; one
    that is not cached is passed through to optimum-rbln on an RBLN host (it downloads as usual, and the manifest says
    it was not hashed). The torch backend copies a local directory, so it never downloads.
    """
    from pathlib import Path

    from qwenvl_rbln.errors import InputError
    from qwenvl_rbln.planning.catalogue.modelinfo import resolve_model_path, tiny_variant

    variant = tiny_variant(model_id)
    if variant is not None:
        from qwenvl_rbln.backends.tiny.model import ensure_tiny_model

        path = Path(ensure_tiny_model(**variant))
        return str(path), path
    path = resolve_model_path(model_id)
    if path is not None:
        path = user_path(path)
        if not path.is_dir():
            raise InputError(
                f"model directory {path} does not exist", "pass --model with an existing Hugging Face model directory"
            )
        return str(path.absolute()), path.absolute()
    local = _cached_snapshot(model_id)
    if local is not None:  # hashed, cached and compiled from the same files, offline
        return str(local), local
    if backend == "rbln":
        return model_id, None
    raise InputError(
        f"model {model_id!r} is a hub id that is not in the local Hugging Face cache",
        f"download it first (`hf download {model_id}`) and pass --model with its directory; qvl never downloads",
    )


def _cached_snapshot(model_id: str) -> Any:
    """The local Hugging Face cache's snapshot of a hub id, or None (not cached, or huggingface_hub missing)."""
    from pathlib import Path

    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, offline, a malformed id, or huggingface_hub missing
        return None
