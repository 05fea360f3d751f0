"""One exception family for qvl: every failure carries a hint and an exit code.

The CLI edge catches ``QvlError`` and prints exactly one line, so no command ever
shows a traceback for a problem the user can fix.
"""

from __future__ import annotations

# Exit codes (documented in README.md).
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_MISSING_DEPENDENCY = 3
EXIT_DOES_NOT_FIT = 4
EXIT_BACKEND = 5
EXIT_BUSY = 6
EXIT_DIVERGED = 7  # qvl compare: the two runs differ
EXIT_INTERRUPTED = 130


class QvlError(Exception):
    """Base class: a message that names the file/key/value, and a hint that says the fix."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, hint: str | None = None, *, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def one_line(self) -> str:
        text = self.message.rstrip(". ")
        if self.hint:
            text += f"; fix: {self.hint}"
        return " ".join(text.split())  # one line, always

    def to_dict(self) -> dict:
        return {"error": self.message, "hint": self.hint, "exit_code": self.exit_code, "kind": type(self).__name__}


class InputError(QvlError):
    """Bad input: a preset, a flag, a file, a request."""

    exit_code = EXIT_BAD_INPUT


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
