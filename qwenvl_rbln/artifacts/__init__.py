"""Artifact directories: hashing, the qvl manifest, atomic writes, locks, the compile cache, layout checks.

Everything here is plain Python (hashlib, json, os, filelock): no torch, transformers or optimum import,
so ``qvl load-check --no-runtime`` and the cache logic work on any host.

Layout of an optimum-rbln 0.12.0 Qwen3-VL artifact (what ``save_pretrained`` writes; see
``optimum/rbln/modeling.py:143-221`` and ``transformers/models/qwen3_vl/modeling_qwen3_vl.py:92-103``)::

    rbln_config.json  config.json  generation_config.json  torch_artifacts.pth
    prefill.rbln  decoder_batch_<N>.rbln (one per decoder_batch_sizes entry)
    <tokenizer and processor files>
    visual/compiled_model.rbln  visual/rbln_config.json  visual/config.json  visual/torch_artifacts.pth

qvl adds ``qvl-manifest.json`` (provenance + a sha256 per file). The torch backend writes a copy of the
Hugging Face model plus ``qvl-rbln-config.json`` (same shape as rbln_config.json) and the manifest.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import fnmatch
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import BusyError, InputError
from qwenvl_rbln.paths import user_path
from qwenvl_rbln.planning.resolved_lm import ResolvedLM

MANIFEST_NAME = "qvl-manifest.json"
MANIFEST_FORMAT = 1
RBLN_CONFIG_NAME = "rbln_config.json"
TORCH_CONFIG_NAME = "qvl-rbln-config.json"
CACHE_FORMAT = 1
CHUNK = 1 << 20
EXPECTED_OPTIMUM_RBLN = "0.12.0"
QWEN3_VL_CONFIG_CLS = "RBLNQwen3VLForConditionalGenerationConfig"

# Versions recorded in the manifest and folded into the cache key: name -> distribution name.
VERSION_DISTS = {
    "qvl": "qwenvl-rbln",
    "optimum-rbln": "optimum-rbln",
    "rebel-compiler": "rebel-compiler",
    "transformers": "transformers",
    "torch": "torch",
}
NOT_INSTALLED = "not installed"

# A file of the processor and one of the tokenizer must be present (transformers 5 saves
# processor_config.json; the Qwen hub repos ship preprocessor_config.json).
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


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
    from qwenvl_rbln.planning.modelinfo import resolve_model_path

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
    return {
        "id": model_id,
        "local_path": str(path.absolute()),
        "sha256": tree["sha256"],
        "file_count": tree["file_count"],
        "total_bytes": tree["total_bytes"],
        "note": "sha256 over sorted relative paths, sizes and file contents",
    }


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


def _now() -> str:
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
        "created_at": _now(),
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


def _write_json_atomic(path: Path, data: Any) -> None:
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
    _write_json_atomic(artifact_dir / MANIFEST_NAME, data)
    return data


def read_manifest(artifact_dir: Path) -> dict[str, Any] | None:
    path = Path(artifact_dir) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable manifest ({exc})", "recompile with `qvl compile --force`") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise InputError(f"{path}: not a qvl manifest (no 'files' table)", "recompile with `qvl compile --force`")
    return data


def verify_manifest(artifact_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Compare the files on disk with the manifest: modified (size or sha256), missing, extra."""
    artifact_dir = Path(artifact_dir)
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
        if path.stat().st_size != want.get("size") or sha256_file(path) != want.get("sha256"):
            modified.append(rel)
    return {
        "ok": not (missing or extra or modified or unsafe),
        "modified": modified,
        "missing": missing,
        "extra": extra,
        "unsafe": unsafe,
    }


# ------------------------------------------------------------------------------------- atomic directory

_TEMP_RE_TEMPLATE = r"^\.{name}\.qvl-(?:tmp|old)-(\d+)-[0-9a-f]+(?:\..*)?$"


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rmtree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def clean_stale_temp(target: Path) -> list[str]:
    """Remove temp/old siblings of ``target`` left by killed qvl processes (their pid is gone)."""
    target = Path(target)
    parent = target.parent
    if not parent.is_dir():
        return []
    pattern = re.compile(_TEMP_RE_TEMPLATE.format(name=re.escape(target.name)))
    removed = []
    for entry in parent.iterdir():
        m = pattern.match(entry.name)
        if m and not _pid_alive(int(m.group(1))):
            _rmtree(entry)
            removed.append(entry.name)
    return sorted(removed)


def _non_empty_dir(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def check_target(target: Path, force: bool) -> None:
    """The checks done before anything is written: a file in the way, or an existing artifact without --force."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise InputError(f"output {target} exists and is not a directory", "pass -o with a directory path")
    if not _non_empty_dir(target):
        return
    if not force:
        raise InputError(
            f"output directory {target} already exists and is not empty; it was left untouched",
            "pass --force to replace it (the old one is removed only after the new one is complete), or use -o",
        )
    refuse_to_replace_a_non_artifact(target)


def refuse_to_replace_a_non_artifact(target: Path) -> None:
    """``--force`` replaces a compiled artifact, never an arbitrary directory: a typo such as ``-o .`` or
    ``-o ~/thesis`` must not delete a user's files. An artifact is a directory whose qvl manifest lists every
    file in it, or (compiled without qvl) an optimum-rbln ``rbln_config.json`` beside nothing but the kinds of
    file optimum-rbln writes."""
    target = Path(target).absolute()
    cwd = Path.cwd().absolute()
    protected = {Path(target.anchor), Path.home().absolute(), cwd, *cwd.parents}
    if target in protected or target.resolve() in {p.resolve() for p in protected}:
        raise InputError(
            f"refusing to replace {target} with --force: it is the working directory, one of its parents, "
            "your home or the root; nothing was touched",
            "compile into a new directory with -o DIR",
        )
    if target.is_symlink():
        raise InputError(
            f"refusing to replace {target} with --force: it is a symlink (to {os.readlink(target)}); nothing was "
            "touched",
            "pass the directory it points to with -o, or a new directory",
        )
    why = _not_an_artifact(target)
    if why:
        raise InputError(
            f"refusing to replace {target} with --force: {why}; nothing was touched",
            "compile into a new directory with -o DIR, or move those files out (or remove the directory yourself)",
        )


# What optimum-rbln's save_pretrained writes (graphs, configs, tokenizer/processor files, host-side weights).
_OPTIMUM_FILE_PATTERNS = ("*.rbln", "*.json", "*.jinja", "*.pth", "merges.txt", "tokenizer.model")


def _all_files(root: Path) -> list[str]:
    """Every regular file below ``root``, hidden ones included (they are someone's files too)."""
    out = []
    for dirpath, _dirs, files in os.walk(root):
        out += [(Path(dirpath) / name).relative_to(root).as_posix() for name in files]
    return sorted(out)


def _not_an_artifact(target: Path) -> str | None:
    """None for a directory --force may replace, else why not (naming a few of the files that block it)."""
    present = [p for p in _all_files(target) if p != MANIFEST_NAME]
    try:
        manifest = read_manifest(target)
    except InputError:
        manifest = None
    if manifest is not None:
        foreign = [p for p in present if p not in manifest["files"]]
        if foreign:
            return f"it holds files its {MANIFEST_NAME} does not list ({_some(foreign)})"
        return None
    try:
        cfg = json.loads((target / RBLN_CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cfg = None
    if not isinstance(cfg, dict) or "cls_name" not in cfg:
        where = f"no qvl manifest or optimum-rbln {RBLN_CONFIG_NAME}"
        return f"it is not a compiled artifact ({where}; it holds {_some(present)})"
    foreign = [p for p in present if not any(fnmatch.fnmatch(Path(p).name, pat) for pat in _OPTIMUM_FILE_PATTERNS)]
    if foreign:
        return f"besides the optimum-rbln artifact it holds other files ({_some(foreign)})"
    return None


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "") if names else "nothing"


@contextlib.contextmanager
def atomic_output_dir(target: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``target``; on success rename it into place, on any failure delete it.

    ``target`` is never half-written: the staging directory ``.{name}.qvl-tmp-<pid>-<rand>`` lives beside
    it (same filesystem, so the final rename is atomic). With ``force`` an existing target is first
    renamed to ``.{name}.qvl-old-...`` and deleted only after the new one is in place; if the swap fails
    the old one is put back. Stale staging directories of killed processes are removed on entry.
    """
    target = user_path(target).absolute()
    check_target(target, force)
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temp(target)
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    staging = target.parent / f".{target.name}.qvl-tmp-{tag}"
    staging.mkdir()
    try:
        yield staging
        check_target(target, force)  # something may have appeared meanwhile
        old = target.parent / f".{target.name}.qvl-old-{tag}"
        moved_old = False
        if target.is_dir():
            if _non_empty_dir(target):
                os.rename(target, old)
                moved_old = True
            else:
                target.rmdir()
        try:
            os.rename(staging, target)
        except BaseException:
            if moved_old and not target.exists():
                os.rename(old, target)
            raise
        if moved_old:
            _rmtree(old)
    finally:
        if staging.exists():
            _rmtree(staging)
        # siblings that helpers derived from the staging name (e.g. optimum-rbln's "<dir>.tmp")
        for entry in target.parent.glob(f"{staging.name}.*"):
            _rmtree(entry)


# -------------------------------------------------------------------------------------------------- lock


# How long a second writer waits for the holder's owner record (the holder writes it right after taking the lock).
OWNER_RECORD_WAIT_S = 10.0


def lock_path(target: Path) -> Path:
    """The lock for ``target`` lives under ``$QVL_HOME/locks``, never beside the user's output directory.

    Unlinking a lock file is never safe while another process may be waiting on it, so the files are kept
    where they bother nobody: one small file per output directory ever compiled into.
    """
    from qwenvl_rbln.planning.modelinfo import qvl_home

    target = user_path(target).absolute()
    digest = hashlib.sha256(str(target).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", target.name)[:48] or "root"
    return qvl_home() / "locks" / f"{name}-{digest}.lock"


def _owner_path(target: Path) -> Path:
    lp = lock_path(target)
    return lp.with_name(lp.name + ".owner")


def lock_owner(target: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(_owner_path(target).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _live_owner(target: Path) -> dict[str, Any] | None:
    """The owner record, if it names a live process (a killed holder's stale record is not the holder)."""
    owner = lock_owner(target)
    if not owner or not isinstance(owner.get("pid"), int):
        return None
    if owner.get("host") not in (None, socket.gethostname()):
        return owner
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return None
    except OSError:
        pass  # alive, owned by another user
    return owner


def _busy(target: Path, lp: Path, owner: dict[str, Any] | None) -> BusyError:
    owner = owner or {}
    who = f"pid {owner['pid']}" if owner.get("pid") else "another process"
    if owner.get("host") and owner.get("host") != socket.gethostname():
        who += f" on {owner['host']}"
    since = f" since {owner['started']}" if owner.get("started") else ""
    return BusyError(
        f"output directory {target} is being written by {who}{since} (lock {lp})",
        "wait for that compile to finish, or compile into another directory with -o",
    )


def _acquire(lock: Any, target: Path, lp: Path) -> None:
    """Take the lock, or raise BusyError naming the holder.

    The holder writes its owner record just after it takes the lock, so a loser that arrives in between
    waits for that record (or for the lock to come free) instead of reporting "another process".
    """
    import time

    import filelock

    deadline = time.monotonic() + OWNER_RECORD_WAIT_S
    while True:
        try:
            lock.acquire(timeout=0)
            return
        except filelock.Timeout:
            owner = _live_owner(target)
            if owner is not None or time.monotonic() >= deadline:
                raise _busy(target, lp, owner) from None
        time.sleep(0.02)


@contextlib.contextmanager
def output_lock(target: Path) -> Iterator[Path]:
    """Non-blocking exclusive lock for ``target``; a second writer gets BusyError naming the holder."""
    import filelock

    target = user_path(target).absolute()
    lp = lock_path(target)
    try:
        lp.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"cannot create the lock directory {lp.parent}: {exc.strerror or exc}",
            "set QVL_HOME to a writable directory",
        ) from None
    lock = filelock.FileLock(str(lp), timeout=0)
    _acquire(lock, target, lp)
    owner_file = _owner_path(target)
    try:
        _write_json_atomic(
            owner_file,
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": _now(),
                "target": str(target),
                "argv": sys.argv[1:],
            },
        )
        yield lp
    finally:
        with contextlib.suppress(FileNotFoundError):
            owner_file.unlink()
        lock.release()


# ------------------------------------------------------------------------------------------------- cache


def default_cache_dir() -> Path:
    from qwenvl_rbln.planning.modelinfo import qvl_home

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
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32], None


def copy_tree(src: Path, dst: Path) -> None:
    """Copy the non-hidden files of ``src`` into ``dst`` (created if needed), keeping relative paths."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for rel in list_files(src):
        out = dst / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, out)
    if (src / MANIFEST_NAME).is_file():
        shutil.copy2(src / MANIFEST_NAME, dst / MANIFEST_NAME)


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
        _rmtree(entry)
        return None, "entry had no readable manifest; removed"
    check = verify_manifest(entry, manifest)
    if not check["ok"]:
        bad = (check["unsafe"] + check["modified"] + check["missing"] + check["extra"])[:3]
        aside = entry.parent / f".{key}.qvl-old-{os.getpid()}-{secrets.token_hex(4)}"
        with contextlib.suppress(OSError):
            os.rename(entry, aside)
            _rmtree(aside)
        return None, f"entry failed verification ({', '.join(bad)}); removed"
    return entry, "verified"


def cache_store(cache_dir: Path, key: str, src: Path) -> Path:
    """Copy ``src`` into ``cache_dir/key`` atomically (temp sibling + rename); an existing entry wins."""
    cache_dir = user_path(cache_dir).absolute()
    cache_dir.mkdir(parents=True, exist_ok=True)
    entry = cache_dir / key
    clean_stale_temp(entry)
    if entry.is_dir():
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
            _rmtree(tmp)
    return entry


# ---------------------------------------------------------------------------------------- artifact config


def artifact_kind(artifact_dir: Path) -> str | None:
    artifact_dir = Path(artifact_dir)
    if (artifact_dir / RBLN_CONFIG_NAME).is_file():
        return "rbln"
    if (artifact_dir / TORCH_CONFIG_NAME).is_file():
        return "torch"
    return None


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path} does not exist", "point at a directory written by `qvl compile`") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})", "recompile the artifact (`qvl compile --force`)") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}", "recompile the artifact")
    return data


def read_artifact_config(artifact_dir: Path) -> tuple[str, dict[str, Any]]:
    """(kind, config): rbln_config.json of an optimum-rbln artifact, or qvl-rbln-config.json of a torch one."""
    artifact_dir = user_path(artifact_dir)
    if not artifact_dir.is_dir():
        what = "is a file, not a directory" if artifact_dir.exists() else "does not exist"
        raise InputError(
            f"artifact directory {artifact_dir} {what}",
            "compile first (`qvl compile --preset P -o DIR`) or pass the directory it wrote",
        )
    kind = artifact_kind(artifact_dir)
    if kind is None:
        raise InputError(
            f"{artifact_dir} is not a compiled artifact (no {RBLN_CONFIG_NAME} or {TORCH_CONFIG_NAME})",
            "pass the directory `qvl compile` wrote (-o), or compile into it first",
        )
    name = RBLN_CONFIG_NAME if kind == "rbln" else TORCH_CONFIG_NAME
    cfg = read_json(artifact_dir / name)
    if "_meta" in cfg:
        raise InputError(
            f"{artifact_dir / name} is an old-format rbln_config.json (has _meta)",
            "recompile with optimum-rbln 0.12.0 (`qvl compile --force`)",
        )
    return kind, cfg


def _compile_cfgs(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    items = cfg.get("_compile_cfgs") or []
    return [c for c in items if isinstance(c, dict)]


def compile_target(cfg: dict[str, Any], manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """Target NPU and num_devices as compiled, read from ``_compile_cfgs`` (top-level npu is never saved)."""

    def one(section: dict[str, Any]) -> tuple[str | None, int | None, list[str]]:
        cfgs = _compile_cfgs(section)
        npus = sorted({c.get("npu") for c in cfgs if isinstance(c.get("npu"), str) and c.get("npu")})
        odd = [
            c.get("npu") for c in cfgs if c.get("npu") is not None and not (isinstance(c.get("npu"), str) and c["npu"])
        ]
        nds = sorted({c["num_devices"] for c in cfgs if type(c.get("num_devices")) is int and c["num_devices"] > 0})
        problems = []
        if len(npus) > 1:
            problems.append(f"graphs were compiled for different NPUs {npus}")
        if odd:
            problems.append(f"_compile_cfgs names an NPU that is not an SKU string ({odd[0]!r})")
        if len(nds) > 1:
            problems.append(f"graphs were compiled for different num_devices {nds}")
        return (npus[0] if npus else None), (nds[0] if nds else None), problems

    npu, nd, problems = one(cfg)
    visual = cfg.get("visual") if isinstance(cfg.get("visual"), dict) else {}
    vnpu, vnd, vproblems = one(visual)
    notes = []
    source = "_compile_cfgs"
    if npu is None and manifest and manifest.get("npu"):
        npu, source = manifest["npu"], "qvl-manifest.json (rbln_config.json has no npu in _compile_cfgs)"
    elif npu is None:
        notes.append("the artifact does not record its target NPU (compiled without an explicit npu)")
    return {
        "npu": npu,
        "num_devices": nd or 1,
        "visual_npu": vnpu or npu,
        "visual_num_devices": vnd or nd or 1,
        "source": source,
        "problems": problems + [f"visual: {p}" for p in vproblems],
        "notes": notes,
    }


def expected_graph_names(cfg: dict[str, Any]) -> list[str]:
    """optimum-rbln's ``expected_compiled_model_names`` (configuration_decoderonly.py:337-345)."""
    phases = cfg.get("phases") or ["prefill", "decode"]
    batch = cfg.get("batch_size") or 1
    dbs = cfg.get("decoder_batch_sizes") or [batch]
    if "decode" in phases:
        return list(phases[: phases.index("decode")]) + [f"decoder_batch_{b}" for b in dbs]
    return list(phases)


def resolved_from_rbln_config(cfg: dict[str, Any], *, source: str = RBLN_CONFIG_NAME) -> ResolvedLM:
    """ResolvedLM of a compiled rbln_config.json, for the NPU and num_devices it was compiled for."""
    return ResolvedLM.from_rbln_config(cfg, compile_target(cfg), source=source)


def placement_from_artifact(cfg: dict[str, Any], manifest: dict[str, Any] | None) -> dict[str, Any]:
    """The placement an artifact was planned for: qvl-manifest.json's, else device 0 (or 0..n-1) for both.

    rbln_config.json never stores devices (runtime options are not saved), so without a manifest this is the
    optimum-rbln default: every submodule on ``[0 .. num_devices-1]``.
    """
    if manifest and isinstance(manifest.get("placement"), dict) and "device" in manifest["placement"]:
        placement = manifest["placement"]
        return {
            "device": placement["device"],
            "visual_device": placement.get("visual_device", placement["device"]),
            "source": MANIFEST_NAME,
        }
    target = compile_target(cfg)

    def default(n: int) -> int | list[int]:
        return 0 if n <= 1 else list(range(n))

    return {
        "device": default(target["num_devices"]),
        "visual_device": default(target["visual_num_devices"]),
        "source": "optimum-rbln default (no qvl-manifest.json)",
    }


def unsafe_graph_names(cfg: dict[str, Any]) -> list[str]:
    """compiled_model_name values that are not plain file names (they would point outside the artifact)."""
    visual = cfg.get("visual") if isinstance(cfg.get("visual"), dict) else {}
    names = [c.get("compiled_model_name") for c in [*_compile_cfgs(cfg), *_compile_cfgs(visual)]]
    return [str(n) for n in names if n and (not isinstance(n, str) or unsafe_relpath(n) or "/" in n)]


def graph_files(cfg: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Compiled graph -> {"file": relative path, "submodule": "lm"|"visual"}, as optimum-rbln loads them.

    Graph names that are not plain file names are left out (``check_layout`` reports them)."""
    bad = set(unsafe_graph_names(cfg))
    names = [c.get("compiled_model_name") for c in _compile_cfgs(cfg) if c.get("compiled_model_name")]
    names = [n for n in names if str(n) not in bad] or [n for n in expected_graph_names(cfg) if str(n) not in bad]
    out = {name: {"file": f"{name}.rbln", "submodule": "lm"} for name in names}
    visual = cfg.get("visual") if isinstance(cfg.get("visual"), dict) else {}
    vnames = [c.get("compiled_model_name") for c in _compile_cfgs(visual) if c.get("compiled_model_name")]
    for name in [n for n in vnames if str(n) not in bad] or ["compiled_model"]:
        out[f"visual/{name}"] = {"file": f"visual/{name}.rbln", "submodule": "visual"}
    return out


def _group_missing(root: Path, group: tuple[str, ...]) -> str | None:
    return None if any((root / name).is_file() for name in group) else " or ".join(group)


def _torch_weight_files(root: Path) -> tuple[list[str], list[str]]:
    """(missing, present) weight files of a Hugging Face directory (shards listed by an index must exist)."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (root / index).is_file():
            try:
                data = json.loads((root / index).read_text(encoding="utf-8"))
                weight_map = (data.get("weight_map") if isinstance(data, dict) else None) or {}
                shards = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else None
            except (OSError, ValueError, TypeError):
                shards = None
            if shards is None or not all(isinstance(x, str) and not unsafe_relpath(x) for x in shards):
                return [f"{index} (unreadable, or a shard path outside the artifact)"], []
            return [s for s in shards if not (root / s).is_file()], [index, *shards]
    for single in ("model.safetensors", "pytorch_model.bin"):
        if (root / single).is_file():
            return [], [single]
    return ["model.safetensors (or sharded weights with an index)"], []


def check_layout(artifact_dir: Path, kind: str, cfg: dict[str, Any], manifest: dict[str, Any] | None) -> dict:
    """Files the loader needs, checked against the artifact's own config; manifest hashes when present."""
    root = Path(artifact_dir)
    missing: list[str] = []
    unexpected: list[str] = []
    problems: list[str] = []
    notes: list[str] = []
    expected: list[str] = []

    def need(rel: str) -> None:
        expected.append(rel)
        if not (root / rel).is_file():
            missing.append(rel)

    def need_group(group: tuple[str, ...]) -> None:
        expected.append(" or ".join(group))
        gap = _group_missing(root, group)
        if gap:
            missing.append(gap)

    if kind == "rbln":
        cls_name = cfg.get("cls_name")
        if cls_name != QWEN3_VL_CONFIG_CLS:
            problems.append(
                f"rbln_config.json cls_name={cls_name!r}, not {QWEN3_VL_CONFIG_CLS} (not a Qwen3-VL artifact)"
            )
        version = cfg.get("optimum_rbln_version")
        if version and version != EXPECTED_OPTIMUM_RBLN:
            notes.append(f"compiled with optimum-rbln {version}; qvl targets {EXPECTED_OPTIMUM_RBLN}")
        derived = expected_graph_names(cfg)
        listed = [c.get("compiled_model_name") for c in _compile_cfgs(cfg)]
        if not listed:
            problems.append("rbln_config.json has no _compile_cfgs (the artifact was never compiled)")
        elif listed != derived:
            problems.append(
                f"rbln_config.json: _compile_cfgs graphs {listed} do not match decoder_batch_sizes "
                f"{cfg.get('decoder_batch_sizes')} (expected {derived})"
            )
        if not isinstance(cfg.get("visual"), dict):
            problems.append("rbln_config.json has no 'visual' section (optimum-rbln: Submodule visual not found)")
        for name in unsafe_graph_names(cfg)[:4]:
            problems.append(f"rbln_config.json names the graph {name!r}, a path outside the artifact (refused)")
        graphs = graph_files(cfg)
        for info in graphs.values():
            need(info["file"])
        for rel in (RBLN_CONFIG_NAME, "config.json", "torch_artifacts.pth"):
            need(rel)
        for rel in ("visual/rbln_config.json", "visual/config.json", "visual/torch_artifacts.pth"):
            need(rel)
        need_group(PROCESSOR_FILES)
        need_group(TOKENIZER_FILES)
        wanted = {info["file"] for info in graphs.values()}
        for sub in ("", "visual/"):
            base = root / sub if sub else root
            if base.is_dir():
                for f in sorted(base.glob("*.rbln")):
                    rel = f"{sub}{f.name}"
                    if rel not in wanted:
                        unexpected.append(rel)
    else:
        graphs = {}
        for rel in ("config.json", TORCH_CONFIG_NAME, MANIFEST_NAME):
            need(rel)
        weights_missing, weights_present = _torch_weight_files(root)
        expected.extend(weights_present or ["model.safetensors"])
        missing.extend(weights_missing)
        need_group(PROCESSOR_FILES)
        need_group(TOKENIZER_FILES)
        for f in sorted(root.glob("*.rbln")):
            unexpected.append(f.name)

    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if ".qvl-tmp-" in entry.name or ".qvl-old-" in entry.name:
            unexpected.append(entry.name)

    manifest_check: dict[str, Any]
    modified: list[str] = []
    if manifest is None:
        manifest_check = {"present": False, "ok": None}
        if kind == "rbln":
            notes.append("no qvl-manifest.json (not compiled by qvl): edits after compile cannot be detected")
    else:
        verdict = verify_manifest(root, manifest)
        modified = verdict["modified"]
        manifest_check = {"present": True, **verdict}
        for rel in verdict["unsafe"][:4]:
            problems.append(f"{MANIFEST_NAME} lists {rel!r}, a path outside the artifact (refused, never read)")
        # files listed in the manifest that are gone are reported as missing too
        for rel in verdict["missing"]:
            if rel not in missing:
                missing.append(rel)
    ok = not (missing or unexpected or problems or modified)
    return {
        "ok": ok,
        "kind": kind,
        "missing": missing,
        "unexpected": unexpected,
        "modified": modified,
        "problems": problems,
        "notes": notes,
        "expected": expected,
        "graphs": graphs,
        "manifest": manifest_check,
    }


def describe_layout_problem(layout: dict[str, Any]) -> str:
    """One line naming the first problems of a failed layout check."""
    parts = []
    if layout["missing"]:
        missing = layout["missing"]  # "model.safetensors (or sharded ...)" already says "model.safetensors"
        missing = [m for m in missing if not any(o != m and o.startswith(f"{m} (") for o in missing)]
        parts.append("missing " + ", ".join(missing[:4]))
    if layout["modified"]:
        parts.append(
            "changed after compile (sha256 differs from qvl-manifest.json): " + ", ".join(layout["modified"][:4])
        )
    if layout["unexpected"]:
        parts.append("unexpected " + ", ".join(layout["unexpected"][:4]))
    parts.extend(layout["problems"][:2])
    return "; ".join(parts)


# --- the last compile: `qvl compile --preset P` then `qvl infer` / `qvl load-check` with no DIR ----------

LAST_COMPILE_NAME = "last-compile"  # a directory under $QVL_HOME: one record per working directory


def _last_compile_path(cwd: Path | None = None) -> Path:
    """The record of the last compile run from ``cwd`` (default: the working directory), so a default never
    crosses projects: `qvl load-check` in another folder does not check this folder's artifact."""
    import hashlib

    from qwenvl_rbln.planning.modelinfo import qvl_home

    where = str((cwd or Path.cwd()).absolute())
    key = hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return qvl_home() / LAST_COMPILE_NAME / f"{key}.json"


def record_last_compile(output_dir: Path, preset: str) -> None:
    """Remember where the latest compile from this working directory went, for commands without DIR or --preset."""
    path = _last_compile_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        record = {"cwd": str(Path.cwd().absolute()), "output_dir": str(Path(output_dir).absolute()), "preset": preset}
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
    except OSError:
        pass  # a convenience only: never fail a finished compile over it


def last_compile(*, require_dir: bool = True) -> dict[str, str] | None:
    """The latest compile from this working directory: {output_dir, preset}; with ``require_dir`` only while that
    directory still exists."""
    try:
        data = json.loads(_last_compile_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(data, dict) and isinstance(data.get("output_dir"), str) and isinstance(data.get("preset"), str)):
        return None
    if data.get("cwd") != str(Path.cwd().absolute()):  # a hash collision, or a record written by hand
        return None
    if require_dir and not Path(data["output_dir"]).is_dir():
        return None
    return {"output_dir": data["output_dir"], "preset": data["preset"]}
