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
from array import array
from bisect import bisect_left
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from qwenvl_rbln.batch.records import is_complete
from qwenvl_rbln.batch.source import id_hash
from qwenvl_rbln.errors import InputError

FSYNC_EVERY_S = 2.0


class CompletedIds:
    """The ids already in a results file: sorted 8-byte hashes, plus the exact ids behind ``shared`` hashes (two
    ids of the batch file that hash alike, from ``source.check_unique_ids``), so membership is exact for them."""

    def __init__(self, hashes: array, exact: set[str], shared: frozenset[int]):
        self._hashes = array("Q", sorted(hashes))
        self._exact = exact
        self._shared = shared

    def __len__(self) -> int:
        return len(self._hashes)

    def __contains__(self, rid: object) -> bool:
        if not isinstance(rid, str):
            return False
        h = id_hash(rid)
        if h in self._shared:
            return rid in self._exact
        i = bisect_left(self._hashes, h)
        return i < len(self._hashes) and self._hashes[i] == h


def _cut_torn_tail(path: Path) -> int:
    """Truncate the file after its last newline (a line torn by a kill); the bytes cut."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as fh:
        pos = size
        block = 65536
        while pos > 0:
            start = max(0, pos - block)
            fh.seek(start)
            chunk = fh.read(pos - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            pos = start
        else:
            keep = 0
        if keep < size:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
        return size - keep


def completed_ids(path: str | Path, shared: frozenset[int] = frozenset()) -> CompletedIds:
    """The ids finished in ``path`` (ok or failed for good); a torn last line is cut off first (redone).

    A complete line that is not a result (edited by hand, another file) is refused naming the line: appending to
    it would mix two files."""
    path = Path(path)
    hashes = array("Q")
    exact: set[str] = set()
    if not path.exists():
        return CompletedIds(hashes, exact, shared)
    _cut_torn_tail(path)
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except ValueError:
                record = None
            if not is_complete(record):
                raise InputError(
                    f"{path}:{lineno}: not a qvl result line; --resume appends only to a results file qvl wrote",
                    "pass the --output of the run to resume, or a new --output path",
                )
            h = id_hash(record["id"])
            hashes.append(h)
            if h in shared:
                exact.add(record["id"])
    return CompletedIds(hashes, exact, shared)


class ResultsWriter:
    """Appends records to the results file, one ``write`` per line, flushed at once, fsync'd every few seconds."""

    def __init__(self, path: str | Path, *, clock: Any = time.monotonic):
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._clock = clock
        self._synced = clock()
        self.written = 0

    def write(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str) + "\n").encode("utf-8")
        assert self._fd is not None, "results file closed"
        n = os.write(self._fd, data)
        while n < len(data):  # a short write (a full disk raises): finish the line before anything else
            n += os.write(self._fd, data[n:])
        self.written += 1
        if self._clock() - self._synced >= FSYNC_EVERY_S:
            self.sync()

    def write_all(self, records: Iterable[dict[str, Any]]) -> None:
        for record in records:
            self.write(record)

    def sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            self._synced = self._clock()

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
