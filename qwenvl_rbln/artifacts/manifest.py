"""qvl-manifest.json and the hashing under it: an artifact's file names, provenance and per-file sha256.

The manifest is what every other part of ``artifacts`` checks against (the cache verifies entries with it,
``--force`` asks it which files an artifact owns, the layout check reports edits after compile), so it and the
hashing it rests on are one module that imports no other ``artifacts`` module.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import hashlib
import json
import os
import secrets
import socket
import stat
import sys
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.paths import user_path

MANIFEST_NAME = "qvl-manifest.json"
MANIFEST_FORMAT = 1
RBLN_CONFIG_NAME = "rbln_config.json"
TORCH_CONFIG_NAME = "qvl-rbln-config.json"
CHUNK = 1 << 20

# Versions recorded in the manifest and folded into the cache key: name -> distribution name.
VERSION_DISTS = {
    "qvl": "qwenvl-rbln",
    "optimum-rbln": "optimum-rbln",
    "rebel-compiler": "rebel-compiler",
    "transformers": "transformers",
    "torch": "torch",
}
NOT_INSTALLED = "not installed"


# --------------------------------------------------------------------------------------------- hashing


def sha256_file(path: Path, chunk: int = CHUNK) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def unsafe_relpath(rel: Any) -> bool:
    """True unless ``rel`` is a plain relative path inside a directory: no absolute path, no '..', no '~'.

    Names read from an artifact's own files (manifest entries, graph names, shard names) go through this
    before qvl stats, hashes or opens anything, so a hostile manifest cannot point qvl outside the artifact.
    """
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel or rel.startswith("~"):
        return True
    parts = rel.split("/")
    return rel.startswith("/") or any(part in ("", ".", "..") for part in parts)


def _is_hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in Path(rel).parts)


def list_files(root: Path, *, exclude: tuple[str, ...] = ()) -> list[str]:
    """Regular files under ``root`` (symlinks followed), as sorted POSIX relative paths; hidden ones skipped."""
    root = Path(root)
    found: list[str] = []
    walked: set[tuple[int, int]] = set()  # each real directory once: symlink loops (a -> ., b -> .) end here
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in walked:
            dirnames[:] = []
            continue
        walked.add((st.st_dev, st.st_ino))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if name.startswith("."):
                continue
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if rel in exclude or not full.is_file():
                continue
            found.append(rel)
    return sorted(found)


def tree_bytes(root: Path) -> int:
    """Bytes of the regular files below ``root``, hidden ones included, each file once: a hard link or a symlink to a
    file already counted adds nothing, a symlink to a file elsewhere counts that file (what a copy of the folder
    holds), and a file that vanishes mid-walk is skipped. The one folder size: ``qvl deploy`` sizes an artifact with
    it, the compile cache its entries."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def hash_tree(root: Path, *, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """sha256 per file (streamed) plus one digest over the sorted (relative path, size, file digest) list."""
    root = Path(root)
    files: dict[str, dict[str, Any]] = {}
    combined = hashlib.sha256()
    total = 0
    for rel in list_files(root, exclude=exclude):
        path = root / rel
        digest = sha256_file(path)
        size = path.stat().st_size
        files[rel] = {"sha256": digest, "size": size}
        total += size
        combined.update(f"{rel}\0{size}\0{digest}\n".encode())
    return {"sha256": combined.hexdigest(), "files": files, "file_count": len(files), "total_bytes": total}


def model_fingerprint(model_id: str, path: Path | None = None) -> dict[str, Any]:
    """Identity of the source model: a content hash of its local directory (``path``, else the directory the id
    names); a hub id without a local directory is reported as not hashed and is never downloaded."""
    from qwenvl_rbln.planning.catalogue.hub import snapshot_of_dir
    from qwenvl_rbln.planning.catalogue.modelinfo import resolve_model_path

    path = Path(path) if path is not None else resolve_model_path(model_id)
    if path is None:
        return {"id": model_id, "local_path": None, "sha256": None, "note": "hub id, not hashed"}
    path = user_path(path)
    if not path.is_dir():
        raise InputError(
            f"model directory {path} does not exist (from model={model_id!r})",
            "pass --model with an existing Hugging Face model directory, or a hub id",
        )
    tree = hash_tree(path)
    if not tree["files"]:
        raise InputError(f"model directory {path} has no files", "point --model at a Qwen3-VL model directory")
    out = {
        "id": model_id,
        "local_path": str(path.absolute()),
        "sha256": tree["sha256"],
        "file_count": tree["file_count"],
        "total_bytes": tree["total_bytes"],
        "note": "sha256 over sorted relative paths, sizes and file contents",
    }
    snap = snapshot_of_dir(path.absolute())
    if snap is not None:  # a hub id compiled from the local Hugging Face cache: which snapshot
        out["snapshot"] = {"repo_id": snap.repo_id, "revision": snap.revision}
    return out


# -------------------------------------------------------------------------------------------- versions


def collect_versions() -> dict[str, str]:
    """Installed versions from package metadata only (nothing heavy is imported)."""
    from importlib import metadata

    from qwenvl_rbln import __version__

    out: dict[str, str] = {}
    for name, dist in VERSION_DISTS.items():
        if name == "qvl":
            out[name] = __version__
            continue
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[name] = NOT_INSTALLED
    return out


# -------------------------------------------------------------------------------------------- manifest


def now() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


def manifest_for_plan(
    plan: Any,
    *,
    model: dict[str, Any],
    versions: dict[str, str],
    cache_key: str | None,
    timings: dict[str, float] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Provenance of an artifact (without the per-file hashes, which write_manifest adds)."""
    data = {
        "format": MANIFEST_FORMAT,
        "created_at": now(),
        "created_by": {"pid": os.getpid(), "host": socket.gethostname(), "argv": sys.argv[1:]},
        "backend": plan.backend,
        "preset": {
            "name": plan.preset,
            "path": plan.preset_path,
            "sha256": plan.preset_hash,
            "chain": list(plan.preset_chain),
        },
        "model": dict(model),
        "npu": plan.npu,
        "rbln_config": copy.deepcopy(plan.rbln_config),
        "load_rbln_config": copy.deepcopy(plan.load_rbln_config),
        "placement": copy.deepcopy(plan.placement),
        "resolved": plan.resolved.to_dict(),
        "processor": plan.processor.to_dict(),
        "runtime": copy.deepcopy(plan.runtime),
        "versions": dict(versions),
        "cache_key": cache_key,
        "timings": dict(timings or {}),
    }
    if extra:
        data.update(extra)
    return data


COMPILED_KEYS = (
    "batch_size",
    "max_seq_len",
    "attn_impl",
    "kvcache_partition_len",
    "kvcache_block_size",
    "kvcache_num_blocks",
    "prefill_chunk_size",
    "decoder_batch_sizes",
)


def compiled_values(artifact_dir: Path) -> dict[str, Any] | None:
    """What the backend resolved, read back from the artifact's own config: the numbers qvl's plan cannot know
    in advance (optimum-rbln's automatic ``kvcache_num_blocks``) next to the ones it asked for."""
    for name in (RBLN_CONFIG_NAME, TORCH_CONFIG_NAME):
        try:
            cfg = json.loads((Path(artifact_dir) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(cfg, dict):
            return None
        out = {k: cfg[k] for k in COMPILED_KEYS if k in cfg}
        visual = cfg.get("visual")
        if isinstance(visual, dict) and "max_seq_len" in visual:
            out["visual.max_seq_len"] = visual["max_seq_len"]
        return {"source": name, **out}
    return None


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.qvl-tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_manifest(artifact_dir: Path, manifest: dict[str, Any], *, files: dict[str, Any] | None = None) -> dict:
    """Hash every artifact file (unless ``files`` is given) and write qvl-manifest.json atomically."""
    artifact_dir = Path(artifact_dir)
    if files is None:
        tree = hash_tree(artifact_dir, exclude=(MANIFEST_NAME,))
        files, digest, total = tree["files"], tree["sha256"], tree["total_bytes"]
    else:
        combined = hashlib.sha256()
        for rel in sorted(files):
            combined.update(f"{rel}\0{files[rel]['size']}\0{files[rel]['sha256']}\n".encode())
        digest, total = combined.hexdigest(), sum(f["size"] for f in files.values())
    data = {**manifest, "artifact": {"sha256": digest, "file_count": len(files), "total_bytes": total}, "files": files}
    write_json_atomic(artifact_dir / MANIFEST_NAME, data)
    return data


def graph_hash(directory: Path, manifest: dict[str, Any] | None) -> str:
    """sha256 over the compiled graph files (relative path and sha256), from the manifest when it lists them: what
    a measurement of this artifact (qvl profile's timings, load-check's load time) is keyed by."""
    files = (manifest or {}).get("files") or {}
    rbln = sorted(r for r in files if str(r).endswith(".rbln")) if files else []
    digests = {r: files[r]["sha256"] for r in rbln} if rbln else {
        r: sha256_file(directory / r) for r in list_files(directory) if r.endswith(".rbln")}  # fmt: skip
    h = hashlib.sha256()
    for rel, digest in sorted(digests.items()):
        h.update(f"{rel}\0{digest}\n".encode())
    return h.hexdigest()


def read_manifest(artifact_dir: Path) -> dict[str, Any] | None:
    path = Path(artifact_dir) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        raw: bytes | OSError = path.read_bytes()
    except OSError as exc:
        raw = exc
    return manifest_object(path, raw)


def manifest_object(path: Path, raw: bytes | OSError) -> dict[str, Any]:
    """``read_manifest``'s table and refusals from bytes already read (or the error reading them raised)."""
    try:
        if isinstance(raw, OSError):
            raise raw
        data = json.loads(raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable manifest ({exc})", "recompile with `qvl compile --force`") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise InputError(f"{path}: not a qvl manifest (no 'files' table)", "recompile with `qvl compile --force`")
    return data


def verify_manifest(
    artifact_dir: Path, manifest: dict[str, Any], *, known: dict[str, tuple[int, str]] | None = None
) -> dict[str, Any]:
    """Compare the files on disk with the manifest: modified (size or sha256), missing, extra. ``known``: relative
    path -> (size, sha256) of files the caller read already (``CheckedArtifact``), compared without reading them
    again: the bytes it checked are the bytes it parsed."""
    artifact_dir = Path(artifact_dir)
    known = known or {}
    listed: dict[str, Any] = manifest.get("files") or {}
    if not isinstance(listed, dict):
        listed = {}
    unsafe = sorted(str(rel) for rel in listed if unsafe_relpath(rel))  # refused: never stat'ed, read or hashed
    listed = {rel: want for rel, want in listed.items() if not unsafe_relpath(rel)}
    present = set(list_files(artifact_dir, exclude=(MANIFEST_NAME,)))
    missing = sorted(set(listed) - present)
    extra = sorted(present - set(listed))
    modified = []
    for rel in sorted(set(listed) & present):
        want = listed[rel] if isinstance(listed[rel], dict) else {}
        path = artifact_dir / rel
        size, digest = known[rel] if rel in known else (path.stat().st_size, None)
        if size != want.get("size") or (digest or sha256_file(path)) != want.get("sha256"):
            modified.append(rel)
    return {
        "ok": not (missing or extra or modified or unsafe),
        "modified": modified,
        "missing": missing,
        "extra": extra,
        "unsafe": unsafe,
    }
