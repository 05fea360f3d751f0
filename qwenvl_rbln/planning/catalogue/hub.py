"""A hub id's files in the local Hugging Face cache, and config.json alone fetched when the cache has none.

Its own module because it is the one place qvl meets huggingface_hub for planning: the cached checkpoint is the
one that will be compiled, so its config.json beats any built-in table. huggingface_hub's own cache helpers
(``try_to_load_from_cache``, ``hf_hub_download``) do the resolution (HF_HUB_CACHE, HF_HOME, the default
``~/.cache/huggingface/hub``, ``snapshots/<refs/main>``). Importing huggingface_hub costs ~150 ms, so it is
imported only when the id's cache folder exists or a fetch is allowed: ``qvl --help`` and local directories
never pay for it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from qwenvl_rbln.paths import user_path

CONFIG = "config.json"
# One try, the whole fetch within this many seconds (HF_HUB_ETAG_TIMEOUT overrides it): an air-gapped NPU host must
# get its answer at once, not after huggingface_hub's five retries with back-off (24 s).
HUB_TIMEOUT_S = 2.0
# What a failed fetch says, by huggingface_hub's exception name (anything else: the hub did not answer).
_HUB_REFUSALS = {
    "RepositoryNotFoundError": "the hub has no such model (or it is private)",
    "GatedRepoError": "the model is gated on the hub (log in and accept its terms first)",
    "RevisionNotFoundError": "the hub has no such revision",
    "RemoteEntryNotFoundError": "the hub's repo has no config.json",
    "EntryNotFoundError": "the hub's repo has no config.json",
}


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


def _offline_variable() -> str | None:
    """The variable that makes huggingface_hub offline (it reads TRANSFORMERS_OFFLINE too), or None."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in ("1", "on", "yes", "true"):
            return name
    return None


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


def hub_timeout() -> float:
    """The one try's deadline (the whole fetch): HF_HUB_ETAG_TIMEOUT when positive, else HUB_TIMEOUT_S."""
    try:
        value = float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or HUB_TIMEOUT_S)
    except ValueError:
        return HUB_TIMEOUT_S
    return value if value > 0 else HUB_TIMEOUT_S


def _etag_timeout_problem() -> str | None:
    """huggingface_hub reads HF_HUB_ETAG_TIMEOUT with ``int()`` when its download module is imported: any other
    value (``0.5``, empty) makes that import fail, so it is named instead of reported as a hub that did not answer."""
    raw = os.environ.get("HF_HUB_ETAG_TIMEOUT")
    try:
        int(raw) if raw is not None else None
    except ValueError:
        return (
            f"HF_HUB_ETAG_TIMEOUT={raw!r} is not a whole number of seconds, which huggingface_hub needs, so"
            " config.json was not fetched (fix: HF_HUB_ETAG_TIMEOUT=2, or unset it)"
        )
    return None


@contextmanager
def _quiet_hub() -> Iterator[None]:
    """huggingface_hub logs each failed request and retry as a warning; qvl says why in its own one line. Its
    telemetry is off for the fetch too: with it on, building a request's headers first fetches the hub's
    agent-harness registry (``GET /api/agent-harnesses``, with its own 3 s timeout), a second request that an
    air-gapped host waited out before the HEAD was even sent (5.5 s for "one try, 2 s timeout")."""
    from huggingface_hub import constants

    logger = logging.getLogger("huggingface_hub")
    level, telemetry = logger.level, constants.HF_HUB_DISABLE_TELEMETRY
    logger.setLevel(logging.ERROR + 10)
    constants.HF_HUB_DISABLE_TELEMETRY = True
    try:
        yield
    finally:
        logger.setLevel(level)
        constants.HF_HUB_DISABLE_TELEMETRY = telemetry


def _fetch(repo_id: str, deadline: float, result: dict[str, object]) -> None:
    """The worker of ``fetch_config``: one HEAD, then the file; its outcome (``file`` or ``error``) in ``result``.
    No file is fetched once ``fetch_config`` has given up on it (``abandoned``)."""
    try:
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

        with _quiet_hub():
            remaining = max(0.001, deadline - time.monotonic())
            get_hf_file_metadata(hf_hub_url(repo_id, CONFIG), timeout=remaining, retry_on_errors=False)
            if result.get("abandoned"):  # the answer came after the deadline: qvl has already said no
                return
            remaining = max(0.001, deadline - time.monotonic())
            result["file"] = hf_hub_download(repo_id, CONFIG, cache_dir=hub_cache_dir(), etag_timeout=remaining)
    except Exception as exc:  # noqa: BLE001 - no network, gated or missing repo: reported by fetch_config
        result["error"] = exc


def fetch_config(repo_id: str) -> tuple[HubSnapshot | None, str]:
    """config.json alone through huggingface_hub (never weights), when HF_HUB_OFFLINE is unset.

    One HEAD first, without huggingface_hub's retries or its telemetry request, so an air-gapped host or an unknown
    id answers at once; only a hub that answered is asked for the file. The whole fetch has one deadline
    (``hub_timeout``): httpx's timeouts are per phase (connect, each read) and a name lookup has none, so the fetch
    runs in a daemon thread that is abandoned when the deadline passes. Returns (snapshot, "") or (None, why not),
    so a refusal can say why the hub was not asked or did not answer.
    """
    if not is_hub_id(repo_id):
        return None, "not a hub id"
    offline = _offline_variable()
    if offline:
        return None, f"{offline} is set, so config.json was not fetched"
    problem = _etag_timeout_problem()
    if problem:
        return None, problem
    try:
        # imported (huggingface_hub's lazy attributes loaded) before the deadline starts: it is not the network
        from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url  # noqa: F401
    except ImportError:  # pragma: no cover
        return None, "huggingface_hub is not installed"
    timeout = hub_timeout()
    result: dict[str, object] = {}
    worker = threading.Thread(
        target=_fetch, args=(repo_id, time.monotonic() + timeout, result), name="qvl-hub-fetch", daemon=True
    )
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        result["abandoned"] = True
    file, exc = result.get("file"), result.get("error")
    if isinstance(file, str):
        return _snapshot_of(repo_id, file, fetched=True), ""
    name = type(exc).__name__ if exc is not None else ""
    if exc is None or name.endswith("Timeout") or isinstance(exc, TimeoutError):  # the deadline or httpx's own
        why = f"the hub did not answer within {timeout:g} s (one try; HF_HUB_ETAG_TIMEOUT sets the limit)"
    else:
        why = _HUB_REFUSALS.get(name) or f"the hub did not answer ({name}; one try, {timeout:g} s timeout)"
    return None, f"fetching config.json failed: {why}"


def _repo_id_of(folder: str) -> str | None:
    """``ORG/NAME`` of a hub cache folder ``models--ORG--NAME`` (None: not one)."""
    if not folder.startswith("models--"):
        return None
    parts = folder[len("models--") :].split("--", 1)
    return "/".join(parts) if len(parts) == 2 else None


def cached_ids() -> list[str]:
    """The hub ids with a folder in the local cache (``models--ORG--NAME``), for 'did you mean'."""
    try:
        ids = [_repo_id_of(p.name) for p in hub_cache_dir().iterdir()]
    except OSError:
        return []
    return sorted(i for i in ids if i is not None)


def snapshot_of_dir(path: Path) -> HubSnapshot | None:
    """The hub id and revision of a directory that is a Hugging Face cache snapshot (``models--O--N/snapshots/R``)."""
    path = Path(path)
    repo_id = _repo_id_of(path.parent.parent.name)
    if path.parent.name != "snapshots" or repo_id is None:
        return None
    return HubSnapshot(repo_id=repo_id, revision=path.name, path=path)
