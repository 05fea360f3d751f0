"""The results file of a batch job: JSON lines appended as requests finish, so a crash loses nothing done.

Each record is one line written with ONE ``write`` call on an unbuffered file (``O_APPEND``), so a kill (Ctrl-C,
``kill -9``, a power cut) leaves at most one torn last line, never a torn line in the middle. Lines reach the OS at
once (a crash of qvl loses nothing written) and the disk at least every ``FSYNC_EVERY_S`` seconds and on close
(a power cut loses at most those seconds, which ``--resume`` redoes).

``completed_ids`` reads an existing file for ``--resume``: it cuts a torn last line off the file (it is redone,
never counted) and returns the ids present, kept as 8-byte hashes so a million finished requests cost 8 MB.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from qwenvl_rbln.batch.hashes import HashBuckets
from qwenvl_rbln.batch.records import is_complete
from qwenvl_rbln.batch.source import id_hash
from qwenvl_rbln.errors import InputError

FSYNC_EVERY_S = 2.0


class CompletedIds:
    """The ids already in a results file: 8-byte hashes (``HashBuckets``), plus the exact ids behind ``shared``
    hashes (two ids of the batch file that hash alike: ``source.check_unique_ids``), so membership is exact for them."""

    def __init__(self, done: HashBuckets, exact: set[str], shared: frozenset[int]):
        self._hashes = done.freeze()
        self._exact = exact
        self._shared = shared
        self.torn = 0  # bytes of a torn last line cut off the file

    @classmethod
    def empty(cls) -> CompletedIds:
        return cls(HashBuckets(), set(), frozenset())

    def __len__(self) -> int:
        return len(self._hashes)

    def __contains__(self, rid: object) -> bool:
        if not isinstance(rid, str):
            return False
        h = id_hash(rid)
        if h in self._shared:
            return rid in self._exact
        return h in self._hashes


_OURS = b'{"id":'  # how every line ResultsWriter writes begins (the record's first key, compact JSON)


def _not_ours(path: Path, lineno: int) -> InputError:
    return InputError(
        f"{path}:{lineno}: not a qvl result line; --resume appends only to a results file qvl wrote",
        "pass the --output of the run to resume, or a new --output path",
    )


def _complete(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if is_complete(record) else None


def completed_ids(path: str | Path, shared: frozenset[int] = frozenset()) -> CompletedIds:
    """The ids finished in ``path`` (ok or failed for good), for ``--resume``.

    Every complete line is checked first: a line that is not a result (a file edited by hand, the wrong path) is
    refused naming it, and the file is left as it was. Then a torn last line (no newline: a kill mid-write) is
    cut off the file, so its request is redone and never counted (``CompletedIds.torn``: the bytes cut)."""
    path = Path(path)
    done = HashBuckets()
    exact: set[str] = set()
    keep = torn = 0
    if path.exists():
        with path.open("rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if not raw.endswith(b"\n"):  # the last line, torn
                    record = _complete(raw)
                    if record is None and not raw.startswith(_OURS):
                        raise _not_ours(path, lineno)
                    torn = len(raw)
                    break
                keep += len(raw)
                if not raw.strip():
                    continue
                record = _complete(raw)
                if record is None:
                    raise _not_ours(path, lineno)
                h = id_hash(record["id"])
                done.add(h)
                if h in shared:
                    exact.add(record["id"])
        if torn:
            with path.open("rb+") as fh:
                fh.truncate(keep)
                os.fsync(fh.fileno())
    ids = CompletedIds(done, exact, shared)
    ids.torn = torn
    return ids


class ResultsWriter:
    """Appends records to the results file, one ``write`` per line, flushed at once, fsync'd every few seconds."""

    def __init__(self, path: str | Path, *, clock: Any = time.monotonic):
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._clock = clock
        self._synced = clock()
        self.written = 0
        self._line_start: int | None = None  # set while a line is being written: where it began

    def write(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str) + "\n").encode("utf-8")
        assert self._fd is not None, "results file closed"
        self._line_start = os.lseek(self._fd, 0, os.SEEK_END)
        n = os.write(self._fd, data)
        while n < len(data):  # a short write (a full disk raises): finish the line before anything else
            n += os.write(self._fd, data[n:])
        self._line_start = None
        self.written += 1
        if self._clock() - self._synced >= FSYNC_EVERY_S:
            self.sync()

    def sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            self._synced = self._clock()

    def close(self) -> None:
        """Sync and close; a line cut short by an exception (Ctrl-C between two writes of it) is removed first,
        so the file holds only complete lines."""
        if self._fd is not None:
            try:
                if self._line_start is not None:
                    os.ftruncate(self._fd, self._line_start)
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
