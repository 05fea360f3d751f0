"""Measured graph timings (``qvl profile``) that replace the roofline, graph by graph: the file, and their lookup.

File: ``$QVL_HOME/timings.json``, format version 2::

    {"format": "qvl-timings", "version": 2,
     "entries":  {"<entry key>": ENTRY, ...},     # real NPU runs: the only section tune reads
     "emulated": {"<entry key>": ENTRY, ...}}     # --emulate runs: kept apart, never read for an NPU

The entry key is ``NPU | rebel version | optimum-rbln version | graph hash`` (the sha256 over the artifact's
compiled ``.rbln`` files, from its manifest), so a re-profile of the same graphs with the same software replaces
its own entry and nothing else. An ENTRY holds the model key (``memory.calibration.model_key``), when it ran, the
time source (device time from ``rebel.capture_reports()`` or wall time), and ``graphs``: per calibration key
(``decoder_batch_4/block8192``, ``prefill/chunk512/block8192``, ``visual/call16384``) the measured points
(context -> median, p10, p90, min, max seconds) and, over context, the fit ``c0 + a*n + b*n^2``
(``tuning.fit``) with its error. Version 1 (hand-written seconds, no versions or hashes) is refused with the
fix: move it aside and profile again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.catalogue.modelinfo import qvl_home
from qwenvl_rbln.tuning.fit import Fit

FORMAT = "qvl-timings"
VERSION = 2
FILE_NAME = "timings.json"
REAL, EMULATED = "entries", "emulated"
SPREAD = "p10-p90"


def timings_path() -> Path:
    return qvl_home() / FILE_NAME


def visual_call_key(bucket: int) -> str:
    return f"visual/call{bucket}"


def entry_key(npu: str, rebel: str, optimum_rbln: str, graph_hash: str) -> str:
    return f"{npu} | rebel {rebel} | optimum-rbln {optimum_rbln} | {graph_hash}"


def _refuse(path: Path, why: str) -> InputError:
    return InputError(f"timings file {path} {why}", f"move it aside (mv {path} {path}.old) and run `qvl profile DIR`")


def read_file(path: Path | None = None) -> dict[str, Any]:
    """The whole file (an empty v2 document when there is none); refuses v1 and anything malformed."""
    path = path or timings_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"format": FORMAT, "version": VERSION, REAL: {}, EMULATED: {}}
    except (OSError, ValueError) as exc:
        raise _refuse(path, f"cannot be read ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _refuse(path, f"is not a {FORMAT} file")
    if data.get("version") != VERSION:
        raise _refuse(path, f"is format version {data.get('version')!r}; this qvl reads version {VERSION}")
    for section in (REAL, EMULATED):
        if not isinstance(data.setdefault(section, {}), dict):
            raise _refuse(path, f"has a '{section}' that is not a table")
    return data


def write_entry(key: str, entry: dict[str, Any], *, emulated: bool, path: Path | None = None) -> Path:
    """Replace this one entry (its section: emulated or real) and write the file atomically, under a lock."""
    from qwenvl_rbln.artifacts import flock
    from qwenvl_rbln.artifacts.manifest import write_json_atomic

    path = path or timings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with flock.held(path.with_name(f".{path.name}.lock"), blocking=True):
        data = read_file(path)
        data[EMULATED if emulated else REAL][key] = {**entry, "emulated": bool(emulated)}
        write_json_atomic(path, data)
    return path


# ------------------------------------------------------------------------------------------------ lookup


@dataclass(frozen=True)
class GraphTiming:
    """One graph's measured points and fit, and where they came from (for the label)."""

    key: str
    points: dict[int, dict[str, float]]  # context -> {median_s, p10_s, p90_s, ...}
    fit: Fit | None
    npu: str
    date: str
    emulated: bool

    def seconds(self, context: float | None) -> tuple[float, str]:
        """(seconds, "measured" | "fitted") at ``context``: a measured point when one is there, else the fit."""
        if context is not None and self.fit is not None and int(round(context)) not in self.points:
            return max(self.fit(context), 0.0), "fitted"
        n = min(self.points, key=lambda c: abs(c - (context or 0)))
        return self.points[n]["median_s"], "measured"

    def spread(self) -> float:
        """Half the widest p10-p90 band over the points, relative to its median."""
        return max(((p["p90_s"] - p["p10_s"]) / 2 / p["median_s"] for p in self.points.values() if p["median_s"]),
                   default=0.0)  # fmt: skip

    def label(self, how: str) -> str:
        where = f"{self.npu}{', emulated' if self.emulated else ''}, {self.date[:10]}"
        if how == "fitted" and self.fit is not None:
            return f"fitted ({where}, fit +-{self.fit.rms_rel_error:.0%})"
        return f"measured ({where}, +-{self.spread():.0%} {SPREAD})"


@dataclass
class Measured:
    """The graphs measured for one model on one NPU (newest entry per graph wins)."""

    graphs: dict[str, GraphTiming] = field(default_factory=dict)

    def get(self, key: str) -> GraphTiming | None:
        return self.graphs.get(key)


def _graph(key: str, rec: Any, entry: dict[str, Any], path: Path) -> GraphTiming:
    try:
        points = {int(p["context"]): {k: float(v) for k, v in p.items() if k.endswith("_s")} for p in rec["points"]}
        if not points or any(p["median_s"] <= 0 for p in points.values()):
            raise ValueError("no positive median")
        fit = Fit.from_dict(rec["fit"]) if rec.get("fit") else None
    except (KeyError, TypeError, ValueError) as exc:
        raise _refuse(path, f"has a bad graph {key!r} ({exc})") from None
    return GraphTiming(key, points, fit, str(entry.get("npu")), str(entry.get("profiled_at", "")),
                       bool(entry.get("emulated")))  # fmt: skip


def load_measured(model_key: str, npu: str, path: Path | None = None, *, emulated: bool = False) -> Measured:
    """The measured graphs for ``model_key`` on ``npu``: from the real section, or (``emulated=True``, only for
    an emulated run) from the emulated one. Never mixes the two: emulated figures are not an NPU's."""
    path = path or timings_path()
    data = read_file(path)
    out = Measured()
    entries = sorted(data[EMULATED if emulated else REAL].values(), key=lambda e: str(e.get("profiled_at", "")))
    for entry in entries:  # oldest first: a newer entry's graph replaces an older one's
        if not isinstance(entry, dict) or entry.get("model_key") != model_key or entry.get("npu") != npu:
            continue
        if bool(entry.get("emulated")) != emulated:
            continue
        for key, rec in (entry.get("graphs") or {}).items():
            out.graphs[key] = _graph(key, rec, entry, path)
    return out
