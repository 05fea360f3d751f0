"""The parameter counts and weight dtypes the memory planner reads, under their old home.

The counts live in ``planning.catalogue.params`` (pure geometry), so the plan's own checks can quote the same
figures the memory report shows (a quantized Qwen3-VL-MoE is refused with its float32 size); this module keeps
the memory layer's imports short.
"""

from __future__ import annotations

from qwenvl_rbln.planning.catalogue.params import (
    QUANT_MODEL_DTYPE,
    QUANT_WEIGHT_BYTES,
    RBLN_DTYPE_BYTES,
    lm_params,
    merger_params,
    moe_counts,
    quantizable_layer_params,
    quantized_lm_weight_bytes,
    quantized_out_features,
    text_layer_params,
    vision_block_params,
    vision_params,
)

__all__ = [
    "QUANT_MODEL_DTYPE",
    "QUANT_WEIGHT_BYTES",
    "RBLN_DTYPE_BYTES",
    "lm_params",
    "merger_params",
    "moe_counts",
    "quantizable_layer_params",
    "quantized_lm_weight_bytes",
    "quantized_out_features",
    "text_layer_params",
    "vision_block_params",
    "vision_params",
]
