"""Requests for ``qvl infer``: from flags or a JSONL batch file, validated before any model is loaded.

A batch file holds one JSON object per line::

    {"id": "cat", "prompt": "Describe this image.", "images": ["cat.jpg"]}
    {"prompt": "What happens?", "video": "clip.mp4", "system": "Be brief."}
    {"prompt": "Say hello."}

Keys: ``prompt`` (string), ``images`` (list of paths, or ``image``: one path), ``videos`` (list, or
``video``: one path), ``system`` (string), ``id`` (string or integer; default: the request's 1-based
position). Relative paths are resolved against the batch file's directory. Blank lines and lines
starting with ``#`` are skipped. Lines end at ``\\n`` only (a CR before it is stripped; a lone CR is JSON
whitespace, not a line break), and a UTF-8 byte-order mark is read as one. Every problem names ``file:line``
and the key; a value is quoted as ``shown`` spells it (never a raw control character, never a screenful).

Nothing here imports torch: media are probed header-only (``media.probe_image`` / ``probe_video``),
so a missing or damaged file fails in milliseconds, before a model is loaded (nothing half-done).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError, raise_all
from qwenvl_rbln.paths import user_path
from qwenvl_rbln.vision.media import ImageInfo, VideoInfo, probe_image, probe_video

ALLOWED_KEYS = ("id", "prompt", "system", "images", "image", "videos", "video")
FLAGS_SOURCE = "command line"


@dataclass
class Request:
    """One conversation turn: an optional system prompt, then images, videos and the prompt text."""

    id: str
    prompt: str
    system: str | None = None
    images: list[Path] = field(default_factory=list)
    videos: list[Path] = field(default_factory=list)
    source: str = FLAGS_SOURCE  # "command line" or "requests.jsonl:3"
    image_info: list[ImageInfo] = field(default_factory=list)  # filled by validate_requests
    video_info: list[VideoInfo] = field(default_factory=list)
    caps: Any = None  # plan.ProcessorCaps for this request alone (vision_report decides; None: the backend's)

    @property
    def has_media(self) -> bool:
        return bool(self.images or self.videos)

    def messages(self) -> list[dict[str, Any]]:
        """Chat messages in the Qwen3-VL layout: images, then videos, then the prompt text."""
        content: list[dict[str, Any]] = [{"type": "image"} for _ in self.images]
        content += [{"type": "video"} for _ in self.videos]
        if self.prompt:
            content.append({"type": "text", "text": self.prompt})
        out: list[dict[str, Any]] = []
        if self.system:
            out.append({"role": "system", "content": [{"type": "text", "text": self.system}]})
        out.append({"role": "user", "content": content})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "prompt": self.prompt,
            "system": self.system,
            "images": [str(p) for p in self.images],
            "videos": [str(p) for p in self.videos],
            "source": self.source,
        }


def from_flags(
    prompt: str | None,
    images: list[str] | None = None,
    videos: list[str] | None = None,
    system: str | None = None,
    request_id: str = "1",
) -> list[Request]:
    """The single request that ``--prompt/--image/--video/--system`` describe."""
    return [
        Request(
            id=request_id,
            prompt=(prompt or "").strip(),
            system=(system or "").strip() or None,
            images=[user_path(p, "--image") for p in images or []],
            videos=[user_path(p, "--video") for p in videos or []],
            source=FLAGS_SOURCE,
        )
    ]


SHOWN_CHARS = 80  # a value quoted in a message is cut here (a line may hold a megabyte)


def shown(value: Any) -> str:
    """A value of a batch-file line as a message quotes it: a string as Python writes it (``'cat-1'``, a control
    character escaped: ``'a\\x1b[31m'``, so an id never recolours the terminal), anything else in JSON spelling
    (``null``, ``true``, ``[1]``), cut at ``SHOWN_CHARS``."""
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, ensure_ascii=True)
        except (ValueError, TypeError, RecursionError):
            text = f"<{type(value).__name__}>"
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _paths(where: str, key: str, value: Any, base: Path) -> list[Path]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v.strip() for v in items):
        raise InputError(
            f"{where}: {key}={shown(value)} must be a path or a list of paths",
            f'write "{key}": ["a.jpg", "b.png"]' if key.endswith("s") else f'write "{key}": "file"',
        )
    out = []
    fix = f'list the {"video" if key.startswith("video") else "image"} files themselves under "{key}"'
    for v in items:
        p = user_path(v, f"{where}: {key}")
        p = p if p.is_absolute() else base / p
        try:
            directory = p.is_dir()
        except OSError as exc:  # a name too long for the filesystem: a value of the line, as the directory below
            raise InputError(f"{where}: {key}: {shown(v)} is not a usable path ({exc.strerror})", fix) from None
        if directory:  # a value of the line, not a damaged file: said here, before any probe
            raise InputError(f"{where}: {key}: {shown(v)} is a directory, not a file", fix)
        out.append(p)
    return out


def request_id(where: str, obj: dict[str, Any], position: int) -> str:
    """The one id rule of a batch-file line: its ``"id"`` (a string, or an integer as a string), else its 1-based
    ``position`` among the request lines; InputError naming ``where`` for any other value."""
    rid = obj.get("id", position)
    if isinstance(rid, bool) or not isinstance(rid, str | int) or not str(rid).strip():
        raise InputError(f"{where}: id={shown(rid)} must be a non-empty string or an integer", 'write "id": "cat-1"')
    text = str(rid).strip()
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone \ud800-\udfff escape: JSON allows it, no text holds it
        raise InputError(
            f"{where}: id {shown(text)} is not valid Unicode (a lone surrogate {shown(text[exc.start])[1:-1]})",
            "write the id as plain text (a \\ud800-\\udfff escape is only valid as the first of a pair)",
        ) from None
    return text


def _one(where: str, obj: dict[str, Any], base: Path, position: int, default_system: str | None) -> Request:
    from qwenvl_rbln.planning.presets import closest

    for key in obj:
        if key not in ALLOWED_KEYS:
            near = closest(str(key), list(ALLOWED_KEYS))
            hint = f"did you mean '{near}'?" if near else f"use only {', '.join(ALLOWED_KEYS)}"
            raise InputError(f"{where}: unknown key {shown(str(key))}", hint)
    prompt = obj.get("prompt", "")
    if not isinstance(prompt, str):
        raise InputError(f"{where}: prompt={shown(prompt)} must be a string", 'write "prompt": "Describe this image."')
    system = obj.get("system", default_system)
    if system is not None and not isinstance(system, str):
        raise InputError(f"{where}: system={shown(system)} must be a string", 'write "system": "You are ..."')
    rid = request_id(where, obj, position)
    for single, plural in (("image", "images"), ("video", "videos")):
        if single in obj and plural in obj:
            raise InputError(f"{where}: both '{single}' and '{plural}' are given", f"list every file under '{plural}'")
    images = _paths(where, "image" if "image" in obj else "images", obj.get("image", obj.get("images", [])), base)
    videos = _paths(where, "video" if "video" in obj else "videos", obj.get("video", obj.get("videos", [])), base)
    return Request(
        id=rid,
        prompt=prompt.strip(),
        system=(system or "").strip() or None,
        images=images,
        videos=videos,
        source=where,
    )


_LINE_HINT = 'one JSON object per line, e.g. {"prompt": "Describe.", "images": ["a.jpg"]}'


_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "true/false"}


def line_object(where: str, text: str, hint: str = _LINE_HINT) -> dict[str, Any]:
    """The JSON object on one batch-file line (``where`` is ``file:line``); InputError naming it otherwise, for
    every text (a number past Python's digit limit and nesting past its depth limit included)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})", hint) from None
    except ValueError:  # int(): a number longer than Python converts
        raise InputError(
            f"{where}: a number with more than {sys.get_int_max_str_digits()} digits, more than qvl reads", hint
        ) from None
    except RecursionError:
        raise InputError(
            f"{where}: arrays/objects nested too deeply (about 1000 levels) for qvl to read", hint
        ) from None
    if not isinstance(obj, dict):
        kind = "null" if obj is None else _JSON_TYPES.get(type(obj), type(obj).__name__)
        raise InputError(f"{where}: expected a JSON object, got {kind}", hint)
    return obj


def batch_file(path: Path, why: str) -> Path:
    """``path`` if it is a regular file; InputError otherwise (``why``: why a pipe or a device will not do)."""
    if path.is_file():
        return path
    if path.is_dir():
        what = "is a directory"
    elif path.exists():
        what = f"is not a regular file ({why})"
    else:
        what = "does not exist"
    raise InputError(f"batch file {path} {what}", "pass a JSONL file with one request per line")


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, stripped text) of every request line of a batch file, read as it is consumed.

    Lines end at ``\\n`` only, as ``wc -l`` and editors count them (a lone CR is JSON whitespace inside a line);
    a byte-order mark (Notepad, PowerShell 5) is skipped; blank lines and ``#`` comments are not requests."""
    for lineno, text in read_lines_or_errors(path):
        if isinstance(text, UnicodeDecodeError):
            raise InputError(
                f"{path}:{lineno}: not UTF-8 text ({text.reason} at byte {text.start} of the line)",
                "save the batch file as UTF-8 JSONL",
            )
        yield lineno, text


def read_lines_or_errors(path: Path) -> Iterator[tuple[int, str | UnicodeDecodeError]]:
    """``read_lines``, except that a line that is not UTF-8 comes as its decode error instead of ending the read:
    a reader that reports every bad line at once (``qvl eval``'s question file) gets them all."""
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})", "check the file permissions") from None
    with fh:
        lineno = 0
        while True:
            try:
                raw = fh.readline()
            except OSError as exc:
                raise InputError(f"{path}:{lineno + 1}: cannot be read ({exc.strerror})", "check the disk") from None
            if not raw:
                return
            lineno += 1
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield lineno, exc
                continue
            stripped = text.lstrip("\ufeff").strip()
            if stripped and not stripped.startswith("#"):
                yield lineno, stripped


def _line_request(
    where: str, text: str, base: Path, position: int, default_system: str | None, seen: dict[str, str]
) -> Request:
    """The request on one batch-file line; InputError naming ``file:line``."""
    obj = line_object(where, text)
    req = _one(where, obj, base, position, default_system)
    if req.id in seen:
        raise InputError(
            f"{where}: id {shown(req.id)} was already used at {seen[req.id]}", "give each request its own id"
        )
    seen[req.id] = where
    return req


def parse_batch_file(
    path: str | Path, *, default_system: str | None = None, problems: list[InputError] | None = None
) -> list[Request]:
    """Requests from a JSONL file (see the module docstring); errors name ``file:line``.

    Every bad line is reported, not only the first: raised together, or appended to ``problems`` (then the
    good lines are returned, for the caller to check further and report everything at once)."""
    path = batch_file(user_path(path, "batch file"), "a pipe or a device: save it to a file first")
    base = path.parent
    requests: list[Request] = []
    seen: dict[str, str] = {}
    bad: list[InputError] = []  # every bad line, reported together
    for position, (lineno, stripped) in enumerate(read_lines(path), start=1):
        try:
            req = _line_request(f"{path}:{lineno}", stripped, base, position, default_system, seen)
        except InputError as exc:
            bad.append(exc)
            continue
        requests.append(req)
    if problems is not None:
        problems.extend(bad)
    else:
        raise_all(bad, f"bad lines in {path}", "correct each line listed; nothing ran")
    if not requests and not bad:
        raise InputError(f"batch file {path} has no requests", "write one JSON object per line")
    return requests


def validate_requests(requests: list[Request], problems: list[InputError] | None = None) -> list[Request]:
    """Check prompts and probe every image/video (header only); fill ``image_info``/``video_info``.

    Raises InputError naming the request's source and the file, before anything heavy happens.
    """
    bad: list[InputError] = []
    good = []
    for req in requests:
        try:
            _validate(req)
        except InputError as exc:
            bad.append(exc)
        else:
            good.append(req)
    if problems is not None:  # the caller reports them with its own (a batch file's bad lines)
        problems.extend(bad)
        return good
    raise_all(bad, "requests cannot run", "correct each one listed; nothing ran")
    return requests


def _validate(req: Request) -> None:
    """One request's prompt and media probed; InputError naming its source and file."""
    from qwenvl_rbln.vision.media import VIDEO_EXTENSIONS

    prefix = "" if req.source == FLAGS_SOURCE else f"{req.source}: "
    flags = req.source == FLAGS_SOURCE
    if not req.prompt and not req.has_media:
        raise InputError(
            f"{prefix}empty prompt and no image or video: there is nothing to run",
            "pass --prompt TEXT, or --image/--video (with or without a prompt)"
            if req.source == FLAGS_SOURCE
            else 'give the line a "prompt", "images" or "video"',
        )
    infos: list[ImageInfo] = []
    for p in req.images:
        if p.suffix.lower() in VIDEO_EXTENSIONS:
            raise InputError(
                f"{prefix}{p} looks like a video but was given as an image",
                "pass it with --video" if flags else 'list it under "videos" (or "video")',
            )
        try:
            infos.append(probe_image(p))
        except InputError as exc:
            raise InputError(prefix + exc.message, exc.hint) from None
    vinfos: list[VideoInfo] = []
    for p in req.videos:
        try:
            info = probe_video(p)
        except InputError as exc:
            if _still_image(p):
                raise _image_as_video(prefix, p, flags) from None
            raise InputError(prefix + exc.message, exc.hint) from None
        if info.total_frames <= 1 and _still_image(p):
            raise _image_as_video(prefix, p, flags)
        vinfos.append(info)
    req.image_info = infos
    req.video_info = vinfos


def _still_image(path: Path) -> bool:
    """True when ``path`` is an image file (an image extension, or a header Pillow recognises) and not a video.

    Asked only of a "video" that has at most one frame or does not probe as a video, so an animated GIF
    passed as a video still runs as one."""
    from qwenvl_rbln.vision.media import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS

    suffix = path.suffix.lower()
    if suffix in IMAGE_EXTENSIONS:
        return True
    if suffix in VIDEO_EXTENSIONS:
        return False
    try:
        from PIL import Image

        with Image.open(path) as img:  # reads the header only
            return img.format not in (None, "MPEG")
    except Exception:  # noqa: BLE001 - not an image Pillow knows
        return False


def _image_as_video(prefix: str, path: Path, flags: bool) -> InputError:
    """The refusal of an image given as a video, mirroring the one of a video given as an image."""
    return InputError(
        f"{prefix}{path} looks like an image but was given as a video",
        "pass it with --image" if flags else 'list it under "images" (or "image")',
    )


def from_object(where: str, obj: dict[str, Any], base: Path, request_id: str) -> Request:
    """The request of one batch-file line's object whose id the caller decided (the streamed batch job: its
    ``batch/source.py`` reads the lines); InputError naming ``where`` for a bad key or value."""
    return _one(where, {**obj, "id": request_id}, base, 0, None)


def validate_request(req: Request) -> None:
    """One request's prompt and media probed (header only); InputError naming its source and file."""
    _validate(req)
