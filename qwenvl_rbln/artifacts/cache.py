"""The compile cache: artifacts keyed by everything that decides their bytes, verified by their manifest on reuse.

Its own module because it is the only part that keeps artifacts qvl did not just write: an entry is looked up,
verified against its manifest (a corrupted one is removed) and stored atomically beside the others.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts.cache_admin import touch
from qwenvl_rbln.artifacts.manifest import (
    MANIFEST_NAME,
    NOT_INSTALLED,
    VERSION_DISTS,
    list_files,
    read_manifest,
    verify_manifest,
)
from qwenvl_rbln.artifacts.staging import clean_stale_temp, rmtree
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.paths import user_path

CACHE_FORMAT = 1


def default_cache_dir() -> Path:
    from qwenvl_rbln.planning.catalogue.modelinfo import qvl_home

    return qvl_home() / "compile-cache"


def cache_key(plan: Any, model: dict[str, Any], versions: dict[str, str]) -> tuple[str | None, str | None]:
    """(key, None), or (None, reason) when the inputs cannot be pinned (a hub id is never hashed)."""
    from qwenvl_rbln.planning.plan import strip_runtime_keys

    if not model.get("sha256"):
        return None, f"model {model.get('id')!r} is a hub id, not hashed: pass --model DIR to use the compile cache"
    payload = {
        "format": CACHE_FORMAT,
        "backend": plan.backend,
        "model_sha256": model["sha256"],
        "rbln_config": strip_runtime_keys(plan.rbln_config),
        "npu": plan.npu,
        "versions": {name: versions.get(name, NOT_INSTALLED) for name in VERSION_DISTS},
    }
    if model.get("snapshot"):  # a hub id's cached snapshot: its revision is part of the key
        payload["model_snapshot"] = model["snapshot"]
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32], None


def _link_or_copy(src: Path, dst: Path) -> bool:
    """A hard link (the bytes stored once) where the file system allows one, else a copy; True when linked."""
    try:
        os.link(src, dst)
        return True
    except OSError:  # another file system (EXDEV), no hard links (EPERM), too many links (EMLINK)
        shutil.copy2(src, dst)
        return False


def copy_tree(src: Path, dst: Path) -> dict[str, int]:
    """The non-hidden files of ``src`` into ``dst`` (created if needed), keeping relative paths: hard links where
    possible, copies otherwise. The manifest is always copied: qvl rewrites it per artifact (atomically, never in
    place, so a linked file is never written through). Verified on every reuse (``cache_lookup``)."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    counts = {"linked": 0, "copied": 0}
    for rel in list_files(src):
        out = dst / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if rel != MANIFEST_NAME and _link_or_copy(src / rel, out):
            counts["linked"] += 1
        else:
            if rel == MANIFEST_NAME:
                shutil.copy2(src / rel, out)
            counts["copied"] += 1
    if (src / MANIFEST_NAME).is_file() and not (dst / MANIFEST_NAME).exists():
        shutil.copy2(src / MANIFEST_NAME, dst / MANIFEST_NAME)
    return counts


def cache_lookup(cache_dir: Path, key: str) -> tuple[Path | None, str]:
    """A verified cache entry, or (None, why not). A corrupted entry is removed."""
    entry = Path(cache_dir) / key
    if not entry.is_dir():
        return None, "no entry"
    try:
        manifest = read_manifest(entry)
    except InputError:
        manifest = None
    if manifest is None:
        rmtree(entry)
        return None, "entry had no readable manifest; removed"
    check = verify_manifest(entry, manifest)
    if not check["ok"]:
        bad = (check["unsafe"] + check["modified"] + check["missing"] + check["extra"])[:3]
        aside = entry.parent / f".{key}.qvl-old-{os.getpid()}-{secrets.token_hex(4)}"
        with contextlib.suppress(OSError):
            os.rename(entry, aside)
            rmtree(aside)
        return None, f"entry failed verification ({', '.join(bad)}); removed"
    touch(entry)
    return entry, "verified"


def cache_store(cache_dir: Path, key: str, src: Path) -> Path:
    """Copy ``src`` into ``cache_dir/key`` atomically (temp sibling + rename); an existing entry wins."""
    cache_dir = user_path(cache_dir).absolute()
    cache_dir.mkdir(parents=True, exist_ok=True)
    entry = cache_dir / key
    clean_stale_temp(entry)
    if entry.is_dir():
        touch(entry)
        return entry
    tmp = cache_dir / f".{key}.qvl-tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        copy_tree(src, tmp)
        try:
            os.rename(tmp, entry)
        except OSError:
            if not entry.is_dir():
                raise
    finally:
        if tmp.exists():
            rmtree(tmp)
    touch(entry)
    return entry
