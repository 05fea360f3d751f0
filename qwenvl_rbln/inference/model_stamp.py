"""The stamp of a model directory: which files it holds, their sizes and mtimes.

Caches keyed by it (the loaded reference model, the shared processor) reload when a file changes.
Its own module, below ``inputs`` and ``reference``, so neither borrows it from the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

STAMPED_FILES = (
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "processor_config.json",
    "preprocessor_config.json",
    "tokenizer.json",
)


def model_stamp(model_dir: Path) -> tuple[Any, ...]:
    """(name, size, mtime_ns) of each of ``STAMPED_FILES`` present in ``model_dir``."""
    out = []
    for name in STAMPED_FILES:
        p = model_dir / name
        if p.exists():
            st = p.stat()
            out.append((name, st.st_size, st.st_mtime_ns))
    return tuple(out)
