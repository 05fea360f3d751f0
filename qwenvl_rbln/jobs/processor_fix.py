"""Processor files that let inputs past the compiled ViT buckets: what fails (load-check's warnings), and the fix.

An artifact saved by plain optimum-rbln or the product document's scripts carries the checkpoint's processor files:
an image ``size.longest_edge`` of 16,777,216 and a video budget of 25,165,824 over all frames with no per-frame cap.
The graphs load and run every input that fits the largest bucket, so ``qvl load-check`` reports the rest as a
warning naming the file, the key and the inputs that would fail, not as a broken artifact.

``fix_processor`` (``qvl fix-processor DIR``) rewrites those files to the compiled buckets. Everything is staged in a
hidden directory inside the artifact first (the new files, a copy of each old file, the manifest), then moved into
place: the copies become ``NAME.orig`` beside the files (an existing backup is never replaced: the next free
``NAME.orig-N`` is used), and a failure while moving puts the old files back. A manifest that hashes these files is
rewritten with the new hashes, the backups and the caps, so load-check stays clean afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts.layout import vit_buckets_and_patch
from qwenvl_rbln.artifacts.processor_files import Reader, on_disk
from qwenvl_rbln.errors import InputError

EXAMPLE_IMAGE = (4000, 3000)  # a 12 MP photo
EXAMPLE_VIDEO = (3840, 2160)  # a 4K frame
BACKUP_SUFFIX = ".orig"


def _image_inputs(found: dict[str, Any]) -> str:
    """Which images fail under the file's cap, with a photo's numbers as the example."""
    from qwenvl_rbln.vision.geometry import image_geometry

    cap, largest, allowed = found["cap_pixels"], found["largest_bucket"], found["value"]
    side = int(cap**0.5) // 32 * 32
    text = f"images resized above {cap:,} px (larger than about {side}x{side}) fail in the ViT"
    width, height = EXAMPLE_IMAGE
    try:
        geo = image_geometry(
            width, height, min_pixels=min(found.get("min_pixels") or 65536, allowed), max_pixels=allowed
        )
    except InputError:
        return text
    if geo.patches > largest:
        text += (
            f": a {width}x{height} photo becomes {geo.resized_width}x{geo.resized_height}, {geo.patches:,} patches "
            f"> bucket {largest:,}"
        )
    return text


def _video_inputs(found: dict[str, Any]) -> str:
    """Which videos fail with no per-frame cap: the short ones (few sampled frames) with large frames."""
    from qwenvl_rbln.vision.geometry import video_smart_resize

    cap, largest, budget = found["cap_pixels"], found["largest_bucket"], found["budget"]
    worst = [t for t in range(2, 64) if budget / min(t, round(t / 2) * 2) > cap]
    if not worst:
        return f"videos whose frames exceed {cap:,} px may fail in the ViT"
    frames = max(worst)
    fps = found.get("fps") or 2
    text = (
        f"videos sampled to {frames} frames or fewer (at fps {fps:g}: clips up to about {frames / fps:g} s) whose "
        f"frames exceed {cap:,} px fail in the ViT"
    )
    width, height = EXAMPLE_VIDEO
    h, w = video_smart_resize(
        min(4, frames), height, width, min_pixels=found.get("min_pixels") or 4096, max_pixels=budget
    )
    patches = (h // 16) * (w // 16)
    if patches > largest:
        text += f": a {min(4, frames)}-frame {width}x{height} clip becomes {patches:,} patches per temporal patch"
    return text


VIDEO_CLASS_SOURCES = (  # where transformers 5.15.1 reads the video processor config from, first found wins
    ("processor_config.json", "video_processor"),
    ("video_preprocessor_config.json", None),
    ("preprocessor_config.json", None),
)
DEFAULT_VIDEO_CLASS = "Qwen3VLVideoProcessor"  # the qwen3_vl / qwen3_vl_moe model type's video processor


def _known_video_class(name: str) -> str | None:
    """``name`` when transformers has that video processor class (None: it has not). Without transformers here,
    a name shaped like one (``...VideoProcessor``) counts; ``...VideoProcessorFast`` (inferred from a fast image
    processor) has no video class in transformers 5, so it falls through as there."""
    try:
        from transformers.models.auto.video_processing_auto import video_processor_class_from_name
    except Exception:  # noqa: BLE001 - no (working) transformers: judge the name's shape
        return name if name.endswith("VideoProcessor") else None
    return name if video_processor_class_from_name(name) is not None else None


def video_processor_class(root: Path, *, read: Reader | None = None) -> dict[str, Any]:
    """The video processor class ``AutoVideoProcessor.from_pretrained(root)`` loads, as transformers 5.15.1 resolves
    it (``models/auto/video_processing_auto.py``): the config is ``processor_config.json``'s ``video_processor``
    section, else ``video_preprocessor_config.json``, else ``preprocessor_config.json``; the class is its
    ``video_processor_type``, else its ``image_processor_type`` with ImageProcessor -> VideoProcessor when such a
    class exists (a checkpoint without a video processor config: ``Qwen2VLVideoProcessor``), else the model type's
    (``Qwen3VLVideoProcessor``). Returns ``{"cls", "file", "section", "key", "value", "supported"}`` (``file``,
    ``key``, ``value`` None for the model type's default); ``supported``: qvl's per-frame cap patches that class
    (``vision.frame_cap.FAMILIES``, the one list). ``read``: the files as already read (``CheckedArtifact.read``)."""
    from qwenvl_rbln.vision.frame_cap import FAMILIES

    read = read or on_disk(root)

    def found(cls: str, file: str | None = None, section: str | None = None, key: str | None = None, value: Any = None):
        head = {"cls": cls, "file": file, "section": section, "key": key, "value": value}
        return {**head, "supported": cls in FAMILIES}

    for name, section in VIDEO_CLASS_SOURCES:
        data = read(name)
        part = data.get(section) if data is not None and section else data
        if not isinstance(part, dict):
            continue
        named = part.get("video_processor_type")
        if isinstance(named, str):
            return found(named, name, section, "video_processor_type", named)
        image = part.get("image_processor_type")
        if isinstance(image, str):
            inferred = image.replace("ImageProcessor", "VideoProcessor")
            if inferred in FAMILIES or _known_video_class(inferred) is not None:
                return found(inferred, name, section, "image_processor_type", image)
        break
    named = (read("config.json") or {}).get("video_processor_type")
    if isinstance(named, str):
        return found(named, "config.json", None, "video_processor_type", named)
    return found(DEFAULT_VIDEO_CLASS)


def video_class_problem(
    root: Path, resolved: dict[str, Any] | None = None, *, read: Reader | None = None
) -> dict[str, Any] | None:
    """A video processor class qvl's per-frame cap does not patch, with the one-line message and its fix (None:
    supported). ``qvl infer`` refuses it before a model loads; ``qvl serve`` refuses it; load-check warns.
    ``resolved``: ``video_processor_class(root)`` when the caller has it already."""
    from qwenvl_rbln.vision.frame_cap import FAMILIES

    resolved = resolved or video_processor_class(root, read=read)
    if resolved["supported"]:
        return None
    cls, file, section, key = resolved["cls"], resolved["file"], resolved["section"], resolved["key"]
    fix = (
        f'set "video_processor_type": "{DEFAULT_VIDEO_CLASS}" in {root / file}'
        + (f" (its {section} section)" if section else "")
        + ", as the original Qwen3-VL checkpoint has, or recompile with `qvl compile --preset P -o DIR --force`"
    )
    message = (
        f"{root / file}: {section + '.' if section else ''}{key}={resolved['value']!r} loads the video processor "
        f"{cls}, but qvl's per-frame video cap patches only {' and '.join(FAMILIES)}: its frames would reach the "
        "ViT uncapped and qvl's bucket prediction does not hold for it"
    )
    return {"file": file, "section": section, "what": "video_class", "key": key, "value": resolved["value"]} | {
        "cls": cls,
        "message": message,
        "fix": fix,
    }


def processor_warnings(
    root: Path, cfg: dict[str, Any], manifest: dict[str, Any] | None, *, read: Reader | None = None
) -> list[dict[str, Any]]:
    """``processor_files.findings`` with ``inputs`` (what would fail) and ``warning`` (the one line to show), and
    a video processor class qvl cannot cap (``video_class_problem``)."""
    from qwenvl_rbln.artifacts.processor_files import findings

    found = vit_buckets_and_patch(root, cfg, read=read)
    if found is None:
        return []
    out = []
    problem = video_class_problem(root, read=read)
    if problem is not None:
        out.append({**problem, "inputs": None, "warning": f"{problem['message']}; fix: {problem['fix']}"})
    for item in findings(root, found[0], found[1], (manifest or {}).get("processor"), read=read):
        inputs = {"image": _image_inputs, "video": _video_inputs}.get(item["what"], lambda _: None)(item)
        head, _, fix = item["message"].partition("; fix: ")
        warning = f"{head}; {inputs}" if inputs else head
        out.append({**item, "inputs": inputs, "warning": f"{warning}; fix: {fix}" if fix else warning})
    return out


def processor_part(
    root: Path, kind: str, cfg: dict[str, Any], manifest: dict[str, Any] | None, *, read: Reader | None = None
) -> dict[str, Any]:
    """The processor files against the compiled buckets: warnings (file, key, the inputs that would fail), since
    the graphs load and run every input that fits; ``--strict`` turns them into exit 2."""
    found = processor_warnings(root, cfg, manifest, read=read) if kind == "rbln" else []
    return {
        "ok": not found,
        "warnings": [f["warning"] for f in found],
        "findings": found,
        "fix": _fix_of(root, found),
        "fix_line": _fix_line(root, found),
    }


def _fix_of(root: Path, found: list[dict[str, Any]]) -> str | None:
    """``qvl fix-processor DIR`` for the caps; a video processor class it does not change needs its own edit."""
    if any(f["what"] != "video_class" for f in found):
        return f"qvl fix-processor {root}"
    return found[0]["fix"] if found else None


def _fix_line(root: Path, found: list[dict[str, Any]]) -> str | None:
    """What the verdict line says fixes the warnings, when `qvl fix-processor` alone does not (None: it does)."""
    classes = [f for f in found if f["what"] == "video_class"]
    if not classes:
        return None
    caps = f"`qvl fix-processor {root}` fixes the caps; " if len(classes) < len(found) else ""
    return f"{caps}{classes[0]['fix']}"


def strict_error(root: Path, processor: dict[str, Any]) -> InputError:
    count = len(processor["warnings"])
    return InputError(
        f"{root}: --strict: {count} processor-file warning{'s' * (count != 1)}: "
        + processor["warnings"][0].partition("; fix: ")[0],
        f"{processor.get('fix_line') or f'`qvl fix-processor {root}` rewrites them to the compiled buckets'} "
        "(or drop --strict)",
    )


# --------------------------------------------------------------------------------------------------- the fix


def _backup_name(root: Path, name: str) -> str:
    """``NAME.orig``, else the next free ``NAME.orig-N``: an existing backup is never replaced."""
    candidate, n = f"{name}{BACKUP_SUFFIX}", 1
    while (root / candidate).exists():
        n += 1
        candidate = f"{name}{BACKUP_SUFFIX}-{n}"
    return candidate


_ABSENT = object()  # a key the old file did not have (not the same as a key set to null)


def _key_changes(before: Any, after: Any, prefix: str = "") -> tuple[dict[str, list[Any]], list[str]]:
    """(``{dotted.key: [old, new]}`` for every key whose value differs, the keys the old file did not have; their
    old value is null in the first)."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: dict[str, list[Any]] = {}
        added: list[str] = []
        for key in after:
            changed, new_keys = _key_changes(before.get(key, _ABSENT), after[key], f"{prefix}{key}.")
            out.update(changed)
            added += new_keys
        return out, added
    key = prefix.rstrip(".")
    if before is _ABSENT:
        return {key: [None, after]}, [key]
    return ({}, []) if before == after else ({key: [before, after]}, [])


def plan_fix(root: Path) -> dict[str, Any]:
    """What ``fix_processor`` would write: the caps, each file's key changes and backup name; nothing written."""
    from qwenvl_rbln.artifacts.layout import read_artifact_config, read_json_quiet
    from qwenvl_rbln.artifacts.manifest import read_manifest
    from qwenvl_rbln.artifacts.processor_files import caps_for_buckets, edited

    kind, cfg = read_artifact_config(root)
    found = vit_buckets_and_patch(root, cfg) if kind == "rbln" else None
    if found is None:
        raise InputError(
            f"{root}: a {kind}-backend artifact has no compiled ViT buckets, so its processor files need no caps",
            "nothing to fix; `qvl fix-processor` is for NPU (rbln) artifacts",
        )
    manifest = read_manifest(root)
    warnings = processor_warnings(root, cfg, manifest)
    caps = caps_for_buckets(root, max(found[0]), found[1], (manifest or {}).get("processor"))
    files: list[dict[str, Any]] = []
    written: dict[str, Any] = {}
    if warnings:
        written, changed = edited(root, caps)
        for name, data in changed.items():
            keys, added = _key_changes(read_json_quiet(root / name) or {}, data)
            if keys:
                entry = {"file": name, "backup": _backup_name(root, name), "keys": keys, "added": added}
                files.append({**entry, "data": data})
    return {
        "artifact_dir": str(root),
        "caps": caps,
        "warnings": [w["warning"] for w in warnings],
        "files": files,
        "written": written,
        "manifest": manifest,
    }


def _new_manifest(root: Path, stage: Path, plan: dict[str, Any]) -> Path | None:
    """The manifest with the new files' and backups' hashes and the caps, written into ``stage`` (None: none)."""
    from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME, now, write_manifest
    from qwenvl_rbln.artifacts.processor_files import rehash
    from qwenvl_rbln.jobs.load_check_fixes import recompile_command

    manifest = plan["manifest"]
    if manifest is None:
        return None
    files = dict(manifest.get("files") or {})
    if not all(
        isinstance(f, dict) and type(f.get("size")) is int and isinstance(f.get("sha256"), str) for f in files.values()
    ):
        raise InputError(
            f"{root / MANIFEST_NAME}: damaged (a files entry without an integer size and a sha256); not rewritten",
            f"`qvl load-check {root}` names the problem; recompile with `{recompile_command(root, manifest)}`",
        )
    staged = [name for entry in plan["files"] for name in (entry["file"], entry["backup"])]
    files = rehash(stage, files, dict.fromkeys(staged)) or {}  # the new files and the backups, as staged
    body = {k: v for k, v in manifest.items() if k not in ("artifact", "files")}
    fixes = list(body.get("processor_fixes") or [])
    fixes.append({"at": now(), "backups": {e["file"]: e["backup"] for e in plan["files"]}, "caps": plan["caps"]})
    body.update(processor=plan["caps"], processor_files=plan["written"], processor_fixes=fixes)
    write_manifest(stage, body, files=files)
    return stage / MANIFEST_NAME


def _commit(root: Path, stage: Path, plan: dict[str, Any], manifest: Path | None) -> None:
    """Move the staged backups, files and manifest into place; any failure puts the old files back."""
    from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME

    linked: list[Path] = []
    replaced: list[str] = []
    try:
        for entry in plan["files"]:
            os.link(stage / entry["backup"], root / entry["backup"])  # fails if it exists: never replaced
            linked.append(root / entry["backup"])
        for entry in plan["files"]:
            os.replace(stage / entry["file"], root / entry["file"])
            replaced.append(entry["file"])
        if manifest is not None:
            os.replace(manifest, root / MANIFEST_NAME)
    except BaseException:
        for entry in plan["files"]:
            if entry["file"] in replaced:
                with contextlib.suppress(OSError):
                    os.replace(stage / entry["backup"], root / entry["file"])
        for path in linked:
            with contextlib.suppress(OSError):
                path.unlink()
        raise


def fix_processor(directory: Path, *, dry_run: bool = False) -> dict[str, Any]:
    """Rewrite ``directory``'s processor files to its compiled buckets (backups beside them); the report as data."""
    from qwenvl_rbln.artifacts.locks import output_lock
    from qwenvl_rbln.paths import user_path

    root = user_path(directory).absolute()
    with contextlib.ExitStack() as stack:
        if not dry_run:
            stack.enter_context(output_lock(root))  # no compile --force or second fix meanwhile
        plan = plan_fix(root)
        if plan["files"] and not dry_run:
            try:
                stage = Path(tempfile.mkdtemp(prefix=".qvl-tmp-fix-", dir=root))
                stack.callback(shutil.rmtree, stage, True)
                for entry in plan["files"]:
                    shutil.copy2(root / entry["file"], stage / entry["backup"])
                    text = json.dumps(entry["data"], indent=2, default=str) + "\n"
                    (stage / entry["file"]).write_text(text, encoding="utf-8")
                _commit(root, stage, plan, _new_manifest(root, stage, plan))
            except OSError as exc:
                raise InputError(
                    f"{root}: cannot write the new processor files ({exc.strerror or exc}); nothing was changed",
                    "make the artifact directory writable, then run `qvl fix-processor` again",
                ) from None
    return {
        "artifact_dir": plan["artifact_dir"],
        "dry_run": dry_run,
        "changed": bool(plan["files"]) and not dry_run,
        "caps": plan["caps"],
        "warnings_before": plan["warnings"],
        "files": [{k: v for k, v in e.items() if k != "data"} for e in plan["files"]],
        "manifest": "none" if plan["manifest"] is None else ("rehashed" if plan["files"] else "unchanged"),
    }
