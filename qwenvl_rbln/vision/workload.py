"""Workload files for ``qvl bucket-plan``: image/video sizes from request logs, and decode batch traces.

Formats (streamed line by line, so millions of lines cost memory per *distinct* size only):

* JSONL: one object per line, ``{"width": W, "height": H, "count": N}`` (``count`` optional,
  default 1). A video adds ``"frames"`` (total frames in the file) and optionally ``"fps"`` (the
  file's frame rate; missing means 24, as transformers assumes). ``"kind": "image"|"video"`` is
  optional. ``"images": N`` (an image entry) is N images of that size in one request: their ViT calls
  may be packed together (``qvl bucket-plan``), never across requests. Numbers must be JSON numbers
  (``"640"`` is refused: a quoted number usually means a log field that is not what it seems).
* CSV: a header with ``width,height`` and optionally ``count``, ``frames``, ``fps``, ``kind``, ``images``
  (case and spaces ignored); empty ``frames`` cells are images.

Both treat other keys or columns the same way: one that looks like a misspelling of those seven
(``widht``, ``Width``) is an error naming ``file:line`` and the key, so it never silently turns into
"no width"; any other (request ids, timestamps: logs carry them) is ignored and listed once in
``Workload.ignored``, which ``bucket-plan`` reports.
* Batch trace: a JSON list of running batch sizes, or one integer per line (``#`` comments and
  blank lines skipped).

Every problem is an ``InputError`` naming ``file:line``, the key and the bad value.
"""

from __future__ import annotations

import csv
import difflib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.paths import user_path

KNOWN_KEYS = ("width", "height", "count", "frames", "fps", "kind", "images")
# (width, height, frames or None, fps or None): frames None = image; a 5th element N when "images": N > 1.
SizeKey = tuple[int, int, int | None, float | None] | tuple[int, int, None, None, int]

_LINE_CACHE_LIMIT = 200_000  # distinct raw lines remembered for the fast path
_FORMAT_HINT = 'each line is a JSON object like {"width": 1920, "height": 1080, "count": 12}'
_NUMERIC_KEYS = ("width", "height", "count", "frames", "fps", "images")
_CSV_HINT = "the first line is a header such as width,height,count (frames,fps for videos)"


@dataclass
class Workload:
    """A workload aggregated per distinct size: ``sizes[(w, h, frames, fps)] = requests``."""

    path: str
    format: str  # "jsonl" or "csv"
    sizes: dict[SizeKey, int] = field(default_factory=dict)
    lines: int = 0  # data lines read
    requests: int = 0  # sum of counts
    ignored: set[str] = field(default_factory=set)  # keys/columns other than the known ones (ids, timestamps)

    def add(self, key: SizeKey, count: int) -> None:
        self.sizes[key] = self.sizes.get(key, 0) + count
        self.requests += count

    @property
    def distinct(self) -> int:
        return len(self.sizes)


def _open_text(path: str | Path, what: str):
    p = user_path(path, f"{what} file")
    if not p.exists():
        raise InputError(f"{p}: no such {what} file", f"check the path of the {what} file")
    if p.is_dir():
        raise InputError(f"{p} is a directory, not a {what} file", f"pass the {what} file itself")
    try:
        return p.open("r", encoding="utf-8-sig", newline="")
    except OSError as e:
        raise InputError(f"{p}: cannot be read ({e.strerror or e})", "check the file permissions") from e


def _first_char(path: str | Path, what: str, hint: str = "pass a JSONL or CSV text file") -> str:
    with _open_text(path, what) as f:
        try:
            for line in f:
                s = line.strip()
                if s and not s.startswith("#"):
                    return s[0]
        except UnicodeDecodeError as e:
            raise InputError(f"{path}: not a UTF-8 text file ({e.reason})", hint) from e
    return ""


_KNOWN_SET = frozenset(KNOWN_KEYS)
_NEAR_CACHE: dict[str, str | None] = {}


def _near(key: str) -> str | None:
    """The known key an unknown one looks like a misspelling of (cached: logs repeat their keys)."""
    if key in _NEAR_CACHE:
        return _NEAR_CACHE[key]
    match = difflib.get_close_matches(key.lower(), KNOWN_KEYS, n=1, cutoff=0.75)
    near = match[0] if match and match[0] != key else None
    if len(_NEAR_CACHE) < 10_000:
        _NEAR_CACHE[key] = near
    return near


def _as_int(value: Any) -> int | None:
    """An integer from JSON/CSV: ints, integral floats and numeric text; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                return None
            return int(f) if math.isfinite(f) and f.is_integer() else None
    return None


def _whole(value: Any) -> bool:
    """An integer as written: a JSON integer or integer text (``2``, not ``2.0``, ``1e2`` or ``2.5``)."""
    if isinstance(value, str):
        return value.strip().lstrip("+-").isdigit()
    return isinstance(value, int) and not isinstance(value, bool)


def _int_value(where: str, key: str, value: Any, *, minimum: int, hint: str, whole: bool = False) -> int:
    """``whole``: only an integer as written (a count of requests is never 2.0: a float there is a wrong column)."""
    parsed = _as_int(value) if not whole or _whole(value) else None
    if parsed is None or parsed < minimum:
        raise InputError(f"{where}: {key}={value!r} is not an integer >= {minimum}", hint)
    return parsed


def _check_keys(where: str, obj: dict[str, Any], hint: str, ignored: set[str], *, what: str = "key") -> None:
    """A key that looks like a misspelt known one is an error (in JSONL and CSV alike); any other extra key
    (a request id, a timestamp) is added to ``ignored`` for one report."""
    for key in obj:
        if key in _KNOWN_SET:
            continue
        near = _near(str(key))
        if near:
            raise InputError(f"{where}: unknown {what} {key!r}", f"did you mean {near!r}? {hint}")
        ignored.add(str(key))


def _check_json_numbers(where: str, obj: dict[str, Any]) -> None:
    """JSON workloads carry numbers as numbers: a quoted one is refused, not guessed."""
    for key in _NUMERIC_KEYS:
        value = obj.get(key)
        if isinstance(value, str):
            raise InputError(
                f"{where}: {key}={value!r} is a string, not a number",
                f'write it without quotes, e.g. "{key}": {_unquoted(key, value)}',
            )


_EXAMPLE = {"width": 1920, "height": 1080, "count": 12, "frames": 300, "fps": 30, "images": 8}


def _unquoted(key: str, value: str) -> str:
    """The value as the JSON number it should have been, when it is one."""
    text = value.strip()
    try:
        return text if math.isfinite(float(text)) else str(_EXAMPLE[key])
    except ValueError:
        return str(_EXAMPLE[key])


def _entry(
    where: str, obj: dict[str, Any], hint: str, ignored: set[str], *, json_values: bool = True
) -> tuple[SizeKey, int]:
    _check_keys(where, obj, hint, ignored)
    if json_values:
        _check_json_numbers(where, obj)
    for key in ("width", "height"):
        if key not in obj or obj[key] in (None, ""):
            raise InputError(f"{where}: missing {key!r}", hint)
    raw = {k: obj[k] for k in KNOWN_KEYS if k in obj}
    width = _int_value(where, "width", raw["width"], minimum=1, hint=hint)
    height = _int_value(where, "height", raw["height"], minimum=1, hint=hint)
    count = (
        1
        if raw.get("count") in (None, "")
        else _int_value(where, "count", raw["count"], minimum=0, hint=hint, whole=True)
    )
    kind = raw.get("kind")
    if kind not in (None, "", "image", "video"):
        raise InputError(f"{where}: kind={kind!r} is not 'image' or 'video'", hint)
    frames = None
    if raw.get("frames") not in (None, ""):
        frames = _int_value(where, "frames", raw["frames"], minimum=1, hint="frames is the video's total frame count")
    if kind == "video" and frames is None:
        raise InputError(
            f"{where}: a video entry needs 'frames' (its total frame count)",
            'e.g. {"width": 1280, "height": 720, "frames": 300, "fps": 30}',
        )
    if kind == "image" and frames is not None:
        raise InputError(f"{where}: kind='image' with frames={frames}", "drop frames, or use kind 'video'")
    fps = None
    if raw.get("fps") not in (None, ""):
        value = raw["fps"]
        try:
            fps = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            fps = math.nan
        if not math.isfinite(fps) or fps <= 0:
            raise InputError(f"{where}: fps={value!r} is not a positive number", "fps is the video's frame rate")
        if frames is None:
            raise InputError(
                f"{where}: fps={value!r} given without frames",
                "a video entry needs frames (total frame count); drop fps for an image",
            )
    if raw.get("images") not in (None, ""):
        images = _int_value(
            where, "images", raw["images"], minimum=1, hint="images is how many images of this size one request has"
        )
        if frames is not None:
            raise InputError(f"{where}: images={images} on a video entry", "give images on image entries only")
        if images > 1:
            return (width, height, None, None, images), count
    return (width, height, frames, fps), count


def read_workload(path: str | Path) -> Workload:
    """Read a JSONL or CSV workload (chosen by extension, else by the first character)."""
    p = user_path(path, "workload file")
    suffix = p.suffix.lower()
    if suffix == ".csv":
        fmt = "csv"
    elif suffix in (".jsonl", ".ndjson", ".json"):
        fmt = "jsonl"
    else:
        fmt = "jsonl" if _first_char(p, "workload") == "{" else "csv"
    wl = Workload(path=str(p), format=fmt)
    try:
        if fmt == "jsonl" and _first_char(p, "workload") == "[":
            _read_json_array(p, wl)
        elif fmt == "jsonl":
            _read_jsonl(p, wl)
        else:
            _read_csv(p, wl)
    except UnicodeDecodeError as e:
        raise InputError(f"{p}: not a UTF-8 text file ({e.reason})", "pass a JSONL or CSV text file") from e
    if not wl.sizes:
        hint = _CSV_HINT if fmt == "csv" else _FORMAT_HINT
        raise InputError(f"{p}: the workload has no entries with a count above 0", hint)
    return wl


def _read_jsonl(p: Path, wl: Workload) -> None:
    cache: dict[str, tuple[SizeKey, int]] = {}
    with _open_text(p, "workload") as f:
        for lineno, line in enumerate(f, start=1):
            hit = cache.get(line)
            if hit is not None:
                wl.lines += 1
                if hit[1]:
                    wl.add(*hit)
                continue
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            where = f"{p}:{lineno}"
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                shown = text if len(text) <= 60 else text[:57] + "..."
                raise InputError(f"{where}: not valid JSON ({e.msg}): {shown}", _FORMAT_HINT) from None
            if not isinstance(obj, dict):
                raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__} {text[:40]}", _FORMAT_HINT)
            key, count = _entry(where, obj, _FORMAT_HINT, wl.ignored)
            if len(cache) < _LINE_CACHE_LIMIT:
                cache[line] = (key, count)
            wl.lines += 1
            if count:
                wl.add(key, count)


def _load_json(p: Path, what: str, hint: str) -> Any:
    """A whole JSON file; a syntax error names ``file:line``."""
    with _open_text(p, what) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise InputError(f"{p}:{e.lineno}: not valid JSON ({e.msg})", hint) from None


def _read_json_array(p: Path, wl: Workload) -> None:
    """A .json file holding one list of entry objects (not streamed; JSONL is)."""
    data = _load_json(p, "workload", _FORMAT_HINT)
    if not isinstance(data, list):
        raise InputError(f"{p}: expected a list of objects or JSON Lines", _FORMAT_HINT)
    for i, obj in enumerate(data):
        where = f"{p}: item {i}"
        if not isinstance(obj, dict):
            raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}", _FORMAT_HINT)
        key, count = _entry(where, obj, _FORMAT_HINT, wl.ignored)
        wl.lines += 1
        if count:
            wl.add(key, count)


def _read_csv(p: Path, wl: Workload) -> None:
    with _open_text(p, "workload") as f:
        reader = csv.reader(f)
        header: list[str] | None = None
        cache: dict[tuple[str, ...], tuple[SizeKey, int]] = {}
        for row in reader:
            if not row or all(not c.strip() for c in row) or row[0].lstrip().startswith("#"):
                continue
            if header is None:
                header = [c.strip().lower() for c in row]
                where = f"{p}:{reader.line_num}"
                for col in header:  # a number or nothing: the file has no header line at all
                    if col.isdigit() or not col:
                        raise InputError(f"{where}: header column {col!r} is not a workload column", _CSV_HINT)
                _check_keys(where, dict.fromkeys(header), _CSV_HINT, wl.ignored, what="column")
                missing = [c for c in ("width", "height") if c not in header]
                if missing:
                    raise InputError(
                        f"{where}: the CSV header has no {' or '.join(missing)} column (header: {','.join(header)})",
                        _CSV_HINT,
                    )
                if len(set(header)) != len(header):
                    raise InputError(f"{where}: the CSV header repeats a column ({','.join(header)})", _CSV_HINT)
                continue
            t = tuple(row)
            hit = cache.get(t)
            if hit is None:
                where = f"{p}:{reader.line_num}"
                if len(row) != len(header):
                    raise InputError(
                        f"{where}: {len(row)} fields but the header has {len(header)} ({','.join(header)})", _CSV_HINT
                    )
                obj = {col: cell.strip() for col, cell in zip(header, row, strict=True) if col in _KNOWN_SET}
                hit = _entry(where, obj, _CSV_HINT, wl.ignored, json_values=False)
                if len(cache) < _LINE_CACHE_LIMIT:
                    cache[t] = hit
            wl.lines += 1
            if hit[1]:
                wl.add(*hit)
        if header is None:
            raise InputError(f"{p}: empty workload file", _CSV_HINT)


# --- batch traces ----------------------------------------------------------------------------------

_TRACE_HINT = "a batch trace is a JSON list of running batch sizes, e.g. [4, 4, 3, 1], or one integer per line"


def _batch_value(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{where}: batch size {value!r} is not an integer >= 1", _TRACE_HINT)
    return value


def read_batch_trace(path: str | Path) -> dict[int, int]:
    """Observed running-batch sizes -> number of decode steps with that size."""
    p = user_path(path, "batch trace file")
    first = _first_char(p, "batch trace", _TRACE_HINT)
    counts: dict[int, int] = {}
    if first and first in "[{":
        data = _load_json(p, "batch trace", _TRACE_HINT)
        if not isinstance(data, list):
            raise InputError(f"{p}: expected a JSON list of batch sizes", _TRACE_HINT)
        for i, value in enumerate(data):
            b = _batch_value(f"{p}: item {i}", value)
            counts[b] = counts.get(b, 0) + 1
    else:
        with _open_text(p, "batch trace") as f:
            for lineno, line in enumerate(_lines(f, p), start=1):
                text = line.split("#", 1)[0].strip()
                if not text:
                    continue
                try:
                    value: Any = int(text)
                except ValueError:
                    raise InputError(f"{p}:{lineno}: {text[:40]!r} is not an integer batch size", _TRACE_HINT) from None
                b = _batch_value(f"{p}:{lineno}", value)
                counts[b] = counts.get(b, 0) + 1
    if not counts:
        raise InputError(f"{p}: the batch trace is empty", _TRACE_HINT)
    return counts


def _lines(f, p: Path) -> Iterator[str]:
    try:
        yield from f
    except UnicodeDecodeError as e:
        raise InputError(f"{p}: not a UTF-8 text file ({e.reason})", _TRACE_HINT) from e
