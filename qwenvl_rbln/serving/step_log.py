"""The engine-step log: one line per vLLM engine step, so the host's own time per step can be measured.

Why a hook in the engine core and not gaps in the graph-call log: a step's kind (a prefill of how many tokens and
images, a decode of how many rows) is the scheduler's decision, and the idle time between two bursts is no host
work; only the engine core knows both. ``QVL_STEP_LOG=DIR`` (set by ``qvl bench-serve --emulate --emulate-speed
device``, and usable by hand on an NPU host) makes qvl's vLLM plugin wrap, in the engine core process:

* ``EngineCore.step`` (vLLM 0.22, ``vllm/v1/engine/core.py``: schedule, execute, sample, update): each step that
  scheduled tokens appends ``WALL_START WALL_END KIND TOKENS ROWS IMAGES DEVICE_S PENDING`` to
  ``DIR/steps-PID.tsv``; KIND is ``prefill`` when a request is new or has more than one token scheduled, else
  ``decode``; ROWS the requests scheduled, IMAGES the new requests' images and videos, PENDING 1 when unfinished
  requests remained after the step (the engine loops straight on, so the gap to the next step is host work too);
* ``rebel.capture_reports`` (vllm-rbln's runner wraps every model and sampler call in it,
  ``v1/worker/optimum_model_runner.py``): the ``total_device`` microseconds each report gives are summed into the
  step's DEVICE_S. On an NPU host that is the runtime's own device time; on the emulator, the time inside the
  emulated graph and sampler calls (at device speed: their holds).

``read_steps`` turns the lines into each step's **host time**: the wall time from the end of the previous step
(when the engine was busy then; else from this step's start) to this step's end, less the step's device time.
What it leaves out: the API server's own work (detokenising, HTTP) runs in another process beside the engine; it
slows a step only through the CPU they share.

Never raises into vLLM: a hook that cannot be installed is one warning line.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "QVL_STEP_LOG"
_local = threading.local()
_installed = False


@dataclass(frozen=True)
class Step:
    """One engine step: its kind, size, and the host time measured around it (seconds)."""

    kind: str  # prefill | decode
    tokens: int
    rows: int
    images: int
    wall_s: float  # the step's span (from the previous busy step's end, or its own start)
    device_s: float
    end: float  # wall clock

    @property
    def host_s(self) -> float:
        return max(0.0, self.wall_s - self.device_s)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "tokens": self.tokens, "rows": self.rows, "images": self.images,
                "host_s": round(self.host_s, 7), "device_s": round(self.device_s, 7)}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Step:
        """A step as ``to_dict`` wrote it (a run's report): its span is its host and device time, its end unknown."""
        return cls(d["kind"], d["tokens"], d["rows"], d["images"], d["host_s"] + d["device_s"], d["device_s"], 0.0)


def describe(scheduler_output: Any) -> tuple[str, int, int, int]:
    """(kind, tokens, rows, images) of one scheduled step."""
    counts = dict(getattr(scheduler_output, "num_scheduled_tokens", {}) or {})
    tokens = int(getattr(scheduler_output, "total_num_scheduled_tokens", sum(counts.values())) or 0)
    new = list(getattr(scheduler_output, "scheduled_new_reqs", []) or [])
    kind = "prefill" if new or any(int(n) > 1 for n in counts.values()) else "decode"
    images = sum(len(getattr(r, "mm_features", None) or []) for r in new)  # a new request's images and videos
    if not images:  # a request resumed, or an engine that schedules its encoder inputs apart
        images = sum(len(v) for v in (getattr(scheduler_output, "scheduled_encoder_inputs", None) or {}).values())
    return kind, tokens, len(counts), images


@contextlib.contextmanager
def _step_device() -> Iterator[list[float]]:
    acc = [0.0]
    _local.acc = acc
    try:
        yield acc
    finally:
        _local.acc = None


def counted(real: Callable[..., Any]) -> Callable[..., Any]:
    """``rebel.capture_reports`` that also adds each report's ``total_device`` to the running step's device time."""

    @contextlib.contextmanager
    def capture_reports(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with real(*args, **kwargs) as reports:
            yield reports
        acc = getattr(_local, "acc", None)
        if acc is not None and reports:
            acc[0] += float(reports[0].get("total_device", 0.0)) / 1e6

    capture_reports.qvl_step_log = True  # type: ignore[attr-defined]
    return capture_reports


class _Writer:
    def __init__(self, directory: Path):
        self.directory = directory
        self.fh: Any = None
        self.pid = 0

    def write(self, line: str) -> None:
        if self.fh is None or self.pid != os.getpid():
            self.pid = os.getpid()
            self.directory.mkdir(parents=True, exist_ok=True)
            self.fh = open(self.directory / f"steps-{self.pid}.tsv", "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self.fh.write(line)


def wrap_step(step: Callable[..., Any], writer: _Writer) -> Callable[..., Any]:
    """``EngineCore.step`` that logs each step that scheduled tokens (its scheduler output caught on the way)."""

    def logged(self: Any) -> Any:
        scheduler = self.scheduler
        if not getattr(scheduler, "_qvl_caught", False):
            schedule = scheduler.schedule

            def caught(*args: Any, **kwargs: Any) -> Any:
                out = schedule(*args, **kwargs)
                scheduler._qvl_last = out
                return out

            scheduler.schedule = caught
            scheduler._qvl_caught = True
        scheduler._qvl_last = None
        start = time.time()
        with _step_device() as acc, _profiled():
            result = step(self)
        end = time.time()
        out = scheduler._qvl_last
        if out is not None and int(getattr(out, "total_num_scheduled_tokens", 0) or 0) > 0:
            kind, tokens, rows, images = describe(out)
            pending = int(_unfinished(scheduler) > 0)
            writer.write(f"{start:.6f} {end:.6f} {kind} {tokens} {rows} {images} {acc[0]:.7f} {pending}\n")
        return result

    logged.qvl_step_log = True  # type: ignore[attr-defined]
    return logged


PROFILE_ENV = "QVL_STEP_PROFILE"  # FILE: cProfile of the engine steps, dumped there every DUMP_EVERY steps
DUMP_EVERY = 50
_profile: dict[str, Any] = {}


@contextlib.contextmanager
def _profiled() -> Iterator[None]:
    """With ``QVL_STEP_PROFILE=FILE``: the step runs under cProfile (a map of the host's costs per step; the
    graph calls' holds show as ``time.sleep``), the stats written to FILE every DUMP_EVERY steps."""
    target = os.environ.get(PROFILE_ENV)
    if not target:
        yield
        return
    import cProfile

    prof = _profile.setdefault("p", cProfile.Profile())
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        _profile["n"] = _profile.get("n", 0) + 1
        if _profile["n"] % DUMP_EVERY == 0:  # a temp file renamed: a kill mid-write keeps the last whole dump
            prof.dump_stats(f"{target}.tmp")
            os.replace(f"{target}.tmp", target)


def _unfinished(scheduler: Any) -> int:
    """Requests still to be served after a step (finished ones not yet removed do not count: no work)."""
    count = getattr(scheduler, "get_num_unfinished_requests", None)
    return int(count()) if callable(count) else int(bool(scheduler.has_requests()))


def install(warn: Callable[[str], None]) -> bool:
    """The step hook where ``QVL_STEP_LOG`` is set (once per process); False (one warning) when it cannot be."""
    global _installed
    directory = os.environ.get(ENV, "").strip()
    if not directory or _installed:
        return _installed
    try:
        import importlib

        core = importlib.import_module("vllm.v1.engine.core")
        rebel = importlib.import_module("rebel")
        writer = _Writer(Path(directory))
        if not getattr(core.EngineCore.step, "qvl_step_log", False):
            core.EngineCore.step = wrap_step(core.EngineCore.step, writer)
        real = getattr(rebel, "capture_reports", None)
        if real is not None and not getattr(real, "qvl_step_log", False):
            rebel.capture_reports = counted(real)
    except Exception as exc:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        warn(f"{ENV} is set but the engine-step log could not be installed ({type(exc).__name__}: {exc})")
        return False
    _installed = True
    return True


def read_steps(directory: Path, since: float = 0.0, until: float = float("inf")) -> list[Step]:
    """The steps of every engine core in ``directory`` that ended in [since, until], each with its host time."""
    steps: list[Step] = []
    for path in sorted(Path(directory).glob("steps-*.tsv")):
        prev_end, prev_pending = None, False
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) != 8:
                continue  # a line being written
            start, end, kind = float(parts[0]), float(parts[1]), parts[2]
            tokens, rows, images, device = int(parts[3]), int(parts[4]), int(parts[5]), float(parts[6])
            begin = prev_end if prev_pending and prev_end is not None else start
            if since <= end <= until:
                steps.append(Step(kind, tokens, rows, images, end - begin, device, end))
            prev_end, prev_pending = end, parts[7] == "1"
    return sorted(steps, key=lambda s: s.end)
