"""One exception family for qvl: every failure carries a hint and an exit code.

The CLI edge catches ``QvlError`` and prints exactly one line, so no command ever
shows a traceback for a problem the user can fix.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

# Exit codes (documented in docs/reference.md, "Exit codes").
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_MISSING_DEPENDENCY = 3
EXIT_DOES_NOT_FIT = 4
EXIT_BACKEND = 5
EXIT_BUSY = 6
EXIT_DIVERGED = 7  # qvl compare: the two runs differ
EXIT_ACCURACY = 8  # qvl eval --min-accuracy: accuracy below the threshold
EXIT_ACCURACY_DROP = 9  # qvl eval --max-drop: a significant drop larger than the allowance
EXIT_INTERRUPTED = 130


# C0 controls and DEL as their Unicode control pictures, C1 controls (0x9B is a terminal's CSI) as U+FFFD: text
# from an input file (an id, a key) quoted in a message shows them, and never moves the cursor or recolours the
# terminal. One character for one, so ``views/render.py`` uses the same table for table cells.
CONTROL_PICTURES = (
    {c: chr(0x2400 + c) for c in range(0x20)} | {0x7F: "\u2421"} | dict.fromkeys(range(0x80, 0xA0), "\ufffd")
)


MAX_MESSAGE = 2000  # characters of a message or hint: a quoted value from a hostile file never floods a terminal


def clip(text: str) -> str:
    """``text`` with its middle left out when it is longer than ``MAX_MESSAGE`` (a value quoted from an input file:
    a million-element list made a 3 MB error line), its start and end kept, and how much was cut said."""
    if len(text) <= MAX_MESSAGE:
        return text
    cut = len(text) - MAX_MESSAGE
    return f"{text[: MAX_MESSAGE - 300]} ... ({cut} characters left out) ... {text[-300:]}"


class QvlError(Exception):
    """Base class: a message that names the file/key/value, and a hint that says the fix."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, hint: str | None = None, *, exit_code: int | None = None):
        message, hint = clip(message), clip(hint) if hint is not None else None
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def one_line(self) -> str:
        text = self.message.rstrip(". ")
        if self.hint:
            text += f"; fix: {self.hint}"
        return " ".join(text.split()).translate(CONTROL_PICTURES)  # one line, always; no terminal escapes

    def to_dict(self) -> dict:
        return {"error": self.message, "hint": self.hint, "exit_code": self.exit_code, "kind": type(self).__name__}

    def json_error(self) -> dict:
        """The ``error`` object every command writes with ``--json`` on failure (the one shape scripts read)."""
        out = {"message": self.message, "hint": self.hint, "exit_code": self.exit_code}
        if self.problems_dicts():
            out["problems"] = self.problems_dicts()
        return out

    def detail_lines(self) -> list[str]:
        """Lines printed under the one error line (a group of problems lists each; a single error has none)."""
        return []

    def problems_dicts(self) -> list[dict]:
        return []


class InputError(QvlError):
    """Bad input: a preset, a flag, a file, a request."""

    exit_code = EXIT_BAD_INPUT


class InputErrors(InputError):
    """Several independent problems in one input (a batch file's bad lines), reported together.

    The first line says how many and where; each problem follows on its own line (``file:line: ...; fix: ...``),
    so one run shows every line to fix, not only the first.
    """

    SHOWN = 20  # lines printed; --json has every problem kept

    def __init__(self, problems: list[QvlError], what: str, hint: str | None = None, *, total: int | None = None):
        """``total``: how many problems there are when only the first ``problems`` were kept (a file with
        100,000 bad lines keeps 1,000); the message then says how many are listed."""
        self.problems = list(problems)
        self.total = max(total or 0, len(self.problems))
        listed = "each" if self.total == len(self.problems) else f"the first {len(self.problems)}"
        super().__init__(f"{self.total} {what} ({listed} listed below)", hint)

    def detail_lines(self) -> list[str]:
        lines = [p.one_line() for p in self.problems[: self.SHOWN]]
        if len(self.problems) > self.SHOWN:
            which = "every one" if self.total == len(self.problems) else f"the first {len(self.problems)}"
            lines.append(f"... {len(self.problems) - self.SHOWN} more (--json lists {which})")
        return lines

    def problems_dicts(self) -> list[dict]:
        return [{"message": p.message, "hint": p.hint} for p in self.problems]


def raise_all(problems: list[QvlError], what: str, hint: str | None = None, *, total: int | None = None) -> None:
    """Nothing when there are no problems; the one problem as it is; several as one ``InputErrors``. ``total``: how
    many there are when only the first ``problems`` were kept (``InputErrors``)."""
    count = len(problems) if total is None else total
    if count == 1:
        raise problems[0]
    if count:
        raise InputErrors(problems, what, hint, total=total)


class DependencyMissing(QvlError):
    """An optional heavy dependency (optimum-rbln, rebel-compiler, torch) is not installed."""

    exit_code = EXIT_MISSING_DEPENDENCY


class DoesNotFit(QvlError):
    """The memory planner (or the device) says the configuration does not fit."""

    exit_code = EXIT_DOES_NOT_FIT


class BackendError(QvlError):
    """The backend (optimum-rbln, rebel, transformers) failed while doing real work."""

    exit_code = EXIT_BACKEND


class BusyError(QvlError):
    """Another qvl process holds the lock on the same output directory."""

    exit_code = EXIT_BUSY


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler, ``kill``, a container stop) ends long work the way Ctrl-C does, so the same cleanup runs
    (a compile's temporary directory, a batch job's workers) and the exit is EXIT_INTERRUPTED. Main thread only:
    Python installs signal handlers nowhere else."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
