"""The output-directory lock: one writer per directory, and a second one told which process holds it.

Separate from the staging directory because the lock outlives it: the lock files live under ``$QVL_HOME/locks``;
`qvl cache prune` deletes the ones no process holds (``artifacts.flock`` makes that safe).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts import flock
from qwenvl_rbln.artifacts.manifest import now, write_json_atomic
from qwenvl_rbln.errors import BusyError, InputError
from qwenvl_rbln.paths import user_path

# How long a second writer waits for the holder's owner record (the holder writes it right after taking the lock).
OWNER_RECORD_WAIT_S = 10.0


def lock_path(target: Path) -> Path:
    """The lock for ``target`` lives under ``$QVL_HOME/locks``, never beside the user's output directory.

    One small file per output directory compiled into; ``remove_stale_locks`` deletes those nobody holds.
    """
    from qwenvl_rbln.planning.catalogue.modelinfo import qvl_home

    target = user_path(target).absolute()
    digest = hashlib.sha256(str(target).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", target.name)[:48] or "root"
    return qvl_home() / "locks" / f"{name}-{digest}.lock"


def _owner_path(target: Path) -> Path:
    lp = lock_path(target)
    return lp.with_name(lp.name + ".owner")


def lock_owner(target: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(_owner_path(target).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _live_owner(target: Path) -> dict[str, Any] | None:
    """The owner record, if it names a live process (a killed holder's stale record is not the holder)."""
    owner = lock_owner(target)
    if not owner or not isinstance(owner.get("pid"), int):
        return None
    if owner.get("host") not in (None, socket.gethostname()):
        return owner
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return None
    except OSError:
        pass  # alive, owned by another user
    return owner


_COMPILE = ("output directory", "wait for that compile to finish, or compile into another directory with -o")


def _busy(target: Path, lp: Path, owner: dict[str, Any] | None, what: tuple[str, str] = _COMPILE) -> BusyError:
    owner = owner or {}
    who = f"pid {owner['pid']}" if owner.get("pid") else "another process"
    if owner.get("host") and owner.get("host") != socket.gethostname():
        who += f" on {owner['host']}"
    since = f" since {owner['started']}" if owner.get("started") else ""
    return BusyError(f"{what[0]} {target} is being written by {who}{since} (lock {lp})", what[1])


def _acquire(target: Path, lp: Path, what: tuple[str, str] = _COMPILE) -> int:
    """Take the lock (an fd), or raise BusyError naming the holder.

    The holder writes its owner record just after it takes the lock, so a loser that arrives in between
    waits for that record (or for the lock to come free) instead of reporting "another process".
    """
    import time

    deadline = time.monotonic() + OWNER_RECORD_WAIT_S
    while True:
        try:
            return flock.take(lp)
        except flock.LockBusy:
            owner = _live_owner(target)
            if owner is not None or time.monotonic() >= deadline:
                raise _busy(target, lp, owner, what) from None
        time.sleep(0.02)


@contextlib.contextmanager
def output_lock(target: Path, what: tuple[str, str] = _COMPILE) -> Iterator[Path]:
    """Non-blocking exclusive lock for ``target``; a second writer gets BusyError naming the holder.

    ``what``: (what ``target`` is, the fix) for that refusal; a compile's output directory by default (a batch
    job's results file passes its own: ``batch/results.py``)."""
    target = user_path(target).absolute()
    lp = lock_path(target)
    try:
        lp.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"cannot create the lock directory {lp.parent}: {exc.strerror or exc}",
            "set QVL_HOME to a writable directory",
        ) from None
    fd = _acquire(target, lp, what)
    owner_file = _owner_path(target)
    try:
        write_json_atomic(
            owner_file,
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": now(),
                "target": str(target),
                "argv": sys.argv[1:],
            },
        )
        yield lp
    finally:
        with contextlib.suppress(FileNotFoundError):
            owner_file.unlink()
        flock.release(fd)


def remove_stale_locks(*, dry_run: bool = False) -> list[str]:
    """Delete the lock files under ``$QVL_HOME/locks`` that no process holds (finished compiles), and owner
    records whose lock is gone; safe beside running compiles (``flock.remove_if_free``). Returns the names.
    ``dry_run``: the names it would delete, nothing deleted (``flock.is_free``)."""
    from qwenvl_rbln.planning.catalogue.modelinfo import qvl_home

    root = qvl_home() / "locks"
    paths = sorted(root.glob("*.lock")) if root.is_dir() else []
    if dry_run:
        return [path.name for path in paths if flock.is_free(path)]
    removed = []
    for path in paths:
        if flock.remove_if_free(path):
            removed.append(path.name)
    for owner in sorted(root.glob("*.lock.owner")) if root.is_dir() else []:
        if not owner.with_name(owner.name.removesuffix(".owner")).exists():
            with contextlib.suppress(OSError):
                owner.unlink()
    return removed
