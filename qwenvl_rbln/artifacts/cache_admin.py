"""The managed compile cache: list entries, prune by age or total size (least recently used first), remove one,
and keep the cache under ``QVL_CACHE_MAX_SIZE``; an entry a compile is using is never touched.

Its own module because managing entries is apart from finding and storing one (``artifacts.cache``). An entry in
use holds a shared lock (``entry_in_use``); prune and rm take the exclusive one without waiting and skip an entry
they cannot get. Last use is the entry directory's mtime, set on every store and hit.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts import flock
from qwenvl_rbln.artifacts.manifest import read_manifest, tree_bytes
from qwenvl_rbln.artifacts.staging import rmtree
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.catalogue.devices import parse_byte_size

MAX_SIZE_ENV = "QVL_CACHE_MAX_SIZE"
KEY_RE = re.compile(r"^[0-9a-f]{32}$")
DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _lock(cache_dir: Path, key: str) -> Path:
    """Beside the output locks under ``$QVL_HOME/locks`` (never inside the cache), one per cache dir and key."""
    import hashlib

    from qwenvl_rbln.planning.catalogue.modelinfo import qvl_home

    where = hashlib.sha256(str(Path(cache_dir).absolute()).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return qvl_home() / "locks" / f"cache-{key}-{where}.lock"


@contextlib.contextmanager
def entry_in_use(cache_dir: Path, key: str) -> Iterator[None]:
    """Held while a compile looks an entry up and links or copies it: prune and rm leave the entry alone."""
    with flock.held(_lock(cache_dir, key), shared=True, blocking=True):
        yield


def touch(entry: Path) -> None:
    """Record a use: the entry directory's mtime is its last use (least recently used goes first)."""
    with contextlib.suppress(OSError):
        os.utime(entry)


def _overrides(manifest: dict[str, Any]) -> list[str]:
    """The ``--set`` values of the compile that stored the entry (from its manifest's argv): two entries of one
    preset and model differ by these, so ``cache list`` shows them."""
    argv = (manifest.get("created_by") or {}).get("argv") if isinstance(manifest.get("created_by"), dict) else None
    if not isinstance(argv, list):
        return []
    words = iter(str(word) for word in argv)
    found = []
    for word in words:
        if word in ("--set", "-s"):
            found.append(next(words, ""))
        elif word.startswith("--set="):
            found.append(word.removeprefix("--set="))
        elif word.startswith("-s") and not word.startswith("--"):
            found.append(word[2:])
    return [value for value in found if value]


def list_entries(cache_dir: Path) -> list[dict[str, Any]]:
    """Every entry: key, preset, model, the --set overrides it was compiled with, size, last use (oldest
    first)."""
    cache_dir = Path(cache_dir)
    out = []
    for entry in sorted(cache_dir.iterdir()) if cache_dir.is_dir() else []:
        if not (entry.is_dir() and KEY_RE.match(entry.name)):
            continue
        try:
            manifest = read_manifest(entry) or {}
        except InputError:
            manifest = {}
        model = manifest.get("model") if isinstance(manifest.get("model"), dict) else {}
        preset = manifest.get("preset")
        preset = preset.get("name") if isinstance(preset, dict) else preset
        try:
            used = entry.stat().st_mtime
        except OSError:
            continue
        out.append(
            {
                "key": entry.name,
                "preset": preset,
                "model": model.get("id"),
                "overrides": _overrides(manifest),
                "backend": manifest.get("backend"),
                "emulated": bool(manifest.get("emulated")),
                "size_bytes": tree_bytes(entry),
                "last_used": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(used)),
                "last_used_ts": used,
                "path": str(entry),
            }
        )
    return sorted(out, key=lambda e: e["last_used_ts"])


def remove_entry(cache_dir: Path, key: str) -> bool:
    """Remove one entry unless a compile is using it (False then): renamed aside, then deleted, so a reader
    never sees half an entry."""
    entry = Path(cache_dir) / key
    try:
        fd = flock.take(_lock(cache_dir, key))
    except flock.LockBusy:
        return False
    try:
        if not entry.is_dir():
            return True
        aside = entry.parent / f".{key}.qvl-old-{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(entry, aside)
        rmtree(aside)
        return True
    finally:
        flock.release(fd)
        flock.remove_if_free(_lock(cache_dir, key))


def parse_duration(text: str, flag: str = "--older-than") -> float:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` as seconds."""
    m = DURATION_RE.match(str(text))
    if not m:
        raise InputError(f"{flag}={text!r} is not a duration", "write a number and a unit: 45s, 90m, 12h, 30d, 2w")
    return float(m.group(1)) * DURATION_UNITS[m.group(2)]


def max_size_from_env() -> int | None:
    """``QVL_CACHE_MAX_SIZE`` as bytes (None when unset or empty)."""
    raw = os.environ.get(MAX_SIZE_ENV, "").strip()
    if not raw:
        return None
    try:
        return parse_byte_size(raw, MAX_SIZE_ENV)
    except InputError as exc:
        raise InputError(exc.message, f"set {MAX_SIZE_ENV} to a size such as 50GiB, or unset it") from None


def plan_prune(
    entries: list[dict[str, Any]], *, older_than_s: float | None, max_size: int | None, keep: set[str] = frozenset()
) -> list[dict[str, Any]]:
    """The entries to remove, least recently used first: those unused for ``older_than_s``, then the oldest
    until the total is at most ``max_size``; ``keep`` is never chosen."""
    now = time.time()
    old = [e for e in entries if older_than_s is not None and now - e["last_used_ts"] > older_than_s]
    chosen = [e for e in old if e["key"] not in keep]
    if max_size is not None:
        total = sum(e["size_bytes"] for e in entries if e not in chosen)
        for e in entries:  # oldest first
            if total <= max_size:
                break
            if e in chosen or e["key"] in keep:
                continue
            chosen.append(e)
            total -= e["size_bytes"]
    return chosen


def prune(
    cache_dir: Path,
    *,
    older_than_s: float | None = None,
    max_size: int | None = None,
    dry_run: bool = False,
    keep: set[str] = frozenset(),
) -> dict[str, Any]:
    """Remove what ``plan_prune`` chooses (nothing with ``dry_run``); entries in use are skipped and reported.
    With ``dry_run``, ``removed`` and ``stale_locks_removed`` name what the same prune would remove."""
    from qwenvl_rbln.artifacts.locks import remove_stale_locks

    entries = list_entries(cache_dir)
    chosen = plan_prune(entries, older_than_s=older_than_s, max_size=max_size, keep=set(keep))
    removed, in_use = [], []
    for e in chosen:
        if dry_run or remove_entry(cache_dir, e["key"]):
            removed.append(e)
        else:
            in_use.append(e)
    locks = remove_stale_locks(dry_run=dry_run)
    left = [e for e in entries if e not in removed]
    return {
        "cache_dir": str(cache_dir),
        "dry_run": dry_run,
        "removed": removed,
        "skipped_in_use": in_use,
        "freed_bytes": sum(e["size_bytes"] for e in removed),
        "entries_left": len(left),
        "total_bytes_left": sum(e["size_bytes"] for e in left),
        "stale_locks_removed": locks,
    }


def enforce_max_size(cache_dir: Path, keep: set[str]) -> list[str]:
    """After a store: prune least recently used entries until the cache is within ``QVL_CACHE_MAX_SIZE``
    (never ``keep``, never an entry in use). Lines to report; a bad value is reported, not fatal."""
    try:
        cap = max_size_from_env()
    except InputError as exc:
        return [f"compile cache size cap ignored: {exc.one_line()}"]
    if cap is None:
        return []
    result = prune(Path(cache_dir), max_size=cap, keep=keep)
    return [
        f"compile cache over {MAX_SIZE_ENV}: removed {e['key']} ({e['preset']}, least recently used)"
        for e in result["removed"]
    ]
