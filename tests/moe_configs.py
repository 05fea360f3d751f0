"""Qwen3-VL-MoE config.json files for tests, in the shipped layout (no downloads): the built-in geometries
written back as a checkpoint's config.json would carry them."""

from __future__ import annotations

from typing import Any


def config_json(geometry: Any) -> dict[str, Any]:
    """A Qwen3-VL-MoE config.json in the shipped layout (keys as in Qwen/Qwen3-VL-30B-A3B-Instruct's)."""
    t, v, m = geometry.text, geometry.vision, geometry.text.moe
    deepstack = {27: [8, 16, 24]}.get(v.depth, list(range(v.num_deepstack)))
    return {
        "architectures": ["Qwen3VLMoeForConditionalGeneration"],
        "model_type": "qwen3_vl_moe",
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "tie_word_embeddings": t.tie_word_embeddings,
        "text_config": {
            "model_type": "qwen3_vl_moe_text",
            "hidden_size": t.hidden_size,
            "num_hidden_layers": t.num_hidden_layers,
            "num_attention_heads": t.num_attention_heads,
            "num_key_value_heads": t.num_key_value_heads,
            "head_dim": t.head_dim,
            "intermediate_size": t.intermediate_size,
            "vocab_size": t.vocab_size,
            "max_position_embeddings": t.max_position_embeddings,
            "num_experts": m.num_experts,
            "num_experts_per_tok": m.num_experts_per_tok,
            "moe_intermediate_size": m.moe_intermediate_size,
            "decoder_sparse_step": m.decoder_sparse_step,
            "mlp_only_layers": list(m.mlp_only_layers),
            "norm_topk_prob": True,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
            "rope_theta": 5000000,
            "dtype": "bfloat16",
        },
        "vision_config": {
            "model_type": "qwen3_vl_moe",
            "depth": v.depth,
            "hidden_size": v.hidden_size,
            "num_heads": v.num_heads,
            "intermediate_size": v.intermediate_size,
            "out_hidden_size": v.out_hidden_size,
            "patch_size": v.patch_size,
            "spatial_merge_size": v.spatial_merge_size,
            "temporal_patch_size": v.temporal_patch_size,
            "in_channels": v.in_channels,
            "num_position_embeddings": v.num_position_embeddings,
            "deepstack_visual_indexes": deepstack,
            "hidden_act": "gelu_pytorch_tanh",
        },
        "dtype": "bfloat16",
    }
