"""Requests for ``qvl infer``: from flags or a JSONL batch file, validated before any model is loaded.

A batch file holds one JSON object per line::

    {"id": "cat", "prompt": "Describe this image.", "images": ["cat.jpg"]}
    {"prompt": "What happens?", "video": "clip.mp4", "system": "Be brief."}
    {"prompt": "Say hello."}

Keys: ``prompt`` (string), ``images`` (list of paths, or ``image``: one path), ``videos`` (list, or
``video``: one path), ``system`` (string), ``id`` (string or integer; default: the request's 1-based
position). Relative paths are resolved against the batch file's directory. Blank lines and lines
starting with ``#`` are skipped. Every problem names ``file:line`` and the key.

Nothing here imports torch: media are probed header-only (``media.probe_image`` / ``probe_video``),
so a missing or damaged file fails in milliseconds, before a model is loaded (nothing half-done).
"""

from __future__ import annotations

import json
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


def _paths(where: str, key: str, value: Any, base: Path) -> list[Path]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v.strip() for v in items):
        raise InputError(
            f"{where}: {key}={value!r} must be a path or a list of paths",
            f'write "{key}": ["a.jpg", "b.png"]' if key.endswith("s") else f'write "{key}": "file"',
        )
    out = []
    for v in items:
        p = user_path(v, f"{where}: {key}")
        out.append(p if p.is_absolute() else base / p)
    return out


def _one(where: str, obj: dict[str, Any], base: Path, position: int, default_system: str | None) -> Request:
    from qwenvl_rbln.planning.presets import closest

    for key in obj:
        if key not in ALLOWED_KEYS:
            near = closest(str(key), list(ALLOWED_KEYS))
            hint = f"did you mean '{near}'?" if near else f"use only {', '.join(ALLOWED_KEYS)}"
            raise InputError(f"{where}: unknown key '{key}'", hint)
    prompt = obj.get("prompt", "")
    if not isinstance(prompt, str):
        raise InputError(f"{where}: prompt={prompt!r} must be a string", 'write "prompt": "Describe this image."')
    system = obj.get("system", default_system)
    if system is not None and not isinstance(system, str):
        raise InputError(f"{where}: system={system!r} must be a string", 'write "system": "You are ..."')
    rid = obj.get("id", str(position))
    if isinstance(rid, bool) or not isinstance(rid, str | int) or not str(rid).strip():
        raise InputError(f"{where}: id={rid!r} must be a non-empty string or an integer", 'write "id": "cat-1"')
    for single, plural in (("image", "images"), ("video", "videos")):
        if single in obj and plural in obj:
            raise InputError(f"{where}: both '{single}' and '{plural}' are given", f"list every file under '{plural}'")
    images = _paths(where, "image" if "image" in obj else "images", obj.get("image", obj.get("images", [])), base)
    videos = _paths(where, "video" if "video" in obj else "videos", obj.get("video", obj.get("videos", [])), base)
    return Request(
        id=str(rid).strip(),
        prompt=prompt.strip(),
        system=(system or "").strip() or None,
        images=images,
        videos=videos,
        source=where,
    )


_LINE_HINT = 'one JSON object per line, e.g. {"prompt": "Describe.", "images": ["a.jpg"]}'


def line_object(where: str, text: str, hint: str = _LINE_HINT) -> dict[str, Any]:
    """The JSON object on one batch-file line (``where`` is ``file:line``); InputError naming it otherwise."""
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})", hint) from None
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}", hint)
    return obj


def _line_request(
    where: str, text: str, base: Path, position: int, default_system: str | None, seen: dict[str, str]
) -> Request:
    """The request on one batch-file line; InputError naming ``file:line``."""
    obj = line_object(where, text)
    req = _one(where, obj, base, position, default_system)
    if req.id in seen:
        raise InputError(f"{where}: id '{req.id}' was already used at {seen[req.id]}", "give each request its own id")
    seen[req.id] = where
    return req


def parse_batch_file(
    path: str | Path, *, default_system: str | None = None, problems: list[InputError] | None = None
) -> list[Request]:
    """Requests from a JSONL file (see the module docstring); errors name ``file:line``.

    Every bad line is reported, not only the first: raised together, or appended to ``problems`` (then the
    good lines are returned, for the caller to check further and report everything at once)."""
    path = user_path(path, "batch file")
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise InputError(f"batch file {path} {what}", "pass a JSONL file with one request per line")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})", "save it as UTF-8 JSONL"
        ) from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})", "check the file permissions") from None
    base = path.parent
    requests: list[Request] = []
    seen: dict[str, str] = {}
    bad: list[InputError] = []  # every bad line, reported together
    position = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        position += 1
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
