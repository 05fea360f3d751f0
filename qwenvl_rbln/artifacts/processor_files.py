"""The artifact's processor files carry the plan's pixel caps, so every loader of the directory runs what fits.

optimum-rbln's ``save_pretrained`` copies the checkpoint's processor files: an image ``size.longest_edge`` of
16,777,216 and a video budget of 25,165,824 over all frames, sizes the compiled ViT buckets cannot run. Anyone who
loads the artifact with ``AutoProcessor.from_pretrained(DIR)`` (optimum-rbln's examples, a script, vLLM) would get
them. ``qvl compile`` therefore writes the plan's caps into every processor file it finds:

* images (``processor_config.json`` ``image_processor``, ``preprocessor_config.json``): ``size`` (and the legacy
  ``min_pixels``/``max_pixels`` keys where the file has them: transformers lets them override ``size``);
* videos (``processor_config.json`` ``video_processor``, ``video_preprocessor_config.json``): ``size``, ``fps``,
  ``min_frames``, ``max_frames`` and ``qvl_max_frame_pixels``, the per-frame cap that qvl's resize applies
  (``vision/frame_cap.py``; transformers keeps the key as an attribute and ignores it otherwise).

``check`` is what ``load-check`` and ``serve``'s preflight ask: do the files agree with the compiled buckets (and with
the caps the manifest recorded)? Each problem names the file and the key. Plain JSON: no transformers import.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

FRAME_KEY = "qvl_max_frame_pixels"
# file -> (section inside it or None for the whole file, what it configures); a missing file is skipped
SECTIONS: tuple[tuple[str, str | None, str], ...] = (
    ("processor_config.json", "image_processor", "image"),
    ("processor_config.json", "video_processor", "video"),
    ("preprocessor_config.json", None, "image"),
    ("video_preprocessor_config.json", None, "video"),
)


def wanted(caps: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The keys each kind of processor section gets from a plan's ``ProcessorCaps.to_dict()``."""
    video: dict[str, Any] = {
        "size": {"shortest_edge": caps["video_min_pixels"], "longest_edge": caps["video_max_pixels"]},
        "fps": caps["fps"],
        "min_frames": caps["min_frames"],
        "max_frames": caps["max_frames"],
    }
    if caps.get("video_max_frame_pixels"):
        video[FRAME_KEY] = caps["video_max_frame_pixels"]
    return {
        "image": {"size": {"shortest_edge": caps["min_pixels"], "longest_edge": caps["max_pixels"]}},
        "video": video,
    }


Reader = Callable[[str], dict[str, Any] | None]
"""An artifact file by name as a JSON object, None when it is absent or not one: ``CheckedArtifact.read`` (each file
read once per command), else ``on_disk``."""


def on_disk(root: Path) -> Reader:
    return lambda name: _read(Path(root) / name)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def sections(
    root: Path, *, read: Reader | None = None
) -> list[tuple[str, str | None, str, dict[str, Any], dict[str, Any]]]:
    """(file, section, kind, the file's data, the section's dict) for every processor section present."""
    read = read or on_disk(root)
    out = []
    files: dict[str, dict[str, Any] | None] = {}  # one parsed copy per file: its sections are edited together
    for name, section, kind in SECTIONS:
        if name not in files:
            files[name] = read(name)
        data = files[name]
        if data is None:
            continue
        part = data.get(section) if section else data
        if section is None and kind == "image" and "video_processor_type" in data:
            kind = "video"  # an old layout keeping the video processor in preprocessor_config.json
        if isinstance(part, dict):
            out.append((name, section, kind, data, part))
    return out


def rehash(root: Path, files: dict[str, Any] | None, written: dict[str, Any]) -> dict[str, Any] | None:
    """A manifest's ``files`` table (None: hashed later) with the processor files just written hashed again."""
    from qwenvl_rbln.artifacts.manifest import sha256_file

    if files is None:
        return None
    out = dict(files)
    for name in {key.partition(":")[0] for key in written}:
        path = root / name
        out[name] = {**out.get(name, {}), "size": path.stat().st_size, "sha256": sha256_file(path)}
    return out


def edited(root: Path, caps: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """``caps`` applied to ``root``'s processor files in memory: ``({file[:section]: {key: value}}, {file: new
    data})``; nothing is written (``write_caps`` writes, ``qvl fix-processor`` stages the files first)."""
    keys = wanted(caps)
    written: dict[str, dict[str, Any]] = {}
    changed: dict[str, dict[str, Any]] = {}
    for name, section, kind, data, part in sections(root):
        values = dict(keys[kind])
        size = values["size"]
        for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            if part.get(key) is not None:  # a call-time or file min/max_pixels overrides size in transformers
                values[key] = size[edge]
        part.update(values)
        written[f"{name}:{section}" if section else name] = values
        changed[name] = data
    return written, changed


def write_caps(root: Path, caps: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Write ``caps`` into every processor file of ``root``; returns ``{file[:section]: {key: value}}`` written."""
    from qwenvl_rbln.artifacts.manifest import write_json_atomic

    written, changed = edited(root, caps)
    for name, data in changed.items():
        write_json_atomic(root / name, data)
    return written


def _number(value: Any) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def caps_for_buckets(root: Path, largest: int, patch_size: int, recorded: dict[str, Any] | None) -> dict[str, Any]:
    """The caps ``qvl fix-processor`` writes: the recorded ones (a qvl compile's plan) when the manifest has them,
    else the files' own values; either way images capped at ``largest`` x patch^2 and a per-frame video cap no
    higher (what ``qvl compile`` writes by default, so ``check`` is clean afterwards)."""
    cap = largest * patch_size**2
    if isinstance(recorded, dict) and all(_number(recorded.get(k)) for k in ("max_pixels", "video_max_pixels")):
        caps = dict(recorded)
    else:
        image: dict[str, Any] = {}
        video: dict[str, Any] = {}
        for _, _, kind, _, part in sections(root):
            (image if kind == "image" else video).setdefault("part", part)
        img, vid = image.get("part", {}), video.get("part", {})
        isize = img.get("size") if isinstance(img.get("size"), dict) else {}
        vsize = vid.get("size") if isinstance(vid.get("size"), dict) else {}
        caps = {
            "min_pixels": _number(img.get("min_pixels")) or _number(isize.get("shortest_edge")) or 65536,
            "max_pixels": _number(img.get("max_pixels")) or _number(isize.get("longest_edge")) or cap,
            "video_min_pixels": _number(vsize.get("shortest_edge")) or 4096,
            "video_max_pixels": _number(vsize.get("longest_edge")) or 25165824,
            "fps": _number(vid.get("fps")) or 2.0,
            "min_frames": _number(vid.get("min_frames")) or 4,
            "max_frames": _number(vid.get("max_frames")) or 768,
            "video_max_frame_pixels": _number(vid.get(FRAME_KEY)),
        }
    caps["max_pixels"] = min(caps["max_pixels"], cap)
    caps["min_pixels"] = min(caps["min_pixels"], caps["max_pixels"])
    caps["video_max_frame_pixels"] = min(caps.get("video_max_frame_pixels") or cap, cap)
    return caps


def findings(
    root: Path, buckets: list[int], patch_size: int, recorded: dict[str, Any] | None, *, read: Reader | None = None
) -> list[dict[str, Any]]:
    """``check``'s problems as data: file, section, key, value, what (``image`` | ``video`` | ``recorded``), the
    largest bucket and its pixel cap, and the one-line message (``check`` returns the messages)."""
    largest = max(buckets)
    cap = largest * patch_size**2
    keys = wanted(recorded) if isinstance(recorded, dict) and "video_max_pixels" in recorded else None
    found: list[dict[str, Any]] = []

    def add(name: str, section: str | None, what: str, key: str, value: Any, message: str, **more: Any) -> None:
        head = {"file": name, "section": section, "what": what, "key": key, "value": value}
        found.append({**head, "largest_bucket": largest, "cap_pixels": cap, **more, "message": message})

    for name, section, kind, _, part in sections(root, read=read):
        path = f"{section}." if section else ""  # a key's path inside the file: video_processor.size.longest_edge
        size = part.get("size") if isinstance(part.get("size"), dict) else {}
        longest = _number(part.get("max_pixels")) or _number(size.get("longest_edge"))
        key = "max_pixels" if _number(part.get("max_pixels")) else "size.longest_edge"
        if kind == "image" and longest is not None and longest > cap:
            add(
                name,
                section,
                "image",
                key,
                longest,
                f"{name} {path}{key}={longest} lets images exceed the "
                f"largest ViT bucket {largest} (needs <= {cap}); fix: `qvl fix-processor {root}`, or recompile "
                f"with qvl, or set it to {cap}",
                min_pixels=_number(size.get("shortest_edge")),
            )
        frame = _number(part.get(FRAME_KEY))
        if kind == "video" and longest is not None and longest > 2 * cap and (frame is None or frame > cap):
            budget = f"{path}{key}={longest}"
            shown = (
                f"{path}{FRAME_KEY}={frame} with {budget}"
                if frame is not None
                else f"has no {path}{FRAME_KEY} ({budget})"
            )
            add(
                name,
                section,
                "video",
                FRAME_KEY,
                frame,
                f"{name} {shown}: a "
                f"short video's frames can exceed the largest ViT bucket {largest} (needs {FRAME_KEY} <= {cap}); "
                f"fix: `qvl fix-processor {root}`, or recompile with qvl",
                budget=longest,
                min_pixels=_number(size.get("shortest_edge")),
                fps=_number(part.get("fps")),
            )
        for key, value in (keys or {}).get(kind, {}).items():
            if part.get(key) != value and not (key == "fps" and _number(part.get(key)) == value):
                add(
                    name,
                    section,
                    "recorded",
                    key,
                    part.get(key),
                    f"{name} {path}{key}={json.dumps(part.get(key))} "
                    f"differs from the caps the compile recorded ({json.dumps(value)}); fix: restore the file, "
                    f"`qvl fix-processor {root}`, or recompile",
                    recorded=value,
                )
    return found


def check(
    root: Path, buckets: list[int], patch_size: int, recorded: dict[str, Any] | None, *, read: Reader | None = None
) -> list[str]:
    """Problems of ``root``'s processor files against the largest compiled bucket and the recorded caps, each naming
    the file and the key (empty: consistent)."""
    return [f["message"] for f in findings(root, buckets, patch_size, recorded, read=read)]
