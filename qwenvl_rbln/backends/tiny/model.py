"""A tiny Qwen3-VL with the real architecture and random weights, built entirely offline.

Why: every code path of qvl (processor, vision tower, deepstack, M-RoPE, generate) can be
exercised on a laptop CPU in seconds, without the hub and without multi-GB checkpoints.
The generated text is meaningless; a ``qvl_tiny_model.json`` marker in the directory says so,
so commands can warn the user.

This module is the directory: the marker, where the shared copy lives, the atomic write with its race and
full-disk handling, and the public API (``create_tiny_model``, ``ensure_tiny_model``, ``is_tiny_model``,
``describe``, ``build_or_reuse``). What goes into the directory comes from ``tiny.tokenizer`` (the BPE
tokenizer) and ``tiny.weights`` (config, processor, weights).

Heavy imports (torch, transformers, tokenizers) happen inside functions only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts.staging import non_empty_dir
from qwenvl_rbln.backends.tiny.tokenizer import VOCAB_SIZE
from qwenvl_rbln.backends.tiny.weights import write_checkpoint
from qwenvl_rbln.errors import BackendError, DependencyMissing, InputError
from qwenvl_rbln.paths import user_path
from qwenvl_rbln.planning.catalogue.modelinfo import tiny_model_dir

MARKER_FILE = "qvl_tiny_model.json"
MARKER_NOTE = "random weights; generated text is meaningless"
# Bump when the layout/dims change so cached copies from an older qvl are rebuilt.
FORMAT_VERSION = 1
DEFAULT_DIR_NAME = "tiny-qwen3-vl"


SHAPES = ("2b", "8b")  # 2b: tied head, ViT hidden = text hidden; 8b: untied head, a narrower ViT (tiny.untied)


def default_tiny_model_dir(moe: bool = False, shape: str = "2b") -> Path:
    """The shared tiny model location, so every command and test reuses one copy (one per variant)."""
    return tiny_model_dir(moe=moe, shape=shape)


def _check_variant(moe: bool, shape: str) -> None:
    if shape not in SHAPES:
        raise InputError(f"tiny model shape {shape!r} is not one of {', '.join(SHAPES)}", "pass --shape 2b or 8b")
    if moe and shape != "2b":
        raise InputError(
            f"a tiny model with --moe and --shape {shape} is not built (the tiny MoE has the 2b shape)",
            "pass --moe or --shape 8b, not both",
        )


def read_marker(path: Path) -> dict[str, Any] | None:
    """The tiny-model marker of ``path``, or None when ``path`` is not a qvl tiny model."""
    try:
        data = json.loads((Path(path) / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("qvl_tiny_model") is True else None


def is_tiny_model(path: Path) -> bool:
    """True when ``path`` was written by :func:`create_tiny_model` (so its output is meaningless)."""
    return read_marker(path) is not None


def _is_complete(path: Path, moe: bool = False, shape: str = "2b") -> bool:
    marker = read_marker(path)
    return (
        marker is not None
        and marker.get("format") == FORMAT_VERSION
        and bool(marker.get("moe", False)) == moe
        and marker.get("shape", "2b") == shape
        and (path / "config.json").is_file()
        and (path / "model.safetensors").is_file()
    )


def _require_heavy() -> None:
    missing = []
    for name in ("torch", "transformers", "tokenizers"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise DependencyMissing(
            f"the tiny model needs {', '.join(missing)}, which is not installed",
            "pip install torch torchvision transformers tokenizers",
        )


def _write_model(tmp: Path, seed: int, moe: bool = False, shape: str = "2b") -> None:
    """The model files, then the marker that says the weights are random; everything readable by others."""
    write_checkpoint(tmp, seed, moe=moe, shape=shape)
    marker = {
        "qvl_tiny_model": True,
        "seed": seed,
        "note": MARKER_NOTE,
        "format": FORMAT_VERSION,
        "dtype": "float32",
        "vocab_size": VOCAB_SIZE,
    }
    if moe:
        marker["moe"] = True  # Qwen3-VL-MoE (backends/tiny/moe.py)
    if shape != "2b":
        marker["shape"] = shape  # untied head, narrower ViT (backends/tiny/untied.py)
    (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    for f in tmp.iterdir():
        f.chmod(0o644)  # safetensors writes 0600; a shared cache should be readable by others


_WRITE_FAILED = {errno.ENOSPC, errno.EDQUOT, errno.EIO}


@contextlib.contextmanager
def _writing(target: Path):
    """An OSError while building the tiny model becomes one line naming the path (exit 2 for a place that
    cannot be written, exit 5 for a full disk or an I/O error); the temp directory is cleaned by the caller."""
    try:
        yield
    except OSError as exc:
        what = exc.strerror or type(exc).__name__
        where = exc.filename or target
        message = f"cannot write the tiny model to {target}: {what} ({where}); nothing half-written was left"
        if exc.errno in _WRITE_FAILED:
            raise BackendError(message, "free space on that filesystem, or pass another directory") from None
        raise InputError(message, "pass a directory you can write (qvl tiny-model DIR), or set QVL_HOME") from None
    except Exception as exc:
        if type(exc).__name__ != "SafetensorError":  # safetensors reports a full disk as its own error type
            raise
        detail = " ".join(str(exc).split())[:300]
        raise BackendError(
            f"cannot write the tiny model to {target}: {detail}; nothing half-written was left",
            "free space on that filesystem, or pass another directory",
        ) from None


def _raced(out_dir: Path) -> InputError:
    return InputError(
        f"tiny model target {out_dir} was created by another process while this one was writing",
        "use ensure_tiny_model() for shared locations, or pass overwrite=True (qvl tiny-model --force)",
    )


def create_tiny_model(
    out_dir: Path, *, seed: int = 0, overwrite: bool = False, moe: bool = False, shape: str = "2b"
) -> Path:
    """Write the tiny model to ``out_dir`` atomically (temp sibling + rename); return the path.

    Refuses to replace an existing non-empty directory unless ``overwrite``, so a typo never
    wipes a real checkpoint. ``moe`` / ``shape`` "8b": the MoE or the 8B-shaped variant.
    """
    _check_variant(moe, shape)
    out_dir = user_path(out_dir).absolute()
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"tiny model target {out_dir} exists and is not a directory", "pick another path")
    if non_empty_dir(out_dir) and not is_tiny_model(out_dir):  # --force replaces a tiny model, nothing else
        raise _not_a_tiny_model(out_dir)
    if non_empty_dir(out_dir) and not overwrite:
        raise InputError(
            f"tiny model target {out_dir} already holds a tiny model",
            "pass overwrite=True (qvl tiny-model --force) to replace it, or pick another directory",
        )
    _require_heavy()
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{tag}"
    old = out_dir.parent / f".{out_dir.name}.old-{tag}"
    with _writing(out_dir):
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(out_dir, tmp, old, seed, overwrite, moe, shape)
    return out_dir


def _write_atomically(
    out_dir: Path, tmp: Path, old: Path, seed: int, overwrite: bool, moe: bool = False, shape: str = "2b"
) -> None:
    """Build in ``tmp``, then swap it in (the old directory, if any, goes to ``old`` and is removed)."""
    try:
        tmp.mkdir()
        if moe:
            _write_model(tmp, seed, moe=True)
        elif shape != "2b":
            _write_model(tmp, seed, shape=shape)
        else:
            _write_model(tmp, seed)
        if out_dir.is_dir() and not non_empty_dir(out_dir):
            out_dir.rmdir()
        elif out_dir.exists():
            if not overwrite:  # appeared while we were writing
                raise _raced(out_dir)
            os.replace(out_dir, old)
        try:
            os.replace(tmp, out_dir)
        except OSError as exc:  # someone else's directory landed first
            if old.exists() and not out_dir.exists():
                os.replace(old, out_dir)  # put the previous one back
            raise _raced(out_dir) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def _not_a_tiny_model(target: Path) -> InputError:
    return InputError(
        f"{target} exists and is not a qvl tiny model; it was left untouched",
        "pass another directory, or remove that one yourself if you mean to",
    )


def ensure_tiny_model(path: Path | None = None, *, seed: int = 0, moe: bool = False, shape: str = "2b") -> Path:
    """Return a ready tiny model at ``path`` (default: :func:`default_tiny_model_dir`), creating it once.

    A file lock next to the directory serialises concurrent callers: the first builds it, the
    others wait and reuse the result. ``seed`` only matters when the model has to be built.
    """
    _check_variant(moe, shape)
    target = user_path(path).absolute() if path is not None else default_tiny_model_dir(moe, shape)
    if _is_complete(target, moe, shape):
        return target
    if non_empty_dir(target) and not is_tiny_model(target):
        raise _not_a_tiny_model(target)
    _require_heavy()  # building needs torch and transformers
    with _one_writer(target):
        if not _is_complete(target, moe, shape):
            if non_empty_dir(target) and not is_tiny_model(target):
                raise _not_a_tiny_model(target)
            # an older-format or half-written qvl tiny model is ours to replace
            create_tiny_model(target, seed=seed, overwrite=True, moe=moe, shape=shape)
    return target


def describe(path: Path) -> dict[str, Any]:
    """Files and sizes of a tiny model directory, for the CLI and reports."""
    path = Path(path)
    files = {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file()}
    return {
        "path": str(path),
        "marker": read_marker(path),
        "files": files,
        "total_bytes": sum(files.values()),
    }


@contextlib.contextmanager
def _one_writer(target: Path, notify: Any = None):
    """One writer per tiny model directory (a lock file beside it, for ``ensure_tiny_model`` and ``qvl tiny-model``
    alike); a second one says it waits (when ``notify`` is given), then waits."""
    from qwenvl_rbln.artifacts import flock

    lock = target.parent / f".{target.name}.lock"
    with _writing(target):
        target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = flock.take(lock)
    except flock.LockBusy:
        if notify is not None:
            notify(f"waiting for another process writing the tiny model in {target} ...")
        fd = flock.take(lock, blocking=True)
    try:
        yield
    finally:
        flock.release(fd)


def _reusable(target: Path, marker: dict[str, Any] | None, seed: int, moe: bool, shape: str = "2b") -> bool:
    """DIR already holds this seed's model of this variant (dense, MoE or 8B-shaped) in this format."""
    return (
        marker is not None
        and marker.get("seed") == seed
        and marker.get("format") == FORMAT_VERSION
        and bool(marker.get("moe", False)) == moe
        and marker.get("shape", "2b") == shape
        and (target / "model.safetensors").is_file()
    )


def build_or_reuse(
    directory: Path | None,
    *,
    seed: int = 0,
    force: bool = False,
    notify: Any = None,
    moe: bool = False,
    shape: str = "2b",
) -> dict[str, Any]:
    """`qvl tiny-model [--moe | --shape 8b]`: reuse DIR when it already holds this seed's model of this variant in this
    format (unless ``force``), else build it (``notify(line)`` hears that first); returns what was done, for the
    renderer."""
    import time

    _check_variant(moe, shape)
    default = default_tiny_model_dir(moe, shape)
    target = user_path(directory if directory is not None else default, "directory").absolute()
    marker = read_marker(target)
    reuse = not force and _reusable(target, marker, seed, moe, shape)
    start = time.perf_counter()
    if not reuse:
        with _one_writer(target, notify):  # parallel CI jobs: the second waits, then reuses the first's model
            marker = read_marker(target)
            reuse = not force and _reusable(target, marker, seed, moe, shape)
            if not reuse:
                if not force and marker is not None and non_empty_dir(target):
                    raise InputError(
                        f"{target} already holds a tiny model ({_variant_words(marker.get('moe'), marker.get('shape'))}"
                        f"seed {marker.get('seed')}, format {marker.get('format')}); this asks for "
                        f"{_variant_words(moe, shape)}seed {seed} "
                        f"(format {FORMAT_VERSION})",
                        "pass --force to replace it, or pick another directory",
                    )
                if notify is not None:
                    kind = "-MoE" if moe else " (8B shape: untied head, ViT hidden 48)" if shape == "8b" else ""
                    notify(f"building tiny Qwen3-VL{kind} in {target} ...")
                create_tiny_model(target, seed=seed, overwrite=force or marker is not None, moe=moe, shape=shape)
    info = describe(target)
    return {
        "path": str(target),
        "created": not reuse,
        "seed": seed,
        "moe": moe,
        "shape": shape,
        "seconds": round(time.perf_counter() - start, 3),
        "total_bytes": info["total_bytes"],
        "files": info["files"],
        "note": MARKER_NOTE,
    }


def _variant_words(moe: Any, shape: Any) -> str:
    """The words "MoE, " / "8b shape, " / "" for the refusal that names what DIR holds and what was asked for."""
    if moe:
        return "MoE, "
    return f"{shape} shape, " if shape and shape != "2b" else ""
