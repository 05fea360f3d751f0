"""The batch file, streamed: one ``WorkItem`` per request line, never the whole file in memory.

A million-line batch file is read line by line, twice at most: ``check_unique_ids`` (a pre-pass, before any
work) and ``iter_items`` (the job). Ids follow ``qvl infer --batch-file``'s rule (``inference/requests.py``): the
line's ``"id"`` (a string or an integer, as a string), else the request's 1-based position among the request lines
(blank lines and ``#`` comments are not requests). So an id-less line keeps its id when the file is read again, and
the same file gives the same ids with or without ``--output``.

The duplicate check keeps 8 bytes per line (id hashes in ``hashes.HashBuckets``), not the ids: only a hash seen
twice sends it back to the file, for the ids and lines behind that hash.
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.batch import hashes
from qwenvl_rbln.errors import InputError, QvlError, raise_all
from qwenvl_rbln.inference.requests import batch_file, line_object, read_lines, request_id, shown

_LINE_HINT = 'one JSON object per line, e.g. {"id": "cat-1", "prompt": "Describe.", "images": ["a.jpg"]}'
MAX_PROBLEMS = 1000  # bad lines kept for the refusal (the count beyond is still reported)


@dataclass(frozen=True)
class WorkItem:
    """One request of the batch file: its id, its 1-based line, and the line's JSON object (picklable)."""

    id: str
    line: int
    raw: dict[str, Any] = field(hash=False, compare=False)


def id_hash(rid: str) -> int:
    """The 8-byte hash the duplicate check and ``--resume`` keep instead of the id itself."""
    return hashes.id_hash(rid)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, stripped text) of every request line (``requests.read_lines``: ``\\n`` ends a line).
    A pipe or a device is refused: the job reads the file twice (the pre-pass, then the job)."""
    return read_lines(batch_file(path, "the job reads it twice: save it to a file first"))


def _parse(path: Path, lineno: int, text: str, position: int) -> tuple[str, dict[str, Any]]:
    """(id, object) of one request line; InputError naming ``file:line``."""
    where = f"{path}:{lineno}"
    obj = line_object(where, text, _LINE_HINT)
    return request_id(where, obj, position), obj


def iter_items(path: str | Path, default_system: str | None = None) -> Iterator[WorkItem]:
    """Every request of the batch file, in file order, read as it is consumed.

    ``default_system`` (``--system``) fills ``raw["system"]`` of a line without one. A line that is not a JSON
    object with a valid id raises InputError (``check_unique_ids`` has refused such a file before any work)."""
    path = Path(path)
    for position, (lineno, text) in enumerate(_lines(path), start=1):
        rid, obj = _parse(path, lineno, text, position)
        if default_system is not None and "system" not in obj:
            obj["system"] = default_system
        yield WorkItem(rid, lineno, obj)


@dataclass
class IdCheck:
    """What the pre-pass learnt: request lines, and the hashes shared by two different ids (almost always none)."""

    count: int
    shared_hashes: frozenset[int]
    already: int = 0  # requests whose id is in ``done`` (--resume)


def _scan(path: Path, problems: list[QvlError], done: Container[str]) -> tuple[hashes.HashBuckets, int, int]:
    """The id hashes of every line, the number of bad lines (their errors kept, capped) and of ids in ``done``."""
    seen = hashes.HashBuckets()
    position = bad = already = 0
    for lineno, text in _lines(path):
        position += 1
        try:
            rid, _ = _parse(path, lineno, text, position)
        except InputError as exc:
            bad += 1
            if len(problems) < MAX_PROBLEMS:
                problems.append(exc)
            continue
        seen.add(id_hash(rid))
        already += rid in done
    return seen, bad, already


def _duplicates(path: Path, colliding: set[int]) -> tuple[list[QvlError], frozenset[int]]:
    """Second pass, only for colliding hashes: the duplicate ids with every line each is on."""
    lines: dict[str, list[int]] = {}
    for position, (lineno, text) in enumerate(_lines(path), start=1):
        try:
            rid, _ = _parse(path, lineno, text, position)
        except InputError:
            continue
        if id_hash(rid) in colliding:
            lines.setdefault(rid, []).append(lineno)
    dups: list[QvlError] = [
        InputError(
            f"{path}:{at[0]}: id {shown(rid)} is used again on line{'s' if len(at) > 2 else ''} "
            + ", ".join(map(str, at[1:])),
            "give each request its own id (--resume finds finished requests by id)",
        )
        for rid, at in lines.items()
        if len(at) > 1
    ]
    shared = frozenset(id_hash(rid) for rid, at in lines.items() if len(at) == 1)
    return dups, shared


def check_unique_ids(path: str | Path, done: Container[str] = ()) -> IdCheck:
    """Refuse, before any work, a batch file with duplicate ids or lines without a readable id, naming the lines.

    ``done`` (``--resume``'s finished ids) is counted on the way (``IdCheck.already``). Memory: 8 bytes per request
    line (``hashes.HashBuckets``); the file is read a second time only when two lines' hashes collide."""
    path = Path(path)
    problems: list[QvlError] = []
    seen, bad, already = _scan(path, problems, done)
    count = len(seen)
    colliding = set(seen.repeated())
    del seen
    dups, shared = _duplicates(path, colliding) if colliding else ([], frozenset())
    problems = sorted(problems + dups, key=_line_of)[:MAX_PROBLEMS]
    raise_all(problems, f"bad lines in {path}", "correct each line listed; nothing ran", total=bad + len(dups))
    if count == 0:
        raise InputError(f"batch file {path} has no requests", "write one JSON object per line")
    return IdCheck(count, shared, already)


def _line_of(exc: QvlError) -> int:
    import re

    match = re.search(r":(\d+): ", exc.message)
    return int(match.group(1)) if match else 0
