"""The host-time model: how long the host itself spends on one engine step, apart from the NPU's graph calls.

Why: on a Rebel100 a Qwen3-VL-2B decode step is bound at about 0.7 ms of device time, while vLLM's scheduler,
vllm-rbln's runner bookkeeping, input preparation and output processing take milliseconds of CPU per step. A
prediction without that time says the NPU is busy when it is waiting for the host. The timed emulator cannot show
it at a slowed-down scale (host milliseconds shrink to microseconds of device time), so it is measured at scale 1
(``--emulate-speed device``) or on an NPU host (the wall time of each step less the device time the runtime reports).

One step's host time, by kind (the step kinds of ``tuning.simulate``):

- ``prefill(tokens, images)``: ``prefill_base_s + prefill_per_token_s * tokens + prefill_per_image_s * images``;
- ``decode(rows)``: ``decode_base_s + decode_per_row_s * rows`` (``rows``: the running requests, not the graph).

``source`` names where the figures come from (measured on which host, or the default this qvl ships and why) and
is printed beside every prediction that uses them; ``host`` is the machine it was measured on (CPU model, cores,
load average). Recorded in timings.json's ``host_time`` section (``record`` / ``recorded``), one entry per host key.

Pure: no torch, no vLLM.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError

SECTION = "host_time"
COEFFICIENTS = (
    "prefill_base_s",
    "prefill_per_token_s",
    "prefill_per_image_s",
    "decode_base_s",
    "decode_per_row_s",
)


@dataclass(frozen=True)
class HostTimeModel:
    """Host seconds per engine step (see the module docstring)."""

    prefill_base_s: float = 0.0
    prefill_per_token_s: float = 0.0
    prefill_per_image_s: float = 0.0
    decode_base_s: float = 0.0
    decode_per_row_s: float = 0.0
    source: str = "none: host-free (0 s per step)"
    host: dict[str, Any] = field(default_factory=dict, compare=False)

    def prefill(self, tokens: int, images: int = 0) -> float:
        return self.prefill_base_s + self.prefill_per_token_s * tokens + self.prefill_per_image_s * images

    def decode(self, rows: int) -> float:
        return self.decode_base_s + self.decode_per_row_s * rows

    @property
    def is_zero(self) -> bool:
        return all(getattr(self, k) == 0 for k in COEFFICIENTS)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Any, where: str = "host-time model") -> HostTimeModel:
        """Refuses anything but finite, non-negative coefficients, naming the key."""
        if not isinstance(d, dict):
            raise InputError(f"{where} is not a table", "write it with HostTimeModel.to_json()")
        values: dict[str, Any] = {}
        for key in COEFFICIENTS:
            raw = d.get(key, 0.0)
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) or raw < 0:
                raise InputError(f"{where}: {key}={raw!r} is not a finite number of seconds >= 0",
                                 "measure it again (qvl bench-serve --emulate --emulate-speed device)")  # fmt: skip
            values[key] = float(raw)
        host = d.get("host") if isinstance(d.get("host"), dict) else {}
        return cls(**values, source=str(d.get("source") or "recorded"), host=host)


HOST_FREE = HostTimeModel()

# ---- DEFAULT: the figure a prediction uses when timings.json has no host_time entry (never 0 in silence) --------
# PROVISIONAL: this machine's measurement so far, the one figure the fidelity runs gave (bench_fidelity.py's
# host_step_s: the median wall gap before each engine step's first graph call, 3-5 ms over its 9 runs), split here
# by hand into a decode and a prefill base. The per-row, per-token and per-image terms were not measured apart: 0
# until the device-speed emulator's measurement (``record``) replaces these numbers.
DEFAULT = HostTimeModel(
    prefill_base_s=4e-3,
    prefill_per_token_s=0.0,
    prefill_per_image_s=0.0,
    decode_base_s=3e-3,
    decode_per_row_s=0.0,
    source=(
        "default: this machine's measurement (provisional), not an NPU host's: 3-5 ms of wall time per engine "
        "step, the host gap benchmarks/bench_fidelity.py measured (host_step_s) in 9 timed-emulator runs of vLLM "
        "0.22 + vllm-rbln 0.11.1a1 (batch 2-8) on an Intel Xeon, 2 cores shared (load average 10-12); taken as "
        "3 ms per decode step, 4 ms per prefill step"
    ),
    host={
        "cpu": "Intel(R) Xeon(R) Processor",
        "cores": 2,
        "load_average": "10-12",
        "measured_by": "benchmarks/bench_fidelity.py host_step_s (timed emulator, scale 3000)",
    },  # fmt: skip
)


def for_prediction(path: Path | None = None) -> tuple[HostTimeModel, bool]:
    """The host-time model a prediction uses: timings.json's newest ``host_time`` entry (``path``, default qvl's
    timings.json), else ``DEFAULT``; and whether it was measured (recorded) rather than the default."""
    if path is None:
        from qwenvl_rbln.tuning.measured import timings_path

        path = timings_path()
    found = recorded(path)
    return (found, True) if found is not None else (DEFAULT, False)


def section(host: HostTimeModel, measured: bool) -> dict[str, Any]:
    """The host-time model a prediction used, for --json and the footer under tune's tables: never 0 in silence."""
    return {
        "source": host.source,
        "measured": measured,
        "seconds": {k: getattr(host, k) for k in COEFFICIENTS},
        "host": dict(host.host),
    }


def read_section(path: Path) -> dict[str, Any]:
    """timings.json's host-time entries ({} when the file or the section is missing)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InputError(f"timings file {path} cannot be read ({type(exc).__name__})",
                         f"move it aside (mv {path} {path}.old)") from None  # fmt: skip
    section = data.get(SECTION, {}) if isinstance(data, dict) else {}
    return section if isinstance(section, dict) else {}


def recorded(path: Path, key: str | None = None) -> HostTimeModel | None:
    """The host-time model recorded under ``key`` (the newest entry when None); None when there is none."""
    section = read_section(path)
    if not section:
        return None
    if key is None:
        key = max(section, key=lambda k: str((section[k] or {}).get("measured_at", "")))
    if key not in section:
        return None
    return HostTimeModel.from_json(section[key], where=f"{path} {SECTION}[{key!r}]")


def record(model: HostTimeModel, key: str, path: Path | None = None) -> Path:
    """Write ``model`` under ``key`` in timings.json's host-time section (the default file: ``$QVL_HOME/timings.json``),
    stamped ``measured_at`` (UTC), atomically (temp file + rename) and under the file's lock, as ``qvl profile``
    writes its entries (``measured.write_entry``); the other sections and entries are kept as they are."""
    from datetime import UTC, datetime

    from qwenvl_rbln.artifacts import flock
    from qwenvl_rbln.artifacts.manifest import write_json_atomic
    from qwenvl_rbln.tuning.measured import read_file, timings_path

    path = path or timings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {**model.to_json(), "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    with flock.held(path.with_name(f".{path.name}.lock"), blocking=True):
        data = read_file(path)  # refuses a file qvl cannot read (v1, a newer version, malformed) with the fix
        section = data.get(SECTION)
        data[SECTION] = {**(section if isinstance(section, dict) else {}), key: entry}
        write_json_atomic(path, data)
    return path
