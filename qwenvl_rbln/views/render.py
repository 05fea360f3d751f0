"""One renderer for every command: rich for people, JSON for scripts.

Machine-readable output goes to stdout; warnings and progress go to stderr, so
``qvl ... --json | jq`` always sees exactly one JSON document.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qwenvl_rbln.errors import CONTROL_PICTURES
from qwenvl_rbln.units import fmt_bytes  # noqa: F401  (re-exported: views format bytes through render)

if TYPE_CHECKING:  # rich is imported where a console or a styled text is made: `--json` output never needs it
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
        from rich.console import Console

        _stdout = Console(highlight=False, soft_wrap=False)
        _stdout.on_broken_pipe = _broken_pipe  # type: ignore[method-assign]
        if not _stdout.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
            _stdout.width = PIPE_WIDTH
    return _stdout


def _broken_pipe() -> None:
    """rich's own handler exits 1 (qvl's "internal error"): hand the closed pipe to the CLI edge instead, which
    ends quietly (``cli.main``: exit 141, as a tool that SIGPIPE ends)."""
    import errno

    raise BrokenPipeError(errno.EPIPE, "stdout was closed by its reader")


def err() -> Console:
    """Console for diagnostics (stderr), also used in --json mode."""
    global _stderr
    if _stderr is None:
        from rich.console import Console

        _stderr = Console(stderr=True, highlight=False, soft_wrap=True)
    return _stderr


def reset_consoles() -> None:
    """Forget cached consoles (tests swap sys.stdout/sys.stderr between runs)."""
    global _stdout, _stderr
    _stdout = None
    _stderr = None


_FIELD = "\ue000"  # a private-use character: never typed by anyone, and never the start of a markup tag


def markup(template: str, *values: Any) -> Text:
    """Rich markup ``template`` whose ``{}`` fields are filled with ``values`` as literal text.

    The one way user text (ids, prompts, file names, model output, messages that quote them) enters a styled
    line: a value is never read as markup, whatever brackets it holds (``/x``, ``[bold]``), and takes the
    style around its field: ``markup("[bold]\\[{}][/bold] {}", rid, text)``. Brackets in the template around
    a field stay literal.
    """
    from rich.text import Text

    parts = template.split("{}")
    if len(parts) - 1 != len(values):
        raise ValueError(f"markup template has {len(parts) - 1} fields for {len(values)} values: {template!r}")
    marked = Text.from_markup(_FIELD.join(parts))
    plain = marked.plain
    out = Text(style=marked.style, justify=marked.justify, no_wrap=marked.no_wrap, end=marked.end)
    start = 0
    for value in values:
        pos = plain.index(_FIELD, start)
        out.append_text(marked[start:pos])
        literal = Text(str(value))
        for span in marked[pos : pos + 1].spans:
            literal.stylize(span.style, 0, len(literal))
        out.append_text(literal)
        start = pos + 1
    out.append_text(marked[start:])
    return out


_CONTROL = CONTROL_PICTURES | {c: "\u2424" for c in (0x85, 0x2028, 0x2029)}  # other line breaks: the newline picture


def one_line(value: Any) -> str:
    """``value`` as text that stays on one table row: a newline, tab or other control character in an id or a
    file name shows as its Unicode control picture (a newline as ``\u2424``, one character for one), never as a
    line break or a terminal escape. ``--json`` keeps the exact text."""
    return str(value).translate(_CONTROL)


def _one_line_cell(cell: Any) -> Any:
    from rich.text import Text

    if isinstance(cell, Text):
        plain = cell.plain.translate(_CONTROL)
        if plain != cell.plain:  # same length, one character for one: the styles stay where they were
            cell = cell.copy()
            cell.plain = plain
        return cell
    return one_line(cell) if isinstance(cell, str) else cell


def warn(message: str) -> None:
    """A one-line warning on stderr, never mixed into JSON output; the message is printed literally."""
    err().print(markup("[yellow]warning:[/yellow] {}", message), highlight=False)


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


def _exact_bytes(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")  # how Python decoded a non-UTF-8 file name
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _lossless(obj: Any) -> Any:
    """Strings that are not valid UTF-8 (a file name's undecodable bytes, kept by Python as surrogate escapes)
    become their display form (U+FFFD for each such byte), with the exact bytes beside them, base64, under
    ``<key>_bytes_b64`` (for a list of names: a list, null where a name is valid UTF-8)."""
    import base64

    def bad(v: Any) -> bool:
        return isinstance(v, str) and any("\ud800" <= ch <= "\udfff" for ch in v)

    def b64(v: str) -> str:
        return base64.b64encode(_exact_bytes(v)).decode("ascii")

    if isinstance(obj, str):
        return _exact_bytes(obj).decode("utf-8", "replace") if bad(obj) else obj
    if isinstance(obj, list):
        return [_lossless(x) for x in obj]
    if not isinstance(obj, dict):
        return obj
    out: dict[str, Any] = {}
    for key, value in obj.items():
        out[key] = _lossless(value)
        if bad(value):
            out[f"{key}_bytes_b64"] = b64(value)
        elif isinstance(value, list) and any(bad(v) for v in value):
            out[f"{key}_bytes_b64"] = [b64(v) if bad(v) else None for v in value]
    return out


def dumps(data: Any) -> str:
    """One JSON document, always valid UTF-8: non-UTF-8 names get a display form and their exact bytes."""
    import json  # here: help and human output never need it

    text = json.dumps(data, indent=2, default=_default, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # rare: only then walk the document
        plain = json.loads(json.dumps(data, default=_default))  # plain types; surrogates survive the round trip
        text = json.dumps(_lossless(plain), indent=2, ensure_ascii=False)
    return text


_emitted = False  # a JSON document is on stdout already (the CLI edge then writes no second one)


def reset_emitted() -> None:
    global _emitted
    _emitted = False


def emit(data: Any, *, as_json: bool, human: Callable[[Console, Any], None], error: Any = None) -> None:
    """Print a command's result either as JSON (stdout) or through its human renderer.

    ``error``: the ``QvlError`` the command raises right after reporting (a dry run that does not fit, a failed
    load-check, diverging runs); with --json it goes into the same document under ``error``, in the shape
    ``emit_error`` writes, so stdout stays one JSON document that says the command failed.
    """
    global _emitted
    if as_json:
        if error is not None and isinstance(data, dict):
            data = {**data, "error": error.json_error()}
        sys.stdout.write(dumps(data) + "\n")
        sys.stdout.flush()
        _emitted = True
    else:
        human(out(), data)


def emit_error(message: str, hint: str | None, exit_code: int, *, problems: list[dict] | None = None) -> None:
    """With --json, a failure before the command reported anything: ``{"error": {message, hint, exit_code}}``."""
    if _emitted:
        return
    body: dict[str, Any] = {"message": message, "hint": hint, "exit_code": exit_code}
    if problems:
        body["problems"] = problems
    try:
        sys.stdout.write(dumps({"error": body}) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):  # stdout closed (a pipe whose reader left): stderr has the line
        pass


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


def _cell_width(cell: str | Text) -> int:
    from rich.text import Text

    text = cell if isinstance(cell, Text) else Text.from_markup(cell)
    return max((line.cell_len for line in text.split("\n")), default=0)


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
    rows: Sequence[Sequence[str | Text]],
    *,
    title: str | None = None,
    header_style: str = "bold",
) -> list[str]:
    """Print ``rows`` so that no number is cut: drop columns a narrow console has no room for.

    Returns the headers left out (the caller may say so). When even the kept columns do not fit,
    the table is printed at its own width and the terminal wraps it: wrapped, never truncated.
    """
    from rich.table import Table

    rows = [[_one_line_cell(cell) for cell in r] for r in rows]  # a newline in a name never splits a row
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


def plural(n: int, noun: str) -> str:
    """``1 request``, ``2 requests``, ``1,200 lines``: a count with its noun in the right number."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def print_left_out(console: Any, dropped: list[str]) -> None:
    """Name the columns a narrow console left out (``print_table`` returns them), so a missing one is not mistaken
    for missing data."""
    if dropped:
        console.print(
            markup("[dim]left out at {} columns: {} (a wider terminal or --json shows them)[/dim]", console.width,
                   ", ".join(dropped))
        )  # fmt: skip
