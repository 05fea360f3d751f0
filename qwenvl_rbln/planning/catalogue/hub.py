"""A hub id's files in the local Hugging Face cache, and config.json alone fetched when the cache has none.

Its own module because it is the one place qvl meets huggingface_hub for planning: the cached checkpoint is the
one that will be compiled, so its config.json beats any built-in table. huggingface_hub's own cache helpers
(``try_to_load_from_cache``, ``hf_hub_download``) do the resolution (HF_HUB_CACHE, HF_HOME, the default
``~/.cache/huggingface/hub``, ``snapshots/<refs/main>``). Importing huggingface_hub costs ~150 ms, so it is
imported only when the id's cache folder exists or a fetch is allowed: ``qvl --help`` and local directories
never pay for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from qwenvl_rbln.paths import user_path

CONFIG = "config.json"


@dataclass(frozen=True)
class HubSnapshot:
    """A hub id resolved to one snapshot directory (the cache's ``snapshots/<revision>``)."""

    repo_id: str
    revision: str
    path: Path
    fetched: bool = False  # config.json was just fetched (a dry run without a cached copy)

    def to_dict(self) -> dict[str, object]:
        return {"repo_id": self.repo_id, "revision": self.revision, "path": str(self.path), "fetched": self.fetched}


def is_hub_id(model: str) -> bool:
    """ORG/NAME, the shape huggingface_hub accepts as a repo id (not a path, not qvl:tiny)."""
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "/", "~")) and ":" not in model


def hub_cache_dir() -> Path:
    """The cache huggingface_hub uses, in its own order (``constants.py``): HF_HUB_CACHE, the legacy
    HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub. Read at call
    time (huggingface_hub reads it once at import), and handed to its helpers as ``cache_dir``."""
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return user_path(os.path.expandvars(hub), "Hugging Face cache")


def _maybe_cached(repo_id: str) -> bool:
    """A cheap stat before importing huggingface_hub: does the id's cache folder exist at all?"""
    return (hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))).is_dir()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


def _snapshot_of(repo_id: str, file: str, fetched: bool) -> HubSnapshot:
    path = Path(file).parent
    return HubSnapshot(repo_id=repo_id, revision=path.name, path=path, fetched=fetched)


def cached_snapshot(repo_id: str) -> HubSnapshot | None:
    """The snapshot of ``refs/main`` whose config.json is in the local cache, or None."""
    if not is_hub_id(repo_id) or not _maybe_cached(repo_id):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency of optimum-rbln
        return None
    try:
        found = try_to_load_from_cache(repo_id, CONFIG, cache_dir=hub_cache_dir())
    except Exception:  # noqa: BLE001 - a malformed id or cache: treated as not cached
        return None
    return _snapshot_of(repo_id, found, fetched=False) if isinstance(found, str) else None


def fetch_config(repo_id: str) -> tuple[HubSnapshot | None, str]:
    """config.json alone through huggingface_hub (never weights), when HF_HUB_OFFLINE is unset.

    Returns (snapshot, "") or (None, why not), so a refusal can say why the hub was not asked or did not answer.
    """
    if not is_hub_id(repo_id):
        return None, "not a hub id"
    if _offline():
        return None, "HF_HUB_OFFLINE is set, so config.json was not fetched"
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:  # pragma: no cover
        return None, "huggingface_hub is not installed"
    try:
        file = hf_hub_download(repo_id, CONFIG, cache_dir=hub_cache_dir())
    except Exception as exc:  # noqa: BLE001 - no network, gated or missing repo: one reason, no traceback
        return None, f"fetching config.json failed ({type(exc).__name__})"
    return _snapshot_of(repo_id, file, fetched=True), ""


def snapshot_of_dir(path: Path) -> HubSnapshot | None:
    """The hub id and revision of a directory that is a Hugging Face cache snapshot (``models--O--N/snapshots/R``)."""
    path = Path(path)
    repo_dir = path.parent.parent
    if path.parent.name != "snapshots" or not repo_dir.name.startswith("models--"):
        return None
    parts = repo_dir.name[len("models--") :].split("--", 1)
    if len(parts) != 2:
        return None
    return HubSnapshot(repo_id="/".join(parts), revision=path.name, path=path)
