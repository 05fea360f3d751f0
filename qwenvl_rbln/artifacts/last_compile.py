"""The last-compile record: where ``qvl compile`` last wrote from this working directory.

``qvl infer`` and ``qvl load-check`` without DIR read it; it is a convenience record under ``$QVL_HOME``, apart from
any artifact, so it is its own module.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

LAST_COMPILE_NAME = "last-compile"  # a directory under $QVL_HOME: one record per working directory


def _last_compile_path(cwd: Path | None = None) -> Path:
    """The record of the last compile run from ``cwd`` (default: the working directory), so a default never
    crosses projects: `qvl load-check` in another folder does not check this folder's artifact."""
    import hashlib

    from qwenvl_rbln.planning.catalogue.modelinfo import qvl_home

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
