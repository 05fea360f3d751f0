"""An artifact read once: its config, manifest, model config and processor files, for every check of one command.

Serve's preflight, each replica's launch, deploy, bench-serve, load-check and profile all ask the same files the same
questions. Each used to open them again (rbln_config.json and qvl-manifest.json at every check); now the command reads
the artifact once into a ``CheckedArtifact`` and hands that object on. Every file it reads is kept as bytes: parsed
from them on each ask (a caller may edit what it gets), and its size and sha256 taken from them, so the manifest's
hash check compares the very bytes that were parsed and never reads those files a second time.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts.layout import (
    compile_target,
    config_name,
    json_object,
    json_text,
    locate_artifact,
    refuse_old_format,
)
from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME, manifest_object, unsafe_relpath, verify_manifest
from qwenvl_rbln.artifacts.processor_files import SECTIONS

# the small JSON files every check reads (model config, processor, tokenizer config: the chat template key), read
# with the config so a hash check that comes before a processor check never opens them a second time
HELD = tuple(dict.fromkeys(["config.json", *(name for name, _, _ in SECTIONS), "tokenizer_config.json"]))


def _read_bytes(path: Path) -> bytes | OSError:
    try:
        return path.read_bytes()
    except OSError as exc:
        return exc


@dataclass(eq=False)
class CheckedArtifact:
    """One artifact directory as read once: ``kind`` ("rbln" or "torch"), its config and manifest, and the other JSON
    files the checks read, on first ask (``read``, ``read_strict``)."""

    root: Path
    kind: str
    cfg: dict[str, Any]
    manifest: dict[str, Any] | None
    _raw: dict[str, bytes | OSError] = field(default_factory=dict, repr=False)

    def raw(self, name: str) -> bytes | OSError:
        """The bytes of ``name`` (or the error reading it raised), read on the first ask only: for a caller that
        parses a file with refusals of its own (``qvl profile``'s)."""
        if name not in self._raw:
            self._raw[name] = _read_bytes(self.root / name)
        return self._raw[name]

    def read(self, name: str) -> dict[str, Any] | None:
        """The JSON object in ``name`` (relative to the root), None when it is absent or not one; read once."""
        if unsafe_relpath(name):
            return None
        raw = self.raw(name)
        if isinstance(raw, OSError):
            return None
        try:
            data = json.loads(json_text(raw))
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def read_strict(self, name: str) -> dict[str, Any]:
        """``layout.read_json`` of ``name``: the object, or its one-line refusal; read once."""
        return json_object(self.root / name, self.raw(name))

    @property
    def known(self) -> dict[str, tuple[int, str]]:
        """(size, sha256) of every file read so far, for ``verify_manifest(known=...)``."""
        return {
            name: (len(raw), hashlib.sha256(raw).hexdigest())
            for name, raw in self._raw.items()
            if isinstance(raw, bytes) and name != MANIFEST_NAME
        }

    @property
    def model_config(self) -> dict[str, Any]:
        """config.json (the Hugging Face model config), ``read_json``'s refusal when it is absent or broken."""
        return self.read_strict("config.json")

    @cached_property
    def _target(self) -> dict[str, Any]:
        return compile_target(self.cfg, self.manifest)

    @property
    def target(self) -> dict[str, Any]:
        """``layout.compile_target``, worked out once: the NPU and num_devices the graphs were compiled for (a copy:
        load-check adds its problems to it)."""
        return copy.deepcopy(self._target)

    def load_manifest(self) -> dict[str, Any] | None:
        """qvl-manifest.json (``read_manifest``'s None when absent, and its refusals), into ``manifest``; read once."""
        path = self.root / MANIFEST_NAME
        if path.is_file():
            self.manifest = manifest_object(path, self.raw(MANIFEST_NAME))
        return self.manifest

    def verify(self) -> dict[str, Any]:
        """``verify_manifest`` against the manifest, hashing only the files not read already (there must be one)."""
        assert self.manifest is not None
        return verify_manifest(self.root, self.manifest, known=self.known)


def open_artifact(root: Path, kind: str = "rbln") -> CheckedArtifact:
    """Read the config of a ``kind`` artifact at ``root`` (``read_json``'s refusals) and its manifest
    (``read_manifest``'s), once; the caller has checked that ``root`` is such an artifact."""
    return _open(Path(root), kind, old_format_ok=True)


def read_artifact(artifact_dir: Path) -> CheckedArtifact:
    """``layout.read_artifact_config`` and ``manifest.read_manifest`` in one read: the same refusals, in order."""
    root, kind = locate_artifact(artifact_dir)
    return _open(root, kind, old_format_ok=False)


def _open(root: Path, kind: str, *, old_format_ok: bool) -> CheckedArtifact:
    art = CheckedArtifact(root=root, kind=kind, cfg={}, manifest=None)
    name = config_name(kind)
    art.cfg = art.read_strict(name)
    if not old_format_ok:
        refuse_old_format(root / name, art.cfg)
    art.load_manifest()
    for name in HELD:  # bytes only: a missing or broken file is refused (or skipped) where a check asks for it
        art.raw(name)
    return art
