"""The batch job's flags checked before any work: ``--output``/``--resume``, ``--workers``, ``--devices``,
``--ray-address`` and what they cannot be combined with. Each bad value is one line naming it and the fix."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError

_ADDRESS = re.compile(r"^(?P<host>[A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:]+\]):(?P<port>\d{1,5})$")
_POOL_FLAGS = ("--workers", "--devices", "--ray-address")


def parse_devices(value: str | None) -> list[int] | None:
    """``--devices 0,1,2,3``: distinct NPU ids >= 0, in the order given."""
    if value is None:
        return None
    hint = "list NPU ids separated by commas, e.g. --devices 0,1,2,3"
    parts = [p.strip() for p in value.split(",")]
    if not value.strip() or any(not p for p in parts):
        raise InputError(f"--devices {value!r} has an empty entry", hint)
    ids: list[int] = []
    for p in parts:
        if not p.isdigit():
            raise InputError(f"--devices {value!r}: {p!r} is not an NPU id (an integer >= 0)", hint)
        if int(p) in ids:
            raise InputError(f"--devices {value!r} lists NPU {int(p)} twice", "name each NPU once")
        ids.append(int(p))
    return ids


def check_workers(workers: int | None) -> int | None:
    if workers is not None and workers < 1:
        raise InputError(f"--workers {workers} must be at least 1", "e.g. --workers 4 (one worker per NPU)")
    return workers


def check_ray_address(address: str | None) -> str | None:
    """``auto`` (the cluster this host belongs to) or ``host:port`` (the head's GCS address).

    ``ray://host:port`` (Ray Client) is refused: qvl's pool is a Ray driver (it places actors on NPUs, reads node
    resources, probes the artifact on every node), which it runs on a node of the cluster, not through Ray Client
    (an extra that is not installed with qvl, and a path qvl is not tested on)."""
    if address is None:
        return None
    text = address.strip()
    if text == "auto":
        return text
    if text.lower().startswith("ray://"):
        raise InputError(
            f"--ray-address {address!r} is a Ray Client address (ray://); qvl's pool runs as a Ray driver on a node "
            "of the cluster, not through Ray Client",
            "run qvl on a node of the cluster with --ray-address auto, or pass the head's GCS address HOST:PORT "
            "(port 6379 unless the head was started with another; `ray status` on the head prints it)",
        )
    match = _ADDRESS.match(text)
    if not match or not 0 < int(match.group("port")) < 65536:
        raise InputError(
            f"--ray-address {address!r} is not a Ray address",
            "pass auto (the cluster this host has joined) or HOST:PORT of the head node, e.g. 10.0.0.5:6379",
        )
    return text


def check_combination(
    *,
    batch_file: Path | None,
    output: Path | None,
    resume: bool,
    workers: int | None,
    devices: list[int] | None,
    ray_address: str | None,
    single: dict[str, Any],
) -> None:
    """What ``--output`` and the pool flags need, and what they exclude (``single``: the one-run flags given,
    e.g. ``{"--device": 1}``)."""
    pool = [f for f, v in zip(_POOL_FLAGS, (workers, devices, ray_address), strict=True) if v is not None]
    needs_output = ([*pool] + (["--resume"] if resume else [])) if output is None else []
    if needs_output:
        raise InputError(
            f"{', '.join(needs_output)} need{'s' if len(needs_output) == 1 else ''} --output (the results file the "
            "job writes as it goes)",
            "add --batch-file FILE --output results.jsonl",
        )
    if output is not None and batch_file is None:
        raise InputError("--output writes a batch job's results and needs --batch-file", "add --batch-file FILE")
    placed = [flag for flag, value in single.items() if value is not None]
    if pool and placed:
        raise InputError(
            f"{', '.join(placed)} place one run; with {', '.join(pool)} each worker gets its own NPUs",
            "drop " + ", ".join(placed) + " (use --devices to choose the NPUs)",
        )
    if devices is not None and ray_address is not None:
        raise InputError(
            "--devices pins NPUs of this host; with --ray-address each worker asks the cluster for free NPUs",
            "drop --devices and pass --workers N",
        )
    if devices is not None and workers is not None and workers > len(devices):
        raise InputError(
            f"--workers {workers} with --devices {','.join(map(str, devices))}: {len(devices)} NPUs cannot hold "
            f"{workers} workers (one NPU each)",
            f"pass --workers {len(devices)} or fewer, or list more NPUs",
        )
