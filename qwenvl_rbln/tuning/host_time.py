"""The host-time model: how long the host itself spends on one engine step, apart from the NPU's graph calls.

Why: on a Rebel100 a Qwen3-VL-2B decode step is bound at about 0.7 ms of device time, while vLLM's scheduler,
vllm-rbln's runner bookkeeping, input preparation and output processing take milliseconds of CPU per step. A
prediction without that time says the NPU is busy when it is waiting for the host. The timed emulator cannot show
it at a slowed-down scale (host milliseconds shrink to microseconds of device time), so it is measured at scale 1
(``--emulate-speed device``) or on an NPU host (the wall time of each step less the device time the runtime reports).

One step's host time, by kind (the step kinds of ``tuning.simulate``):

- ``prefill(tokens, images)``: ``prefill_base_s + prefill_per_token_s * tokens + prefill_per_image_s * images``;
- ``decode(rows)``: ``decode_base_s + decode_per_row_s * rows`` (``rows``: the running requests, not the graph);
- ``front(images)``: ``front_base_s + front_per_image_s * images``, the API server's own time per request before it
  reaches the scheduler (HTTP, the image decoding and HF processor, tokenising). Not an engine step: it runs in
  another process, so it delays the request (and adds to its TTFT) without holding the engine.

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
    "front_base_s",
    "front_per_image_s",
)


@dataclass(frozen=True)
class HostTimeModel:
    """Host seconds per engine step (see the module docstring)."""

    prefill_base_s: float = 0.0
    prefill_per_token_s: float = 0.0
    prefill_per_image_s: float = 0.0
    decode_base_s: float = 0.0
    decode_per_row_s: float = 0.0
    front_base_s: float = 0.0
    front_per_image_s: float = 0.0
    source: str = "none: host-free (0 s per step)"
    host: dict[str, Any] = field(default_factory=dict, compare=False)

    def prefill(self, tokens: int, images: int = 0) -> float:
        return self.prefill_base_s + self.prefill_per_token_s * tokens + self.prefill_per_image_s * images

    def decode(self, rows: int) -> float:
        return self.decode_base_s + self.decode_per_row_s * rows

    def front(self, images: int = 0) -> float:
        return self.front_base_s + self.front_per_image_s * images

    @property
    def has_front(self) -> bool:
        return self.front_base_s > 0 or self.front_per_image_s > 0

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
# This machine's measurement, not an NPU host's: the device-speed calibration run of benchmarks/bench_fidelity.py
# (``device``, artifact b8c512: batch 8, decoder graphs 1/2/4/8, prefill chunk 512), i.e. the real vLLM 0.22 +
# vllm-rbln 0.11.1a1 over qvl's emulator at scale 1 (every graph and sampler call held for the Qwen3-VL-2B
# roofline's device time, nothing computed), so the host's time is real: 72 prefill and 1,849 decode steps of
# vLLM random-mm requests (500-2,000 text tokens, 0-2 images of 1,024 patches, 32-128 output tokens) at three
# Poisson rates; least squares by kind (``tuning.host_measure``). Medians beside the fit: decode 1.27 ms at 1 row,
# 2.88 ms at 8; prefill 5.4 ms text-only, 14.9 ms with 1 image, 23.0 ms with 2. The API server's front end from the
# same calibration (the median of measured TTFT less the simulator's at its lightest rate, by images per request):
# 13 / 46 / 60 ms for 0 / 1 / 2 images, taken as 13 ms + 23.5 ms per image. The tiny artifact's host math
# (hidden 64, vocabulary 512) understates what grows with the model; an NPU host's own cores are not these.
DEFAULT = HostTimeModel(
    prefill_base_s=8.38e-3,
    prefill_per_token_s=2.6e-8,
    prefill_per_image_s=9.46e-3,
    decode_base_s=1.21e-3,
    decode_per_row_s=3.03e-4,
    front_base_s=13.0e-3,
    front_per_image_s=23.5e-3,
    source=(
        "default: this machine's measurement (emulated stack, real host time), not an NPU host's: vLLM 0.22 + "
        "vllm-rbln 0.11.1a1 over qvl's emulator at device speed (scale 1) on an Intel Xeon, 2 cores shared, load "
        "average 1.3-1.7, 2026-12-06 (benchmarks/bench_fidelity.py device, batch 8): 1.21 ms + 0.30 ms per row "
        "per decode step, 8.4 ms + 9.5 ms per image per prefill step; the API server 13 ms + 23.5 ms per image before "
        "a request reaches the scheduler"
    ),
    host={
        "cpu": "Intel(R) Xeon(R) Processor",
        "cores": 2,
        "load_average": "1.3-1.7",
        "measured_at": "2026-12-06 05:22 UTC",
        "measured_by": "benchmarks/bench_fidelity.py device (calibration run, --emulate-speed device, scale 1)",
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
        "front_end": FRONT_COUNTED if host.has_front else FRONT_NOT_COUNTED,
        "front_end_counted": host.has_front,
        "host": dict(host.host),
    }


FRONT_COUNTED = "the API server's own time per request (before the scheduler) is in every TTFT"
FRONT_NOT_COUNTED = (
    "the API server's own time per request (HTTP, image decoding and processing, before the scheduler) is not in "
    "this model, so TTFT leaves it out (measured here at 13-73 ms: docs/tuning.md, 'Fidelity at real speed')"
)


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
