"""One renderer for every command: rich for people, JSON for scripts.

Machine-readable output goes to stdout; warnings and progress go to stderr, so
``qvl ... --json | jq`` always sees exactly one JSON document.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console

_stdout: Console | None = None
_stderr: Console | None = None


def out() -> Console:
    """Console for the human result (stdout)."""
    global _stdout
    if _stdout is None:
        _stdout = Console(highlight=False, soft_wrap=False)
    return _stdout


def err() -> Console:
    """Console for diagnostics (stderr), also used in --json mode."""
    global _stderr
    if _stderr is None:
        _stderr = Console(stderr=True, highlight=False, soft_wrap=True)
    return _stderr


def reset_consoles() -> None:
    """Forget cached consoles (tests swap sys.stdout/sys.stderr between runs)."""
    global _stdout, _stderr
    _stdout = None
    _stderr = None


def warn(message: str) -> None:
    """A one-line warning on stderr, never mixed into JSON output."""
    err().print(f"[yellow]warning:[/yellow] {message}", markup=True, highlight=False)


def info(message: str) -> None:
    err().print(message, markup=False, highlight=False)


def _default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "__fspath__"):
        return str(obj)
    if isinstance(obj, set | frozenset | tuple):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, default=_default, ensure_ascii=False)


def emit(data: Any, *, as_json: bool, human: Callable[[Console, Any], None]) -> None:
    """Print a command's result either as JSON (stdout) or through its human renderer."""
    if as_json:
        sys.stdout.write(dumps(data) + "\n")
        sys.stdout.flush()
    else:
        human(out(), data)


def fmt_bytes(n: float | int | None) -> str:
    """Binary units, as rbln-smi prints them (GiB)."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.2f} TiB"
