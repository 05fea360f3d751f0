"""Device time for the emulator: every graph call holds for the time a device-time model gives it, times a scale.

Why: the real vLLM + vllm-rbln scheduler over the emulator decides what runs when from how long each call takes.
With the CPU's own (tiny-model) times those decisions say nothing about an NPU; with each call held for the
device time of a named model (``qvl profile``'s timings, or the roofline at the artifact's compiled shapes), the
scheduler meets the same durations an NPU would give it, only ``scale`` times slower, so that the CPU's own work
(the emulated graph, and the host work around it) stays a small share.

* ``QVL_EMULATE_TIME_MODEL=FILE``: the model (``tuning.device_time.DeviceTimeModel`` as JSON).
* ``QVL_EMULATE_TIME_SCALE=N``: wall seconds per device second (default 1).
* ``QVL_EMULATE_TIME_STATS=DIR``: each process appends one line per graph call to ``DIR/calls-PID.tsv``:
  ``WALL_END KIND SIZE CONTEXT DEVICE_S CPU_S HOLD_S ROWS``. ``read_stats`` sums them over a time window.
* ``QVL_EMULATE_SPEED=device``: **device-speed mode** (``qvl serve/bench-serve --emulate --emulate-speed device``).
  No graph is computed: each call returns zeros of the shapes and dtypes the compiled graph declares (its output
  info, stored in the artifact), and holds for its device time (the scale is 1 by default, so the engine runs at
  the NPU's pace and the host's own work between calls is real, unscaled). The tokens are meaningless. The RBLN
  sampler (an NPU call in vllm-rbln) returns zeros too, and holds for the model's ``sampler(rows)`` seconds where
  the time model has that method (0 otherwise); its calls are logged as kind ``sampler``. Here the hold comes
  *after* the emulator's own work in the call (choosing the graph, the zeros: tens of microseconds), as a device
  runs after the runtime's launch: a hold of 0.2 ms cannot absorb a thread that waited for the GIL, so a call never
  overruns; its HOLD_S is the call's whole wall time, and that work (CPU_S, summed in ``Stats.cpu_s``) is the
  emulator's distortion of the pace, which bench-serve bounds (``serving/timed_bench.py``).

A call's wall time is ``max(CPU work, device_s * scale)``: the CPU's work counts inside the hold. When the CPU took
longer than the hold (an *overrun*) the call ran slower than the model says; a run with any overrun is invalid,
never quietly slower (``Stats.valid``).

Which call is which, from its inputs (as ``qvl profile`` names them, ``profiling/graphs.py``): a graph with
``cache_position`` of width > 1 is a prefill chunk of that width, its context the tokens in the KV cache after it
(first position + width); of width 1 a decoder batch of its rows, its real rows those at a position > 0 (vllm-rbln's
padding rows sit at 0), each real row's context its position + 1 (prompt + tokens generated, as
``tuning.simulate`` counts it) and the call's the longest of them (the simulator's default ``LONGEST``); a sampler
call's rows are the logits' rows as vllm-rbln pads them (``simulate.sampler_rows``); any other graph a ViT call of
the bucket its first input's length gives (the contexts as ``tuning.device_time`` defines them).
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from qwenvl_rbln.errors import QvlError

MODEL_ENV = "QVL_EMULATE_TIME_MODEL"
SCALE_ENV = "QVL_EMULATE_TIME_SCALE"
STATS_ENV = "QVL_EMULATE_TIME_STATS"
SPEED_ENV = "QVL_EMULATE_SPEED"
SPEEDS = ("cpu", "device")  # cpu: the tiny model's math runs (inside the hold); device: nothing is computed


class TimeModel(Protocol):
    """What the hold needs of ``tuning.device_time.DeviceTimeModel``: device seconds per call."""

    def vit(self, bucket: int) -> float: ...

    def prefill(self, chunk: int, context: int) -> float: ...

    def decode(self, batch: int, context: int, rows: int | None = None) -> float: ...


@dataclass(frozen=True)
class Call:
    """One graph call: ``kind`` is vit | prefill | decode | sampler, ``size`` the bucket, chunk or batch (rows)."""

    kind: str
    size: int
    context: int
    rows: int = 0  # a decode call's real rows (positions > 0: vllm-rbln's padding rows sit at 0)


def classify(info: list[tuple[str, list[int], str]], values: list[Any]) -> Call:
    """The kind, shape and context of a call with these inputs (``info`` the graph's input_info, ``values`` the
    tensors in that order)."""
    names = [n for n, _, _ in info]
    if "cache_position" in names:
        pos = values[names.index("cache_position")]
        rows, width = (int(pos.shape[0]), int(pos.shape[-1])) if pos.dim() >= 2 else (1, int(pos.numel()))
        if width > 1:  # context: tokens in the KV cache after the chunk (device_time's convention)
            return Call("prefill", width, int(pos.reshape(-1)[0]) + width)
        # a real row's context: its position + 1 (prompt + tokens generated, the simulator's); the call holds at
        # the longest real row's (the simulator's default LONGEST: model.decode(graph, max(contexts), real rows))
        real = pos.reshape(-1)[pos.reshape(-1) > 0]
        contexts = [int(p) + 1 for p in real.tolist()] or [1]
        return Call("decode", rows, max(contexts), len(real) or 1)
    return Call("vit", int(info[0][1][0]) if info and info[0][1] else 0, 0)


def device_seconds(model: TimeModel, call: Call) -> float:
    if call.kind == "sampler":  # the time model's sampler figure where it has one (tuning.simulate defines it)
        sampler = getattr(model, "sampler", None)
        return float(sampler(call.size)) if callable(sampler) else 0.0
    if call.kind == "prefill":
        return float(model.prefill(call.size, call.context))
    if call.kind == "decode":
        return float(model.decode(call.size, call.context, call.rows or call.size))
    return float(model.vit(call.size))


captures = threading.local()  # per thread: the open ``rebel_api.capture_reports`` blocks (their accumulators)


def record_call(seconds: float) -> None:
    """One call of ``seconds`` into every open ``capture_reports`` block of this thread (its device time)."""
    for acc in getattr(captures, "stack", ()):
        acc["device"] += seconds
        acc["calls"] += 1


ModelReader = Callable[[dict[str, Any]], TimeModel]
_reader: ModelReader | None = None


def set_reader(reader: ModelReader) -> None:
    """How a time model's JSON becomes a ``TimeModel`` (``tuning.device_time.DeviceTimeModel.from_json``): given
    from above (qvl's vLLM plugin in every vLLM process, the command in its own), since the emulator sits below the
    tuning layer that owns the time model and never imports it."""
    global _reader
    _reader = reader


def load_model(path: str | os.PathLike[str]) -> TimeModel:
    """The time model a JSON file holds (``DeviceTimeModel.to_json``'s output), read by the registered reader."""
    if _reader is None:
        raise QvlError(
            "no device-time model reader is registered in this process",
            "qvl's vLLM plugin registers it where QVL_EMULATE_TIME_MODEL is set (is the plugin disabled?)",
        )
    return _reader(json.loads(Path(path).read_text(encoding="utf-8")))


def model_name(model: Any) -> str:
    """The model's own name for labels (``name`` or ``describe()`` when it has one)."""
    for attr in ("name", "label", "source"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value
    return type(model).__name__


@dataclass
class Timer:
    """The hold of one process: its model, its scale and where it writes its call lines."""

    model: TimeModel
    scale: float = 1.0
    stats_dir: Path | None = None
    device_speed: bool = False  # QVL_EMULATE_SPEED=device: calls return zeros without computing
    _fh: Any = None
    _pid: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self, start: float, call: Call, floor_s: float = 0.0) -> None:
        """Sleep until ``start`` + the call's scaled device time (at least ``floor_s``); record the call."""
        device = device_seconds(self.model, call)
        cpu = time.perf_counter() - start
        if self.device_speed:  # the device's time after the emulator's own work, as an NPU's after its launch
            if device > 0:
                time.sleep(device * self.scale)
            self._record(call, device, cpu, time.perf_counter() - start)
            return
        target = max(device * self.scale, floor_s)
        if target > cpu:
            time.sleep(target - cpu)
        self._record(call, device, cpu, target)

    def _record(self, call: Call, device: float, cpu: float, target: float) -> None:
        if self.stats_dir is None:
            return
        line = (
            f"{time.time():.6f} {call.kind} {call.size} {call.context} {device:.9f} {cpu:.6f} {target:.6f} "
            f"{call.rows or call.size}\n"
        )
        with self._lock:
            if self._fh is None or self._pid != os.getpid():  # a forked child writes its own file
                self._pid = os.getpid()
                self.stats_dir.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.stats_dir / f"calls-{self._pid}.tsv", "a", encoding="utf-8", buffering=1)  # noqa: SIM115
            self._fh.write(line)


_cache: dict[tuple[str, str, str, str], Timer | None] = {}


def configured() -> Timer | None:
    """The process's timer from the environment (None: no time model); loaded once per setting."""
    key = (os.environ.get(MODEL_ENV, ""), os.environ.get(SCALE_ENV, ""), os.environ.get(STATS_ENV, ""),
           os.environ.get(SPEED_ENV, "").strip().lower())  # fmt: skip
    if key in _cache:
        return _cache[key]
    timer = None
    if key[3] not in ("", *SPEEDS):
        raise RuntimeError(f"qvl emulator: {SPEED_ENV}={key[3]!r} is not one of {', '.join(SPEEDS)}")
    if key[3] == "device" and not key[0]:
        raise RuntimeError(f"qvl emulator: {SPEED_ENV}=device needs a device-time model ({MODEL_ENV})")
    if key[0]:
        try:
            scale = float(key[1] or 1.0)
        except ValueError:
            scale = float("nan")
        if not scale > 0 or scale == float("inf"):
            raise RuntimeError(f"qvl emulator: {SCALE_ENV}={key[1]!r} is not a positive number of wall s per device s")
        try:
            model = load_model(key[0])
        except (OSError, ValueError, KeyError, TypeError, QvlError) as exc:
            raise RuntimeError(
                f"qvl emulator: {MODEL_ENV}={key[0]} cannot be read as a device-time model ({exc})"
            ) from None
        timer = Timer(model, scale, Path(key[2]) if key[2] else None, device_speed=key[3] == "device")
    _cache[key] = timer
    return timer


# ------------------------------------------------------------------------------------------------ stats


@dataclass
class Stats:
    """Graph calls of every process over a window: counts, device and CPU seconds, and the overruns."""

    calls: int = 0
    overruns: int = 0
    device_s: float = 0.0
    cpu_s: float = 0.0
    hold_s: float = 0.0
    worst_cpu_share: float = 0.0  # the largest CPU / hold of one call
    by_kind: dict[str, int] = field(default_factory=dict)
    overruns_by_kind: dict[str, int] = field(default_factory=dict)
    host_step_s: float = 0.0  # median wall time between a step's first call and the call before it (host work)

    @property
    def valid(self) -> bool:
        return self.overruns == 0

    @property
    def cpu_share(self) -> float:
        return self.cpu_s / self.hold_s if self.hold_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "overruns": self.overruns,
            "overrun_rate": self.overruns / self.calls if self.calls else 0.0,
            "valid": self.valid,
            "device_s": self.device_s,
            "cpu_share": self.cpu_share,
            "worst_cpu_share": self.worst_cpu_share,
            "by_kind": dict(self.by_kind),
            "overruns_by_kind": dict(self.overruns_by_kind),
            "host_step_s": self.host_step_s,
        }


def read_stats(directory: Path, since: float = 0.0, until: float = float("inf")) -> Stats:
    """Sum the call lines of every process in ``directory`` that ended in [since, until] (wall clock)."""
    stats = Stats()
    gaps: list[float] = []
    for path in sorted(Path(directory).glob("calls-*.tsv")):
        last_end = None
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) not in (7, 8):
                continue  # a line being written
            end, kind = float(parts[0]), parts[1]
            if not since <= end <= until:
                continue
            device, cpu, hold = float(parts[4]), float(parts[5]), float(parts[6])
            if kind != "sampler":  # the sampler runs inside a step, after its graph call
                first_of_step = kind == "decode" or kind == "vit" or parts[2] == parts[3]  # a prompt's first chunk
                if first_of_step and last_end is not None:
                    gaps.append(end - max(hold, cpu) - last_end)
                last_end = end
            stats.calls += 1
            stats.device_s += device
            stats.cpu_s += cpu
            stats.hold_s += max(hold, cpu)
            stats.by_kind[kind] = stats.by_kind.get(kind, 0) + 1
            if hold > 0:
                stats.worst_cpu_share = max(stats.worst_cpu_share, cpu / hold)
            if cpu > hold and not (kind == "sampler" and hold == 0):  # a sampler with no device time is not held
                stats.overruns += 1
                stats.overruns_by_kind[kind] = stats.overruns_by_kind.get(kind, 0) + 1
    if gaps:
        stats.host_step_s = max(0.0, statistics.median(gaps))
    return stats


def environment(model_file: Path, scale: float, stats_dir: Path | None = None, speed: str = "cpu") -> dict[str, str]:
    """The variables that switch the hold on in every process an emulated server starts (``speed`` device: nothing
    computed, see the module docstring)."""
    env = {MODEL_ENV: str(Path(model_file).resolve()), SCALE_ENV: repr(float(scale)), SPEED_ENV: speed}
    if stats_dir is not None:
        env[STATS_ENV] = str(stats_dir)
    return env


def zeros_like_specs(specs: list[tuple[list[int], str]]) -> list[Any]:
    """Well-formed outputs without computing them: zeros of each declared (shape, dtype)."""
    import torch

    from qwenvl_rbln.backends.emulator.graph import torch_dtype

    return [torch.zeros(shape, dtype=torch_dtype(dtype)) for shape, dtype in specs]
