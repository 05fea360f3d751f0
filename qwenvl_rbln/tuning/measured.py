"""Measured graph timings that replace the roofline, graph by graph, when someone has recorded them.

File: ``$QVL_HOME/timings.json``::

    {"format": "qvl-timings", "version": 1,
     "entries": {"<model key>": {"RBLN-CR13": {"<graph key>": {"seconds": 0.0123, "source": "..."}}}}}

Graph keys are the calibration keys (``memory.calibration``): ``decoder_batch_4/block8192`` (seconds per decode
step at the model's full context), ``prefill/chunk512/block8192`` (seconds per prefill chunk) and
``visual/call16384`` (seconds per ViT call in the 16384-patch bucket). Nothing writes the file yet: time the graphs
on the NPU host (``qvl infer --json`` timings, vLLM's own benchmark) and write it by hand; a figure read from it
is labelled "measured" in every estimate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.catalogue.modelinfo import qvl_home

FORMAT = "qvl-timings"
FILE_NAME = "timings.json"


def timings_path() -> Path:
    return qvl_home() / FILE_NAME


def visual_call_key(bucket: int) -> str:
    return f"visual/call{bucket}"


def load_timings(model_key: str, npu: str, path: Path | None = None) -> dict[str, float]:
    """Graph key -> measured seconds for one model and NPU; empty when there is no file."""
    path = path or timings_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InputError(f"timings file {path} cannot be read ({exc})", f"fix or delete {path}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise InputError(f"timings file {path} is not a {FORMAT} file", f"fix or delete {path}")
    graphs: Any = (data["entries"].get(model_key) or {}).get(npu) or {}
    out: dict[str, float] = {}
    for key, rec in graphs.items() if isinstance(graphs, dict) else ():
        seconds = rec.get("seconds") if isinstance(rec, dict) else None
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
            raise InputError(f"timings file {path}: {key}.seconds is not a positive number", f"fix or delete {path}")
        out[key] = float(seconds)
    return out
