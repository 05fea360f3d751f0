"""Backends behind one small interface. Importing this package imports nothing heavy.

- ``rbln``: optimum-rbln 0.12.0 + rebel-compiler on an RBLN host (``backends/rbln/``).
- ``torch``: the reference backend; its "compile" copies the Hugging Face model into an artifact
  directory with the same manifest and config file shape (``backends/torch_ref_compile.py``).
"""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.paths import user_path
from qwenvl_rbln.progress import Progress, fmt_elapsed

__all__ = ["Progress", "backend_module", "fmt_elapsed", "resolve_source"]  # Progress lives in qwenvl_rbln.progress


def backend_module(name: str) -> Any:
    """The backend module for a plan's ``backend`` value (imported lazily, still without heavy imports)."""
    if name == "rbln":
        from qwenvl_rbln.backends.rbln import optimum as rbln

        return rbln
    if name == "torch":
        from qwenvl_rbln.backends import torch_ref_compile

        return torch_ref_compile
    from qwenvl_rbln.errors import InputError

    raise InputError(f"backend={name!r} is not one of rbln, torch", "set backend: rbln or backend: torch in the preset")


def resolve_source(model_id: str, *, backend: str) -> tuple[str, Any]:
    """(what to hand the backend, local directory or None) for a plan's model id.

    ``qvl:tiny`` (``qvl:tiny-moe``, ``qvl:tiny-8b``) is created on first use (``tiny_model.ensure_tiny_model``). A
    hub id in the local Hugging Face cache resolves to that snapshot, so it is hashed and the compile cache works; one
    that is not cached is passed through to optimum-rbln on an RBLN host (it downloads as usual, and the manifest says
    it was not hashed). The torch backend copies a local directory, so it never downloads.
    """
    from pathlib import Path

    from qwenvl_rbln.errors import InputError
    from qwenvl_rbln.planning.catalogue.modelinfo import resolve_model_path, tiny_variant

    variant = tiny_variant(model_id)
    if variant is not None:
        from qwenvl_rbln.backends.tiny.model import ensure_tiny_model

        path = Path(ensure_tiny_model(**variant))
        return str(path), path
    path = resolve_model_path(model_id)
    if path is not None:
        path = user_path(path)
        if not path.is_dir():
            raise InputError(
                f"model directory {path} does not exist", "pass --model with an existing Hugging Face model directory"
            )
        return str(path.absolute()), path.absolute()
    local = _cached_snapshot(model_id)
    if local is not None:  # hashed, cached and compiled from the same files, offline
        return str(local), local
    if backend == "rbln":
        return model_id, None
    raise InputError(
        f"model {model_id!r} is a hub id that is not in the local Hugging Face cache",
        f"download it first (`hf download {model_id}`) and pass --model with its directory; qvl never downloads",
    )


def _cached_snapshot(model_id: str) -> Any:
    """The local Hugging Face cache's snapshot of a hub id, or None (not cached, or huggingface_hub missing)."""
    from pathlib import Path

    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, offline, a malformed id, or huggingface_hub missing
        return None
