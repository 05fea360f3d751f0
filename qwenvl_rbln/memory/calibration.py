"""Measured device allocations that replace the memory planner's modelled numbers.

``qvl load-check`` on an RBLN host can read what each compiled graph really allocates (from the
compiled artifacts, ``get_alloc_per_chiplet_by_key()`` without the KV ``DramTensor``s, or from
``rbln-smi``) and record it here; ``memory.planner.estimate`` then uses the measured number instead of its
formula and marks the item ``calibrated``.

File: ``$QVL_HOME/calibration.json`` (``QVL_HOME`` defaults to ``~/.cache/qvl``)::

    {
      "format": "qvl-calibration",
      "version": 1,
      "entries": {
        "<model key>": {                      # model_key(geometry) or a model name
          "<npu>": {                          # e.g. "RBLN-CR13"
            "<graph key>": {                  # see graph_keys(): "prefill/chunk512/block8192", ...
              "workspace_bytes": 441450496,   # device bytes of the graph minus weights and KV cache
              "recorded_at": "2026-01-01T00:00:00+00:00",
              "source": "load-check: compiled artifacts"
            }
          }
        }
      }
    }

A graph key names the graph and the shapes its buffers depend on, so a measurement is only reused
for a graph of the same shape: prefill depends on the chunk and the KV block, a decoder graph on
its batch and the block, the ViT on its largest bucket (all buckets live in one ``.rbln``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.catalogue.modelinfo import ModelGeometry, qvl_home

FORMAT = "qvl-calibration"
VERSION = 1
FILE_NAME = "calibration.json"


def default_calibration_path() -> Path:
    return qvl_home() / FILE_NAME


def empty_calibration() -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "entries": {}}


# --- keys ------------------------------------------------------------------------------------------


def model_key(geometry: ModelGeometry) -> str:
    """A calibration key that names the geometry, not the directory it was read from."""
    t, v = geometry.text, geometry.vision
    return (
        f"qwen3_vl/text-L{t.num_hidden_layers}-H{t.hidden_size}-h{t.num_attention_heads}-kv{t.num_key_value_heads}"
        f"-d{t.head_dim}-I{t.intermediate_size}-V{t.vocab_size}"
        f"/vision-D{v.depth}-H{v.hidden_size}-h{v.num_heads}-I{v.intermediate_size}-O{v.out_hidden_size}"
        + (f"/moe-E{t.moe.num_experts}-k{t.moe.num_experts_per_tok}-I{t.moe.moe_intermediate_size}" if t.moe else "")
    )


def prefill_key(prefill_chunk_size: int, block: int) -> str:
    return f"prefill/chunk{prefill_chunk_size}/block{block}"


def decoder_key(batch: int, block: int) -> str:
    return f"decoder_batch_{batch}/block{block}"


def visual_key(largest_bucket: int) -> str:
    return f"visual/bucket{largest_bucket}"


def variant_suffix(resolved: Any) -> str:
    """What else changes a graph's buffers: quantization (a quantized model compiles in float32) and the
    attention-mask input. Empty for the plain bf16 build, so its keys stay as they were."""
    parts = []
    quant = getattr(resolved, "quantization", None)
    if quant:
        parts.append(f"q-{quant['weights']}-{quant['activations']}-kv{quant['kv_caches']}")
    if getattr(resolved, "use_attention_mask", False):
        parts.append("mask")
    return "".join(f"/{p}" for p in parts)


def graph_keys(resolved: Any) -> dict[str, str]:
    """Compiled graph name -> calibration key, for a ResolvedLM (``visual`` is the ViT's compiled_model)."""
    block = resolved.kvcache_block_size
    suffix = variant_suffix(resolved)
    keys = {"prefill": prefill_key(resolved.prefill_chunk_size, block) + suffix}
    for b in resolved.decoder_batch_sizes:
        keys[f"decoder_batch_{b}"] = decoder_key(b, block) + suffix
    quant = getattr(resolved, "quantization", None)
    keys["visual"] = visual_key(max(resolved.vit_buckets)) + ("/fp32" if quant else "")
    return keys


# --- reading ---------------------------------------------------------------------------------------


def _corrupt(path: Path, what: str) -> InputError:
    return InputError(
        f"calibration file {path} is corrupt ({what})",
        f"delete {path} (estimates fall back to the model), or re-run `qvl load-check` on the NPU host to re-record it",
    )


def validate_calibration(data: Any, path: Path | str = "<calibration>") -> dict[str, Any]:
    """Check the structure; raise InputError naming the file and the fix."""
    path = Path(path)
    if not isinstance(data, dict):
        raise _corrupt(path, f"top level is {type(data).__name__}, not an object")
    if data.get("format", FORMAT) != FORMAT:
        raise _corrupt(path, f"format is {data.get('format')!r}, not {FORMAT!r}")
    version = data.get("version", VERSION)
    if version != VERSION:
        raise _corrupt(path, f"version {version!r} is not {VERSION}")
    entries = data.get("entries", {})
    if not isinstance(entries, dict):
        raise _corrupt(path, "'entries' is not an object")
    for model, npus in entries.items():
        if not isinstance(npus, dict):
            raise _corrupt(path, f"entries[{model!r}] is not an object")
        for npu, graphs in npus.items():
            if not isinstance(graphs, dict):
                raise _corrupt(path, f"entries[{model!r}][{npu!r}] is not an object")
            for key, rec in graphs.items():
                value = rec.get("workspace_bytes") if isinstance(rec, dict) else None
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise _corrupt(path, f"entries[{model!r}][{npu!r}][{key!r}].workspace_bytes is not a byte count")
    return {"format": FORMAT, "version": VERSION, "entries": entries}


def load_calibration(path: Path | str | None = None) -> dict[str, Any]:
    """The calibration data; an empty one when the file does not exist."""
    path = Path(path) if path is not None else default_calibration_path()
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):  # no file, or a parent that is a file
        return empty_calibration()
    except OSError as exc:
        raise InputError(
            f"cannot read calibration file {path}: {exc}", f"fix its permissions or delete {path}"
        ) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _corrupt(path, f"not JSON: {exc}") from None
    return validate_calibration(data, path)


def lookup(calibration: dict[str, Any] | None, models: list[str] | str, npu: str, key: str) -> int | None:
    """Measured workspace bytes for (model, npu, graph key), trying each model key in order; None if absent."""
    if not calibration:
        return None
    entries = calibration.get("entries") or {}
    for model in [models] if isinstance(models, str) else models:
        rec = ((entries.get(model) or {}).get(npu) or {}).get(key)
        if isinstance(rec, dict) and isinstance(rec.get("workspace_bytes"), int):
            return rec["workspace_bytes"]
    return None


# --- writing ---------------------------------------------------------------------------------------


def _model_name(model: Any) -> str:
    if isinstance(model, str):
        return model
    return model_key(model)  # a ModelGeometry


def record(
    measurements: dict[str, Any],
    *,
    model: Any,
    npu: str,
    path: Path | str | None = None,
    source: str = "load-check",
) -> Path:
    """Merge measurements ``{graph key: bytes | {"workspace_bytes": bytes, ...}}`` into the file, atomically.

    ``model`` is a ModelGeometry (keyed by ``model_key``) or a string. Returns the file path.
    """
    path = Path(path) if path is not None else default_calibration_path()
    data = load_calibration(path)
    name = _model_name(model)
    graphs = data["entries"].setdefault(name, {}).setdefault(npu, {})
    now = datetime.now(UTC).isoformat(timespec="seconds")
    for key, value in measurements.items():
        rec = dict(value) if isinstance(value, dict) else {"workspace_bytes": value}
        nbytes = rec.get("workspace_bytes")
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise InputError(
                f"calibration measurement {key!r}={value!r} is not a byte count",
                "record workspace_bytes as a non-negative integer",
            )
        rec.setdefault("recorded_at", now)
        rec.setdefault("source", source)
        graphs[str(key)] = rec
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".calibration-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path
