"""optimum-rbln's LM rules that both sources of a ResolvedLM apply: its limits and supported values, the defaults
it fills in and the KV block counts it computes.

Its own module because the preset checks (``lm.checks``), the reading of a compiled config (``lm.saved``) and the
shared derivation (``lm.resolved``) all use them: each imports them from here, none from another.
"""

from __future__ import annotations

from typing import Any

# optimum-rbln 0.12 modeling_attention_utils.AttentionLimits
ATTENTION_LIMITS = {
    "REBEL": {"max_eager": 16384, "partition_min": 1024, "partition_max": 16384, "default_partition": 8192},
    "ATOM": {"max_eager": 32768, "partition_min": 1024, "partition_max": 32768, "default_partition": 16384},
}
MIN_FLASH_MAX_SEQ_LEN = 2048

# optimum-rbln 0.12 transformers/utils/rbln_quantization.py::RBLNQuantizationConfig
QUANT_SUPPORTED = {
    "format": ["rbln"],
    "weights": ["int4", "int8", "fp8", "fp16"],
    "activations": ["int8", "fp8", "fp16"],
    "kv_caches": ["fp8", "fp16"],
}
QUANT_KEYS = ("format", "weights", "activations", "kv_caches", "dynamic", "precision")
QUANT_DEFAULTS = {"format": "rbln", "weights": "fp16", "activations": "fp16", "kv_caches": "fp16"}


def kv_block_counts(max_seq_len: int, block: int, batch_size: int, attn_impl: str) -> tuple[int, int]:
    """(num_full_blocks, num_min_blocks) exactly as optimum-rbln's RBLNDecoderOnlyModelConfig computes them."""
    full = (max_seq_len // block) * batch_size
    if attn_impl == "flash_attn":
        return full, min(max(max_seq_len // block, batch_size) + 1, full)
    return full, batch_size


def default_attn_impl(partition: Any) -> str:
    """optimum-rbln picks flash attention when a partition length is given, eager otherwise."""
    return "flash_attn" if partition is not None else "eager"


def default_block_size(attn_impl: str, partition: Any, max_seq_len: Any) -> Any:
    """The KV block is the partition with flash attention, the whole sequence with eager."""
    return partition if attn_impl == "flash_attn" else max_seq_len


def default_prefill_chunk(npu: str) -> int:
    """optimum-rbln's prefill chunk: 512 on REBEL (RBLN-CR*) NPUs, 128 on ATOM or an unrecorded target."""
    return 512 if npu.startswith("RBLN-CR") else 128


def quant_with_defaults(values: dict[str, Any]) -> dict[str, Any]:
    """RBLNQuantizationConfig's fields with unset ones filled in (format rbln, everything else fp16)."""
    return {name: values.get(name) or default for name, default in QUANT_DEFAULTS.items()}
