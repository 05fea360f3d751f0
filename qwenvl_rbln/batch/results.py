"""The results file of a batch job: JSON lines appended as requests finish, so a crash loses nothing done.

Each record is one line written with ONE ``write`` call on an unbuffered file (``O_APPEND``), so a kill (Ctrl-C,
``kill -9``, a power cut) leaves at most one torn last line, never a torn line in the middle. Lines reach the OS at
once (a crash of qvl loses nothing written) and the disk at least every ``FSYNC_EVERY_S`` seconds and on close
(a power cut loses at most those seconds, which ``--resume`` redoes).

``completed_ids`` reads an existing file for ``--resume``: it cuts a torn last line off the file (it is redone,
never counted) and returns the ids present, kept as 8-byte hashes so a million finished requests cost 8 MB.

One writer per results file: ``results_lock`` (held by the whole job, before ``--resume`` reads the file) makes a
second job on the same file on this host fail at once, naming the first; the writer's ``flock`` on the file
itself catches one started with another ``$QVL_HOME``. A file opens only when its first line is written, so a
job that fails before any request finished leaves no file behind. A failed write (a full disk, a read-only
folder) is a ``QvlError`` naming the file, never a crash: every line already written is complete.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qwenvl_rbln.batch.hashes import HashBuckets
from qwenvl_rbln.batch.records import is_complete
from qwenvl_rbln.batch.source import id_hash
from qwenvl_rbln.errors import BackendError, BusyError, InputError, QvlError

FSYNC_EVERY_S = 2.0


class CompletedIds:
    """The ids already in a results file: 8-byte hashes (``HashBuckets``), plus the exact ids behind ``shared``
    hashes (two ids of the batch file that hash alike: ``source.check_unique_ids``), so membership is exact for them."""

    def __init__(
        self, done: HashBuckets, exact: set[str], shared: frozenset[int], duplicates: dict[str, list[int]] | None = None
    ):
        self._hashes = done.freeze()
        self._exact = exact
        self._shared = shared
        self.duplicates = duplicates or {}  # an id on more than one line of the file: its lines
        self.torn = 0  # bytes of a torn last line cut off the file
        self.newline_added = False  # the last line was a whole result without its newline: the newline was added

    @classmethod
    def empty(cls) -> CompletedIds:
        return cls(HashBuckets(), set(), frozenset())

    def __len__(self) -> int:
        """Distinct ids (an id on two lines counts once)."""
        return len(self._hashes) - sum(len(at) - 1 for at in self.duplicates.values())

    def __contains__(self, rid: object) -> bool:
        if not isinstance(rid, str):
            return False
        h = id_hash(rid)
        if h in self._shared:
            return rid in self._exact
        return h in self._hashes


_OURS = b'{"id":'  # how every line ResultsWriter writes begins (the record's first key, compact JSON)
BUSY_FIX = "wait for that job to finish (or stop it), or pass another --output"


@contextlib.contextmanager
def results_lock(path: str | Path) -> Iterator[Path]:
    """The job's lock on its results file (``artifacts/locks.py``, under ``$QVL_HOME/locks``, as compile's): held
    from before ``--resume`` reads the file until the last line is written. The file need not exist."""
    from qwenvl_rbln.artifacts.locks import lock_path, output_lock

    path = Path(path)
    try:
        path = path.resolve()  # a symlink and its target are one file
    except (OSError, RuntimeError):
        path = path.absolute()
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(output_lock(path, ("results file", BUSY_FIX)))
        except OSError as exc:  # the lock folder exists but cannot be written
            raise InputError(
                f"cannot take the lock for {path}: {lock_path(path)}: {exc.strerror}",
                "set QVL_HOME to a writable directory",
            ) from None
        yield path


def _not_ours(path: Path, lineno: int) -> InputError:
    return InputError(
        f"{path}:{lineno}: not a qvl result line; --resume appends only to a results file qvl wrote, and left "
        "the file as it was",
        "pass the --output of the run to resume, or a new --output path",
    )


def _parsed(raw: bytes) -> tuple[bool, Any]:
    """(whether the line is JSON, its value); any bytes (a line too deep or not UTF-8 is not JSON here)."""
    try:
        return True, json.loads(raw)
    except (ValueError, RecursionError):
        return False, None


def _complete(raw: bytes) -> dict[str, Any] | None:
    record = _parsed(raw)[1]
    return record if is_complete(record) else None


def _torn(raw: bytes) -> bool:
    """A last line (no newline) that is a prefix of a line qvl writes, cut by a kill: never valid JSON (a record
    is an object, and no proper prefix of an object parses). A complete JSON line is never torn: it is a whole
    result that lacks only its newline, or a line qvl did not write."""
    return (raw.startswith(_OURS) or _OURS.startswith(raw)) and not _parsed(raw)[0]


def completed_ids(path: str | Path, shared: frozenset[int] = frozenset()) -> CompletedIds:
    """The ids finished in ``path`` (ok or failed for good), for ``--resume``.

    Every complete line is checked first: a line that is not a result (a file edited by hand, the wrong path) is
    refused naming it, and the file is left as it was. Then a torn last line (a prefix of a result: a kill
    mid-write) is cut off the file, so its request is redone and never counted (``CompletedIds.torn``: the bytes
    cut); a whole result missing only its newline is counted, and the newline added. An id found on two lines
    (two jobs on one file before it was locked, files joined by hand) is in ``CompletedIds.duplicates``."""
    path = Path(path)
    done = HashBuckets()
    exact: set[str] = set()
    keep = torn = 0
    newline = False
    if not path.exists():
        return CompletedIds(done, exact, shared)
    try:
        with path.open("rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if not raw.endswith(b"\n"):  # the last line: torn, a result without its newline, or not ours
                    record = _complete(raw) if raw.startswith(_OURS) else None
                    if record is not None:
                        newline = True
                        keep += len(raw)
                        _add(done, exact, shared, record["id"])
                    elif _torn(raw):
                        torn = len(raw)
                    else:
                        raise _not_ours(path, lineno)
                    break
                keep += len(raw)
                if not raw.strip():
                    continue
                record = _complete(raw)
                if record is None:
                    raise _not_ours(path, lineno)
                _add(done, exact, shared, record["id"])
        duplicates = _duplicates(path, set(done.freeze().repeated()))
        if torn or newline:
            _mend(path, keep, newline)
    except OSError as exc:
        raise InputError(f"--output {path}: cannot be read ({exc.strerror})", "check the file's permissions") from None
    ids = CompletedIds(done, exact, shared, duplicates)
    ids.torn, ids.newline_added = torn, newline
    return ids


def _add(done: HashBuckets, exact: set[str], shared: frozenset[int], rid: str) -> None:
    h = id_hash(rid)
    done.add(h)
    if h in shared:
        exact.add(rid)


def _duplicates(path: Path, repeated: set[int]) -> dict[str, list[int]]:
    """The ids behind hashes seen twice (a second read, only then), each with its lines, when on two or more."""
    if not repeated:
        return {}
    lines: dict[str, list[int]] = {}
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            record = _complete(raw) if raw.strip() else None
            if record is not None and id_hash(record["id"]) in repeated:
                lines.setdefault(record["id"], []).append(lineno)
    return {rid: at for rid, at in lines.items() if len(at) > 1}


def _mend(path: Path, keep: int, newline: bool) -> None:
    """Cut a torn last line (``keep``: the bytes of the whole lines before it), or end a whole last line with its
    newline, holding the file's own lock (a job of another ``$QVL_HOME`` may be writing it: then refused)."""
    with path.open("rb+") as fh:
        _lock_file(fh.fileno(), path)
        if newline:
            fh.seek(0, os.SEEK_END)
            fh.write(b"\n")
        else:
            fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())


def _lock_file(fd: int, path: Path) -> None:
    """The results file's own lock (flock), held by the fd; BusyError when another process holds it. A
    filesystem without flock is let through: ``results_lock`` still keeps a second job on this host out."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise BusyError(
            f"results file {path} is being written by another process (it holds the file's lock)", BUSY_FIX
        ) from None
    except OSError:
        pass


# errno values that mean "this path cannot be written" (a bad --output) rather than "a write failed half-way"
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ENOENT}
_FULL = {errno.ENOSPC, errno.EDQUOT}


def write_failed(path: Path, exc: OSError) -> QvlError:
    """One line for a failed write of the results file: an unwritable path is bad input (exit 2), a full disk or
    an I/O error a failed write (exit 5). The file holds only complete lines either way (the driver adds how many
    requests finished and that ``--resume`` goes on)."""
    what = exc.strerror or type(exc).__name__
    if exc.errno in _UNWRITABLE:
        return InputError(
            f"cannot write the results file {path} ({what})", "pass an --output in a folder you can write"
        )
    if exc.errno in _FULL:
        return BackendError(
            f"disk full writing {path} ({what}); it holds only complete lines", "free space on that filesystem"
        )
    return BackendError(
        f"writing {path} failed ({what}); it holds only complete lines",
        "check the disk, or pass an --output on another filesystem",
    )


def _encoded(record: dict[str, Any]) -> bytes:
    """One compact JSON line, UTF-8; ASCII escapes when a string holds a lone surrogate (a file name that was not
    UTF-8, quoted in an error message), so the line is always valid UTF-8 that ``--resume`` reads back."""
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str)
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(record, ensure_ascii=True, separators=(",", ":"), default=str) + "\n").encode("ascii")


class ResultsWriter:
    """Appends records to the results file, one ``write`` per line, flushed at once, fsync'd every few seconds.

    The file is opened (created) by the first ``write``, and locked (``flock``) while open."""

    def __init__(self, path: str | Path, *, clock: Any = time.monotonic):
        self.path = Path(path)
        self._fd: int | None = None
        self._clock = clock
        self._synced = clock()
        self.written = 0
        self._line_start: int | None = None  # set while a line is being written: where it began

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise write_failed(self.path, exc) from None
        try:
            _lock_file(fd, self.path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def write(self, record: dict[str, Any]) -> None:
        data = _encoded(record)
        if self._fd is None:
            self._fd = self._open()
        try:
            self._line_start = os.lseek(self._fd, 0, os.SEEK_END)
            n = os.write(self._fd, data)
            while n < len(data):  # a short write (a full disk raises): finish the line before anything else
                n += os.write(self._fd, data[n:])
        except OSError as exc:  # the part written is cut by close()
            raise write_failed(self.path, exc) from None
        self._line_start = None
        self.written += 1
        if self._clock() - self._synced >= FSYNC_EVERY_S:
            self.sync()

    def sync(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise write_failed(self.path, exc) from None
            self._synced = self._clock()

    def close(self) -> None:
        """Sync and close; a line cut short by an exception (Ctrl-C or a full disk between two writes of it) is
        removed first, so the file holds only complete lines."""
        if self._fd is not None:
            try:
                if self._line_start is not None:
                    os.ftruncate(self._fd, self._line_start)
                    self._line_start = None
                os.fsync(self._fd)
            except OSError as exc:
                raise write_failed(self.path, exc) from None
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        with contextlib.suppress(QvlError):  # the exception in flight says what happened; this one would hide it
            self.close()
