"""User-given paths: ``~`` expanded in one place, so an unknown ``~user`` is an input error, not a traceback."""

from __future__ import annotations

import os
from pathlib import Path

from qwenvl_rbln.errors import InputError


def user_path(value: str | os.PathLike[str], what: str = "path") -> Path:
    """``Path(value).expanduser()``, but a ``~name`` with no such user (or no home) says so in one line."""
    path = Path(value)
    try:
        return path.expanduser()
    except RuntimeError:  # pathlib: "Could not determine home directory."
        head = path.parts[0] if path.parts else str(value)
        raise InputError(
            f"{what} {str(value)!r}: {head!r} names no user with a home directory here",
            "write the path as an absolute path, or start it with ~/ for your own home",
        ) from None
