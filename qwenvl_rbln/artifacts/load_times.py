"""Measured load times: what ``qvl load-check`` took to create an artifact's runtimes on a real NPU, kept so that
``qvl deploy`` sizes its startup probe from a measurement without being handed a report.

File: ``$QVL_HOME/load-times.json``::

    {"format": "qvl-load-times", "version": 1,
     "entries": {"<graph hash>": {"seconds": 41.2, "npu": "RBLN-CR13", "date": "2026-12-03T10:00:00Z",
                                  "artifact": "/models/qwen3-vl-2b"}}}

Keyed by the artifact's graph hash (``manifest.graph_hash``: the compiled ``.rbln`` files), so a copy of the
artifact elsewhere finds its measurement and a recompile does not inherit an old one. The newest load wins. Only a
real runtime creation is recorded: an emulated load or ``--no-runtime`` says nothing about an NPU. Written under a
lock, atomically; a damaged file is one line naming it and the fix.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenvl_rbln.artifacts import flock
from qwenvl_rbln.artifacts.manifest import RBLN_CONFIG_NAME, graph_hash, read_manifest, write_json_atomic
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.catalogue.modelinfo import qvl_home
from qwenvl_rbln.units import fmt_json

if TYPE_CHECKING:
    from qwenvl_rbln.artifacts.checked import CheckedArtifact

FORMAT = "qvl-load-times"
VERSION = 1
FILE_NAME = "load-times.json"
MAX_LOAD_S = 86_400  # a day: no runtime creation takes longer; a figure above it is damage, not a measurement


def load_seconds(value: Any) -> float | None:
    """``value`` as a measured load time in seconds, or None when it is not one: a JSON number (not true/false),
    finite, above 0 and at most ``MAX_LOAD_S``. The comparison is made on the value as parsed, so NaN, Infinity and
    an integer too large for a float are refused here rather than crashing a later ``int()`` or ``float()``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not 0 < value <= MAX_LOAD_S:  # False for NaN as well
        return None
    return float(value)


def load_times_path() -> Path:
    return qvl_home() / FILE_NAME


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"format": FORMAT, "version": VERSION, "entries": {}}
    except (OSError, ValueError) as exc:
        raise InputError(f"load-time file {path} cannot be read ({exc})", f"delete {path}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise InputError(f"load-time file {path} is not a {FORMAT} file", f"delete {path}")
    return data


def _compiled_npu(artifact: Path, manifest: dict[str, Any] | None) -> str | None:
    """The NPU the graphs were compiled for (``layout.compile_target``), or None when the files do not say."""
    from qwenvl_rbln.artifacts.layout import compile_target, read_json_quiet

    cfg = read_json_quiet(artifact / RBLN_CONFIG_NAME)
    return compile_target(cfg, manifest)["npu"] if cfg is not None else None


def record_load(
    artifact: Path,
    seconds: float,
    path: Path | None = None,
    *,
    key: str | None = None,
    art: CheckedArtifact | None = None,
) -> Path:
    """Keep this artifact's measured load (runtimes created on a real NPU) for later deploys. ``key``: its graph hash
    when the caller computed it already; ``art``: the artifact as the caller read it (manifest and target NPU are not
    read again)."""
    path = path or load_times_path()
    manifest = art.manifest if art is not None else read_manifest(artifact)
    key = key or graph_hash(artifact, manifest)
    npu = art.target["npu"] if art is not None else _compiled_npu(artifact, manifest)
    path.parent.mkdir(parents=True, exist_ok=True)
    with flock.held(path.with_name(f".{path.name}.lock"), blocking=True):
        data = _read(path)
        data["entries"][key] = {
            "seconds": round(float(seconds), 3),
            "npu": npu,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "artifact": str(artifact.resolve()),
        }
        write_json_atomic(path, data)
    return path


def measured_load(artifact: Path, path: Path | None = None, *, key: str | None = None) -> dict[str, Any] | None:
    """The newest recorded load of this artifact's graphs, or None when load-check never measured one here. An entry
    whose seconds are not a load time (NaN, 0, negative, absurd: a damaged file) is refused in one line, never used
    and never silently read as "not measured". ``key``: the graph hash when the caller computed it already."""
    path = path or load_times_path()
    if not path.is_file():
        return None
    entry = _read(path)["entries"].get(key or graph_hash(artifact, read_manifest(artifact)))
    if entry is None:
        return None
    raw = entry.get("seconds") if isinstance(entry, dict) else entry
    seconds = load_seconds(raw) if isinstance(entry, dict) else None  # an entry is a table: {"seconds", "npu", ...}
    if seconds is None:
        held = f"seconds={fmt_json(raw)}" if isinstance(entry, dict) else f"{fmt_json(entry)} (not a table)"
        raise InputError(
            f"load-time file {path}: the entry for {artifact}'s graphs holds {held}, not a load time "
            f"(a number of seconds above 0 and at most {MAX_LOAD_S}); the file is damaged",
            f"delete {path} (the next `qvl load-check` on the NPU host records the load again), or pass --load-check",
        )
    return {**entry, "seconds": seconds, "file": str(path)}
