"""Whether an artifact was produced by qvl's CPU emulator: the manifest's record and the graph-file marker.

The emulator writes each graph as a safetensors file whose metadata carries ``FORMAT`` and ``MARKER``, and the
compile job records ``"emulated": true`` in qvl-manifest.json. Reading either back is a question about the
artifact, so it is answered here: serving and the loaders ask this module, and the emulator takes its marker from
it, so nothing outside the backends reaches into one. Only a file's JSON header is read, never a tensor.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

FORMAT = "qvl-emulated-rbln"
MARKER = "EMULATED by qvl's CPU emulator: not an RBLN NPU graph"


def read_metadata(path: Path) -> dict[str, str] | None:
    """The safetensors metadata of ``path``, or None when it is not a safetensors file (read the header only)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                return None
            n = int.from_bytes(raw, "little")
            if n <= 0 or n > 100_000_000:
                return None
            head = json.loads(fh.read(n))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    meta = head.get("__metadata__") if isinstance(head, dict) else None
    return meta if isinstance(meta, dict) else None


def is_emulated_file(path: Path) -> bool:
    meta = read_metadata(path)
    return bool(meta) and meta.get("format") == FORMAT


def manifest_marks_emulated(manifest: dict[str, Any] | None) -> bool:
    """True when the artifact's qvl-manifest.json records it as the emulator's (``"emulated": true``)."""
    return manifest is not None and manifest.get("emulated") is True


def emulated_graph_files(root: Path, graphs: Iterable[str]) -> list[str]:
    """The graph files (relative to ``root``) that carry the emulator's marker; missing files are not."""
    return [rel for rel in graphs if is_emulated_file(Path(root) / rel)]


def is_emulated_artifact(root: Path, manifest: dict[str, Any] | None, graphs: Iterable[str]) -> bool:
    """Whether the artifact at ``root`` was produced by the emulator: its manifest says so, or a graph file does."""
    return manifest_marks_emulated(manifest) or bool(emulated_graph_files(root, graphs))


def emulated_evidence(root: Path, manifest: dict[str, Any] | None, graphs: Iterable[str]) -> str:
    """What marks ``root`` as emulated, for the message that refuses it: the manifest's flag, else the marked
    graph files (an artifact whose manifest is gone is still recognised, and never blamed on the manifest)."""
    if manifest_marks_emulated(manifest):
        return "qvl-manifest.json emulated: true"
    files = emulated_graph_files(root, graphs)
    more = f" and {len(files) - 2} more" if len(files) > 2 else ""
    return f"the emulator's marker in {', '.join(files[:2])}{more}"
