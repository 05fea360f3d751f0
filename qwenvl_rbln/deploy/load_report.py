"""A ``qvl load-check --json`` report handed to ``qvl deploy --load-check``: the measured load, used only when the
report proves it is one.

A load sizes every replica's startup probe, so a wrong one restarts replicas in a loop (too short) or hides a hung
one for hours (absurdly long). The report is used only when it is a load-check report of a real NPU (not the
emulator), its runtime was created (``ok`` true, ``create_runtimes`` true), its seconds are a load time (finite,
above 0, at most a day: ``load_times.load_seconds``), and it measured THIS artifact's graphs: its ``graph_hash``
(``manifest.graph_hash``, which load-check writes beside a measured load) equals DIR's, so a copy of the artifact on
another machine matches and another artifact, or a recompile, never does. A report without a graph hash (an older
qvl's) matches only through its ``artifact_dir`` naming DIR itself. Anything else is one line naming the file, the
cause and the fix, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts.load_times import MAX_LOAD_S, load_seconds
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.units import fmt_json

FIX = "run `qvl load-check DIR --json > load-check.json` on the NPU host (without --no-runtime) and pass that file"


def _refuse(path: Path, why: str, fix: str = FIX) -> InputError:
    return InputError(f"--load-check {path}: {why}", fix)


def _printable(text: str, limit: int = 200) -> str:
    """Text from the report as one printable line (a newline or an escape sequence in it never reaches the
    terminal), cut to ``limit`` characters."""
    line = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _parse(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:  # a folder, no permission, not UTF-8 text
        raise _refuse(path, f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: arrays nested deeper than the parser goes
        raise _refuse(path, f"not a JSON report ({str(exc).splitlines()[0][:120] or type(exc).__name__})") from None


def _same_dir(named: Any, artifact: Path) -> bool:
    if not isinstance(named, str) or not named or "\x00" in named:
        return False
    try:
        return Path(named).resolve() == artifact.resolve()
    except (OSError, RuntimeError, ValueError):
        return False


def _check_identity(
    path: Path, report: dict[str, Any], runtime: dict[str, Any], artifact: Path, ours: str | None = None
) -> None:
    """The report measured ``artifact``'s graphs (``ours``: their hash, when the caller has it), else an InputError
    saying whose it is."""
    from qwenvl_rbln.artifacts.manifest import graph_hash, read_manifest

    theirs = runtime.get("graph_hash")
    named = report.get("artifact_dir")
    where = f"artifact {_printable(named)}" if isinstance(named, str) and named.strip() else "an unnamed artifact"
    if theirs is None:
        if _same_dir(named, artifact):
            return
        raise _refuse(
            path,
            f"the report is of {where} and carries no graph hash (an older qvl wrote it), so it cannot be matched "
            f"with {artifact}",
        )
    ours = ours or graph_hash(artifact, read_manifest(artifact))
    if theirs != ours:
        raise _refuse(
            path,
            f"the report measured other graphs ({where}, graph hash {fmt_json(theirs, 20)}), not {artifact}'s "
            f"({ours[:16]}...): a load of other graphs says nothing about these",
        )


def read_load_check(path: Path, artifact: Path, *, graph_hash: str | None = None) -> float:
    """The measured load (seconds) of ``artifact`` from a ``qvl load-check --json`` report; InputError otherwise.
    ``graph_hash``: the artifact's, when the caller computed it."""
    from qwenvl_rbln.paths import user_path

    path = user_path(path, "--load-check")
    report = _parse(path)
    if not isinstance(report, dict) or not isinstance(report.get("runtime"), dict):
        kind = "a JSON object" if isinstance(report, dict) else f"JSON {fmt_json(report, 30)}"
        raise _refuse(path, f"{kind} without a 'runtime' section (not a `qvl load-check --json` report)")
    runtime = report["runtime"]
    if report.get("emulated") is not False:
        if report.get("emulated") is True:
            why = "the load ran on the emulator, not an NPU (no load time to use)"
        elif "emulated" not in report:
            why = "no 'emulated' field (a `qvl load-check --json` report says whether its load ran on an NPU)"
        else:
            why = f"'emulated' is {fmt_json(report['emulated'])}, not false (not a report of a real NPU load)"
        raise _refuse(path, why)
    if runtime.get("ok") is not True or runtime.get("create_runtimes") is not True:
        why = runtime.get("error") or runtime.get("reason")
        why = (_printable(why) if isinstance(why, str) else fmt_json(why)) if why else ""
        raise _refuse(path, f"the report has no measured load ({why or 'no runtime was created'})")
    seconds = load_seconds(runtime.get("seconds"))
    if seconds is None:
        raise _refuse(
            path,
            f"runtime.seconds={fmt_json(runtime.get('seconds'))} is not a load time (a number of seconds above 0 "
            f"and at most {MAX_LOAD_S})",
        )
    _check_identity(path, report, runtime, artifact, graph_hash)
    return seconds
