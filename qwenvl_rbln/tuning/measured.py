"""Measured graph timings (``qvl profile``) that replace the roofline, graph by graph: the file, and their lookup.

File: ``$QVL_HOME/timings.json``, format version 2::

    {"format": "qvl-timings", "version": 2,
     "entries":  {"<entry key>": ENTRY, ...},     # real NPU runs: the only section tune reads
     "emulated": {"<entry key>": ENTRY, ...}}     # --emulate runs: kept apart, never read for an NPU

The entry key is ``NPU | rebel version | optimum-rbln version | graph hash`` (the sha256 over the artifact's
compiled ``.rbln`` files, from its manifest), so a re-profile of the same graphs with the same software merges
into its own entry and nothing else: the graphs it timed replace theirs, the others are kept with their own date
(``profile --only``). An ENTRY holds the model key (``memory.calibration.model_key``), when it ran, the time
source (device time from ``rebel.capture_reports()`` or wall time), and ``graphs``: per calibration key
(``decoder_batch_4/block8192``, ``prefill/chunk512/block8192``, ``visual/call16384``) when it was timed, the
measured points (context -> median, p10, p90, min, max seconds) and, over context, the fit ``c0 + a*n + b*n^2``
(``tuning.fit``) with its error. Every record is checked before a figure of it is used (``measured_check``:
finite, 1 us .. 1 h, p10 <= median <= p90, whole contexts); a bad one refuses the file naming the value. Version 1
(hand-written seconds, no versions or hashes) and versions newer than this qvl's are refused with the fix: move it
aside and profile again.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.catalogue.modelinfo import qvl_home
from qwenvl_rbln.tuning.fit import Fit
from qwenvl_rbln.tuning.measured_check import BadRecord, check_record, shown

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
    """The whole file (an empty v2 document when there is none); refuses v1, a newer version and anything
    malformed. Graph records are checked where they are read (``load_measured``, ``check_entry``)."""
    path = path or timings_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"format": FORMAT, "version": VERSION, REAL: {}, EMULATED: {}}
    except (OSError, ValueError, RecursionError) as exc:
        raise _refuse(path, f"cannot be read ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _refuse(path, f"is not a {FORMAT} file")
    if data.get("version") != VERSION:
        raise _refuse(path, f"is format version {shown(data.get('version'))}; this qvl reads version {VERSION}")
    for section in (REAL, EMULATED):
        if not isinstance(data.setdefault(section, {}), dict):
            raise _refuse(path, f"has a '{section}' that is not a table")
    return data


def bad_value(path: Path, entry_key: str, graph: str | None, why: str) -> InputError:
    where = f"entry {shown(entry_key)}" + (f", graph {shown(graph)}" if graph is not None else "")
    return _refuse(path, f"has a value no graph call can have in {where}: {why}")


def check_entry(key: str, entry: Any, path: Path) -> None:
    """Refuse an entry whose graph records cannot be used (``measured_check``), naming the value."""
    if not isinstance(entry, dict):
        raise _refuse(path, f"has an entry {shown(key)} that is not a table")
    graphs = entry.get("graphs")
    if not isinstance(graphs, dict):
        raise bad_value(path, key, None, f"graphs={shown(graphs)} is not a table")
    for graph, rec in graphs.items():
        try:
            check_record(rec)
        except BadRecord as exc:
            raise bad_value(path, key, graph, str(exc)) from None


STAMPS = ("profiled_at", "warmup", "repeats")  # per graph, so a merged entry keeps each graph's own


def _stamped(entry: dict[str, Any]) -> dict[str, Any]:
    stamp = {k: entry[k] for k in STAMPS if k in entry}
    return {g: {**stamp, **rec} if isinstance(rec, dict) else rec for g, rec in (entry.get("graphs") or {}).items()}


def merge_entry(path: Path, key: str, old: Any, new: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``new`` over ``old``: the graphs ``new`` timed replace their own records, the others are kept with their own
    date (a ``qvl profile --only vit`` re-times the ViT and never drops the decoder's figures). (entry, kept keys)"""
    graphs = _stamped(new)
    if old is None:
        return {**new, "graphs": graphs}, []
    check_entry(key, old, path)
    previous = _stamped(old)
    kept = sorted(set(previous) - set(graphs))
    return {**new, "graphs": dict(sorted({**{g: previous[g] for g in kept}, **graphs}.items()))}, kept


def check_writable(key: str, *, emulated: bool, path: Path | None = None) -> None:
    """What ``write_entry`` would refuse, asked before anything is measured: the file, and the entry a new
    profile of this artifact merges into."""
    path = path or timings_path()
    old = read_file(path)[EMULATED if emulated else REAL].get(key)
    if old is not None:
        check_entry(key, old, path)


def write_entry(key: str, entry: dict[str, Any], *, emulated: bool, path: Path | None = None) -> tuple[Path, list[str]]:
    """Merge this entry into its section (emulated or real; ``merge_entry``) and write the file atomically, under
    a lock. Returns the file and the graphs kept from an earlier profile of the same entry."""
    from qwenvl_rbln.artifacts import flock
    from qwenvl_rbln.artifacts.manifest import write_json_atomic

    path = path or timings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with flock.held(path.with_name(f".{path.name}.lock"), blocking=True):
        data = read_file(path)
        section = data[EMULATED if emulated else REAL]
        section[key], kept = merge_entry(path, key, section.get(key), {**entry, "emulated": bool(emulated)})
        write_json_atomic(path, data)
    return path, kept


# ------------------------------------------------------------------------------------------------ lookup

MEASURED, FITTED, INTERPOLATED, EXTRAPOLATED = "measured", "fitted", "interpolated", "extrapolated"
RISK = {MEASURED: 0, FITTED: 1, INTERPOLATED: 2, EXTRAPOLATED: 3}  # a graph's label names the least sure figure


@dataclass(frozen=True)
class GraphTiming:
    """One graph's measured points and fit, and where they came from (for the label)."""

    key: str
    points: dict[int, dict[str, float]]  # context -> {median_s, p10_s, p90_s}, checked (measured_check)
    fit: Fit | None
    npu: str
    date: str
    emulated: bool
    path: str = ""  # the file and the entry it came from, for a refusal that names them
    entry: str = ""

    def _t(self, n: int) -> float:
        return self.points[n]["median_s"]

    @cached_property
    def contexts(self) -> list[int]:
        """The measured contexts, sorted once (a lookup runs per simulated step)."""
        return sorted(self.points)

    def _fit_at(self, x: float) -> float | None:
        value = self.fit(x) if self.fit is not None else None
        return value if value is not None and math.isfinite(value) else None

    def seconds(self, context: float | None) -> tuple[float, str]:
        """(seconds, how) at ``context``, never 0 nor below a measured time it should not beat:

        - ``measured``: a measured context (the ViT's one point for ``None``);
        - ``fitted``: between two measured contexts, the fit held between their two times (``interpolated``,
          linear, without a fit);
        - ``extrapolated``: past the last measured context, the fit but never below the last measured time (a
          longer context is never faster: a fit that flattens or turns down there is not the card); before the
          first, the first measured time.
        """
        ctxs = self.contexts
        if context is None:
            return self._t(ctxs[0]), MEASURED
        x = float(context)
        if int(round(x)) in self.points:
            return self._t(int(round(x))), MEASURED
        if x > ctxs[-1]:
            guess, floor = self._fit_at(x), self._t(ctxs[-1])
            return (floor if guess is None else max(guess, floor)), EXTRAPOLATED
        if x < ctxs[0]:
            return self._t(ctxs[0]), EXTRAPOLATED
        i = bisect.bisect_right(ctxs, x)
        a, b = ctxs[i - 1], ctxs[i]
        ta, tb = self._t(a), self._t(b)
        guess = self._fit_at(x)
        if guess is None:
            return ta + (tb - ta) * (x - a) / (b - a), INTERPOLATED
        return min(max(guess, min(ta, tb)), max(ta, tb)), FITTED

    def spread(self) -> float:
        """Half the widest p10-p90 band over the points, relative to its median."""
        return max((p["p90_s"] - p["p10_s"]) / 2 / p["median_s"] for p in self.points.values())

    def label(self, how: str) -> str:
        where = f"{self.npu}{', emulated' if self.emulated else ''}, {self.date[:10]}"
        ctxs = self.contexts
        if how == EXTRAPOLATED:
            span = f"measured contexts {ctxs[0]}-{ctxs[-1]}" if len(ctxs) > 1 else f"its one measured context {ctxs[0]}"
            return f"extrapolated ({where}, outside {span}; never below the nearest measured time)"
        if how == INTERPOLATED:
            return f"interpolated ({where}, linear between measured contexts)"
        if how == FITTED and self.fit is not None:
            return f"fitted ({where}, fit +-{self.fit.rms_rel_error:.0%})"
        return f"measured ({where}, +-{self.spread():.0%} {SPREAD})"


@dataclass
class Measured:
    """The graphs measured for one model on one NPU (the newest record of each graph wins)."""

    graphs: dict[str, GraphTiming] = field(default_factory=dict)

    def get(self, key: str) -> GraphTiming | None:
        return self.graphs.get(key)


def _graph(key: str, rec: Any, entry_key: str, entry: dict[str, Any], path: Path) -> GraphTiming:
    try:
        points, fit = check_record(rec)
    except BadRecord as exc:
        raise bad_value(path, entry_key, key, str(exc)) from None
    date = rec.get("profiled_at", entry.get("profiled_at", ""))
    return GraphTiming(key, points, fit, str(entry.get("npu")), str(date), bool(entry.get("emulated")), str(path),
                       entry_key)  # fmt: skip


def load_measured(
    model_key: str, npu: str, path: Path | None = None, *, emulated: bool = False, graph_hash: str | None = None
) -> Measured:
    """The measured graphs for ``model_key`` on ``npu``: from the real section, or (``emulated=True``, only for
    an emulated run) from the emulated one. Never mixes the two: emulated figures are not an NPU's. Every record
    used is checked first (``measured_check``): a bad one refuses the file, naming the value. ``graph_hash``
    (a caller that has the artifact): only that artifact's entries. Of two records of one graph the newer wins."""
    path = path or timings_path()
    data = read_file(path)
    out = Measured()
    for entry_key, entry in data[EMULATED if emulated else REAL].items():
        if not isinstance(entry, dict):
            raise _refuse(path, f"has an entry {shown(entry_key)} that is not a table")
        if entry.get("model_key") != model_key or entry.get("npu") != npu:
            continue
        if bool(entry.get("emulated")) != emulated:
            continue
        if graph_hash is not None and entry.get("graph_hash") != graph_hash:
            continue
        graphs = entry.get("graphs")
        if not isinstance(graphs, dict):
            raise bad_value(path, entry_key, None, f"graphs={shown(graphs)} is not a table")
        for key, rec in graphs.items():
            timing = _graph(key, rec, entry_key, entry, path)
            old = out.graphs.get(key)
            if old is None or timing.date >= old.date:  # the newer record (ties: the later in the file)
                out.graphs[key] = timing
    return out
