"""Does the checkpoint carry the scales its ``quantization`` needs? Read from the safetensors headers only.

Its own module because optimum-rbln 0.12 checks this late or not at all (``rbln_quantization.py``,
``load_weights_from_files``): fp8 weights, activations or KV without their scales stop the compile after the whole
checkpoint is read ("No weight_scale found ..."), and int8/int4 without them compile with every scale left at 1
(``convert_to_qint_linear`` initialises them with ones), so the model runs and answers garbage. qvl reads the
tensor names and dtypes (the JSON header of each ``*.safetensors`` file: 8 bytes of length, then the header; never
the data) and refuses before anything compiles.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError

# optimum-rbln 0.12 rbln_quantization.VARIANT_ALIASES: the last name segment each kind of scale may have.
SCALE_ALIASES = {
    "weight_scale": ("weight_scale", "scales", "w_scale", "scale"),
    "input_scale": ("input_scale", "act_scale", "activation_scale", "a_scale"),
    "kv_scale": ("kv_scale", "kv_scales", "k_scale", "k_scales", "v_scale", "v_scales"),
}
BLOCKWISE_SCALE = "weight_scale_inv"  # Qwen's own -FP8 checkpoints: one scale per 128x128 weight tile
MAX_HEADER = 100 * 1024 * 1024  # a safetensors header above this is not one (the format caps it the same way)
SOURCE = "optimum-rbln 0.12 rbln_quantization.py (load_weights_from_files, VARIANT_ALIASES)"


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file: {tensor name: {dtype, shape, data_offsets}}; the data is not read."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise ValueError("shorter than the 8-byte header length")
            (length,) = struct.unpack("<Q", raw)
            if length > MAX_HEADER:
                raise ValueError(f"header length {length} is not plausible")
            header = json.loads(fh.read(length))
    except (OSError, ValueError) as exc:
        raise InputError(
            f"{path}: not a readable safetensors file ({exc})", "re-download the checkpoint (its weights are damaged)"
        ) from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: safetensors header is not a mapping", "re-download the checkpoint")
    header.pop("__metadata__", None)
    return header


def checkpoint_tensors(directory: Path) -> dict[str, str] | None:
    """{tensor name: dtype} over every ``*.safetensors`` in ``directory`` (as optimum-rbln globs them), or None
    when the directory holds no weights (a hub id, or a cache with config.json alone)."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        return None
    out: dict[str, str] = {}
    for path in files:
        for name, info in read_header(path).items():
            out[name] = str(info.get("dtype", "?")) if isinstance(info, dict) else "?"
    return out


def _has(tensors: dict[str, str], kind: str) -> bool:
    return any(name.rsplit(".", 1)[-1] in SCALE_ALIASES[kind] for name in tensors)


def _blockwise(directory: Path, tensors: dict[str, str] | None) -> bool:
    if tensors and any(name.endswith("." + BLOCKWISE_SCALE) for name in tensors):
        return True
    try:
        cfg = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    qc = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    return isinstance(qc, dict) and bool(qc.get("weight_block_size"))


def _needs_input_scale(quant: dict[str, Any]) -> bool:
    """optimum-rbln 0.12 gives a linear a static ``input_scale`` only for fp8 activations, or int8 ones with
    ``dynamic`` false (``convert_to_qfloat_linear`` / ``convert_to_qint_linear``); int8 with ``dynamic: true``
    computes per-token scales at run time (``QIntLinear``), so a W8A8-dynamic checkpoint carries none."""
    activations = quant.get("activations")
    return activations == "fp8" or (activations == "int8" and not quant.get("dynamic"))


def check_scales(directory: Path | None, quant: dict[str, Any] | None, model: str) -> list[str]:
    """Refuse (InputError, exit 2) a quantization the checkpoint cannot feed; warnings for what was not checked."""
    if not quant:
        return []  # nothing to feed: the weights are never opened
    if directory is None:
        return [f"quantization: {model} has no local weights, so its scales were not checked (optimum-rbln reads them)"]
    tensors = checkpoint_tensors(directory)
    if _blockwise(directory, tensors):
        raise InputError(
            f"quantization with {directory}: a block-wise FP8 checkpoint ({BLOCKWISE_SCALE} per 128x128 weight "
            f"tile, Qwen's own -FP8 format); {SOURCE} reads only per-channel or per-tensor scales named "
            f"{', '.join(SCALE_ALIASES['weight_scale'])}, so it would not load",
            "compile the bf16 checkpoint (e.g. Qwen/Qwen3-VL-8B-Instruct, not -FP8) without quantization, or with "
            "a checkpoint whose q/k/v/o/gate/up/down carry per-channel weight_scale (and input_scale for "
            "activations fp8, k_scale/v_scale for kv_caches fp8)",
        )
    if tensors is None:
        return [f"quantization: {directory} holds no *.safetensors, so the checkpoint's scales were not checked"]
    needs = []
    if quant.get("weights") not in (None, "fp16"):
        needs.append(("weight_scale", f"weights={quant['weights']}"))
    if _needs_input_scale(quant):
        needs.append(("input_scale", f"activations={quant['activations']}"))
    if quant.get("kv_caches") == "fp8":
        needs.append(("kv_scale", "kv_caches=fp8"))
    missing = [(kind, why) for kind, why in needs if not _has(tensors, kind)]
    if not missing:
        return []
    fp8 = [kind for kind, why in missing if "fp8" in why]
    what = "; ".join(f"{why} needs {kind} ({' / '.join(SCALE_ALIASES[kind])})" for kind, why in missing)
    effect = (
        f"optimum-rbln stops the compile with 'No {fp8[0]} found in the checkpoint' after reading all of it"
        if fp8
        else "optimum-rbln would compile it with every scale left at 1 and the model would answer garbage"
    )
    raise InputError(
        f"rbln_config.quantization with {directory}: the checkpoint has no such scales ({what}); {effect} ({SOURCE})",
        "use a checkpoint quantized for these settings (its safetensors carry the scales), or drop "
        "rbln_config.quantization to compile the bf16 weights",
    )
