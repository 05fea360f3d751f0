"""One renderer for every command: rich for people, JSON for scripts.

Machine-readable output goes to stdout; warnings and progress go to stderr, so
``qvl ... --json | jq`` always sees exactly one JSON document.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.text import Text

_stdout: Console | None = None
_stderr: Console | None = None


PIPE_WIDTH = 240  # stdout is a file or a pipe: nobody's terminal to fit, so tables keep their natural width


def out() -> Console:
    """Console for the human result (stdout).

    Piped or redirected (``| less``, ``> report.txt``), rich would still size tables for the terminal
    it finds on stdin/stderr, or 80 columns, and cut cells; a file has no width, so it gets a wide one.
    ``COLUMNS`` still wins when set.
    """
    global _stdout
    if _stdout is None:
        _stdout = Console(highlight=False, soft_wrap=False)
        if not _stdout.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
            _stdout.width = PIPE_WIDTH
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


# --- tables that fit -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Col:
    """A table column: numbers never wrap or get cut; ``fold`` text (names, lists) may wrap.

    ``drop`` > 0 lets a narrow console leave the column out, lowest number first, rather than cut
    what is shown; 0 is always shown.
    """

    header: str
    justify: str = "right"
    drop: int = 0
    fold: bool = False
    fold_min: int = 12  # narrowest a fold column is squeezed to before columns are dropped
    max_width: int | None = None  # fold text wraps at this width even on a wide console


def _cell_width(cell: str) -> int:
    return max((Text.from_markup(line).cell_len for line in cell.split("\n")), default=0)


def _table_width(cols: Sequence[Col], widths: Sequence[int]) -> int:
    """Rich's default box: one space of padding each side of a cell, a border between and around columns."""
    return sum(w + 2 for w in widths) + len(cols) + 1


def _min_width(col: Col, natural: int) -> int:
    """Narrowest a column may get: numbers whole; fold text down to ``fold_min`` but never below a header word."""
    if not col.fold:
        return natural
    return max(min(natural, col.fold_min), *(len(word) for word in col.header.split()))


def _fit(cols: Sequence[Col], natural: Sequence[int], width: int) -> list[int]:
    """Indexes of the columns kept: the droppable ones go, in ``drop`` order, until the rest fit."""
    keep = list(range(len(cols)))
    order = sorted((c.drop, i) for i, c in enumerate(cols) if c.drop > 0)

    def need(idx: list[int]) -> int:
        return _table_width([cols[i] for i in idx], [_min_width(cols[i], natural[i]) for i in idx])

    for _, i in order:
        if need(keep) <= width:
            break
        keep.remove(i)
    return keep


def print_table(
    console: Console,
    cols: Sequence[Col],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    header_style: str = "bold",
) -> list[str]:
    """Print ``rows`` so that no number is cut: drop columns a narrow console has no room for.

    Returns the headers left out (the caller may say so). When even the kept columns do not fit,
    the table is printed at its own width and the terminal wraps it: wrapped, never truncated.
    """
    from rich.table import Table

    natural = [max([_cell_width(c.header), *(_cell_width(r[i]) for r in rows)]) for i, c in enumerate(cols)]
    natural = [min(n, c.max_width) if c.fold and c.max_width else n for n, c in zip(natural, cols, strict=True)]
    keep = _fit(cols, natural, console.width)
    t = Table(title=title, title_justify="left", header_style=header_style)
    for i in keep:
        c = cols[i]
        if c.fold:
            t.add_column(c.header, justify=c.justify, overflow="fold", max_width=c.max_width)
        else:
            t.add_column(c.header, justify=c.justify, no_wrap=True, min_width=natural[i])
    for r in rows:
        t.add_row(*(r[i] for i in keep))
    needed = _table_width([cols[i] for i in keep], [_min_width(cols[i], natural[i]) for i in keep])
    if needed <= console.width:
        console.print(t)
    else:  # rich would shrink every column to fit, cutting numbers: let the terminal wrap the lines instead
        width = console.width
        console.width = needed
        try:
            console.print(t, crop=False)
        finally:
            console.width = width
    return [cols[i].header for i in range(len(cols)) if i not in keep]
