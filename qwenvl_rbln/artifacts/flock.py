"""File locks that can be removed safely: flock(2) on a lock file, checked to still be that path's file.

Its own module because removing a lock file is only safe when every taker checks, once it holds the lock, that
the file it locked is still the one at the path: otherwise a process that opened the old file and one that
created a new file would both hold "the" lock. With that check, a lock file nobody holds can be deleted (the
stale lock files of finished processes), and shared locks let readers (a compile that reuses a cache entry)
keep a writer (a prune) out.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


class LockBusy(Exception):
    """The lock is held by another process (non-blocking take)."""


def take(path: Path, *, shared: bool = False, blocking: bool = False) -> int:
    """An fd holding ``path``'s lock (exclusive unless ``shared``); LockBusy when not ``blocking`` and held."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            os.close(fd)
            raise LockBusy(str(path)) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # removed (or replaced) between our open and our lock: take the file that is there now


def release(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


@contextlib.contextmanager
def held(path: Path, *, shared: bool = False, blocking: bool = False) -> Iterator[int]:
    fd = take(path, shared=shared, blocking=blocking)
    try:
        yield fd
    finally:
        release(fd)


def remove_if_free(path: Path) -> bool:
    """Delete the lock file ``path`` when nobody holds it (True); a held one is left alone (False)."""
    try:
        fd = take(path)
    except (LockBusy, OSError):
        return False
    try:
        os.unlink(path)  # while holding it: a taker that opened this file sees it is gone and retries
        return True
    except OSError:
        return False
    finally:
        release(fd)


def is_free(path: Path) -> bool:
    """Whether nobody holds ``path``'s lock now, tried without creating, locking for long or deleting anything
    (a dry run's question; a file gone meanwhile is not free)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by a running compile (or prune)
        return False
    finally:
        os.close(fd)  # closing releases the lock
    return True
