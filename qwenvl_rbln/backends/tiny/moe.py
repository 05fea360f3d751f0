"""The tiny Qwen3-VL-MoE: the real ``qwen3_vl_moe`` architecture, shrunk, for the emulated MoE path.

Why its own module: the MoE checkpoint differs from the dense tiny model only in the text config (experts,
router, one dense ``mlp_only_layers`` entry) and in the transformers class, and the dense tiny model must stay
byte-for-byte what it was. The numbers exercise every branch optimum-rbln 0.12's MoE wrapper takes
(``qwen3_vl_moe_architecture.py``: ``Qwen3VLMoeLayer`` keeps a dense MLP for a non-sparse layer,
``Qwen3VLMoeSparseMoeBlock`` for the others): top-k (2) below the expert count (4), layer 1 dense.
"""

from __future__ import annotations

from typing import Any

# Added to the dense tiny text dims (weights.TEXT_DIMS); names as in Qwen3VLMoeTextConfig / config.json.
MOE_TEXT_DIMS: dict[str, Any] = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [1],
    "norm_topk_prob": True,
}
MOE_ARCHITECTURE = "Qwen3VLMoeForConditionalGeneration"


def moe_config_from(dense: Any) -> Any:
    """Qwen3VLMoeConfig with the dense tiny config's dims, token ids and vision tower, plus the MoE fields."""
    from transformers import Qwen3VLMoeConfig

    from qwenvl_rbln.backends.tiny.derive import derived_config

    return derived_config(
        dense,
        Qwen3VLMoeConfig,
        text=MOE_TEXT_DIMS,
        vision={},
        tie_word_embeddings=True,
        architectures=[MOE_ARCHITECTURE],
    )


def model_class(moe: bool) -> Any:
    """The transformers class the tiny checkpoint is built and saved with."""
    if moe:
        from transformers import Qwen3VLMoeForConditionalGeneration

        return Qwen3VLMoeForConditionalGeneration
    from transformers import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration
