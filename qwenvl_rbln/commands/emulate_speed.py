"""``--emulate-speed`` and ``--time-model``, shared by ``qvl serve`` and ``qvl bench-serve``: which emulation runs
and at what pace, checked in one place so both commands refuse the same things in the same words."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer

from qwenvl_rbln.errors import InputError

SPEEDS = ("cpu", "device")
DEFAULT_CPU_SCALE = 3000.0  # the fidelity runs' scale (docs/tuning.md): the tiny model's CPU work fits its holds
EXAMPLE_MODEL = "roofline:Qwen/Qwen3-VL-2B-Instruct"

EmulateSpeedOpt = typer.Option(
    "cpu",
    "--emulate-speed",
    metavar="cpu|device",
    help="With --emulate: 'cpu' (default) computes every graph of the (tiny) artifact on the CPU; 'device' computes "
    "none: each graph call returns zeros of its compiled shapes and holds for its device time under --time-model "
    "(scale 1), so the real vLLM + vllm-rbln run at the NPU's pace and the host's own time is real. The output "
    "tokens are then meaningless (add --ignore-eos to keep their lengths).",
)
TimeModelHelp = (
    "roofline:HUB_ID (that model's roofline at DIR's compiled shapes), timings:FILE (qvl profile's timings.json) or a "
    "DeviceTimeModel JSON file"
)


def resolve(*, emulate: bool, speed: str, time_model: str | None, scale: float | None) -> tuple[str, float]:
    """(speed, scale) with the defaults: scale 1 at device speed, DEFAULT_CPU_SCALE for the timed CPU emulator."""
    speed = str(speed).strip().lower()
    if speed not in SPEEDS:
        raise InputError(f"--emulate-speed {speed!r} is not cpu or device", f"e.g. --emulate-speed device "
                         f"--time-model {EXAMPLE_MODEL}")  # fmt: skip
    if speed == "device" and not emulate:
        raise InputError("--emulate-speed device runs the emulator: it needs --emulate",
                         f"add --emulate (and --time-model {EXAMPLE_MODEL})")  # fmt: skip
    if speed == "device" and time_model is None:
        raise InputError("--emulate-speed device holds each graph call for its device time: it needs --time-model",
                         f"e.g. --time-model {EXAMPLE_MODEL}")  # fmt: skip
    if scale is not None and time_model is None:
        raise InputError(f"--time-scale {scale:g} scales the timed emulator's holds: it needs --time-model",
                         f"add --time-model {EXAMPLE_MODEL}, or drop --time-scale")  # fmt: skip
    if scale is None:
        scale = 1.0 if speed == "device" else DEFAULT_CPU_SCALE
    if not (math.isfinite(scale) and scale > 0):
        raise InputError(f"--time-scale {scale} is not a positive number",
                         "e.g. --time-scale 1 with --emulate-speed device, 3000 without")  # fmt: skip
    return speed, float(scale)


def load_model(spec: str, directory: Path) -> Any:
    """The device-time model ``--time-model`` names, checked against the artifact (``tuning.time_model_check``)."""
    from qwenvl_rbln.errors import QvlError
    from qwenvl_rbln.tuning import time_model_check
    from qwenvl_rbln.tuning.device_time import model_for_flag

    try:
        model = model_for_flag(str(spec), directory)
    except InputError as exc:
        raise InputError(f"--time-model {spec}: {exc.message}", exc.hint) from None
    except (OSError, ValueError, KeyError, TypeError, QvlError) as exc:
        raise InputError(f"--time-model {spec} cannot be read as a device-time model ({exc})",
                         TimeModelHelp) from None  # fmt: skip
    time_model_check.check(model, directory, str(spec))
    return model


def serve_environment(model: Any, speed: str) -> dict[str, str]:
    """What ``qvl serve --emulate --emulate-speed device`` adds to vLLM's environment: the model as a file under
    ``$QVL_HOME/emulate/`` (named by its content, kept while any server may read it) and the hold at scale 1."""
    import hashlib
    import json

    from qwenvl_rbln.backends.emulator import timed
    from qwenvl_rbln.planning.catalogue.modelinfo import qvl_home

    text = json.dumps(model.to_json(), sort_keys=True)
    path = qvl_home() / "emulate" / f"time-model-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file():
        path.write_text(text, encoding="utf-8")
    return timed.environment(path, 1.0, None, speed)
