"""An artifact's rbln_config.json, read once for the two pure readers of its compiled shapes: the device-time model
(prefill chunk, KV partition) and the serving simulator (batch, pool, graphs). Pure: no optimum-rbln."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError


def read_rbln_config(artifact: Path) -> tuple[Path, dict[str, Any]]:
    """An artifact's rbln_config.json as a table (refused in one line when missing or unreadable)."""
    import json

    path = Path(artifact) / "rbln_config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path} is missing", "give an artifact directory that `qvl compile` wrote") from None
    except (OSError, ValueError) as exc:
        raise InputError(
            f"{path} cannot be read ({type(exc).__name__}: {exc})", "recompile with `qvl compile --force`"
        ) from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path} is not a table", "recompile with `qvl compile --force`")
    return path, cfg
