"""The tiny Qwen3-VL shaped like the 8B and 32B: an untied ``lm_head`` and a ViT narrower than the text.

Why its own module: the dense tiny model mirrors the 2B (tied word embeddings, ViT hidden = text hidden =
out_hidden_size), so the paths the 8B/32B take (a separate ``lm_head`` weight in the LM graph, a merger that maps
the ViT's 48 x 4 merged channels to the text's 64) would otherwise never run on a CPU. The dense tiny model must stay
byte-for-byte what it was, so this variant changes only the config it starts from. The ViT keeps the 8B's layout
scaled down: depth 27 with deepstack [8, 16, 24] becomes depth 4 with [1, 2, 3]; hidden 1152 vs text 4096 becomes 48
vs 64 (4 heads of 12), intermediate 4304 (3.7x) becomes 96 (2x).
"""

from __future__ import annotations

from typing import Any

VISION_8B_DIMS: dict[str, Any] = {
    "depth": 4,
    "hidden_size": 48,
    "num_heads": 4,
    "intermediate_size": 96,
    "deepstack_visual_indexes": [1, 2, 3],
}


def untied_config_from(dense: Any) -> Any:
    """Qwen3VLConfig with the dense tiny config's text dims and token ids, an untied lm_head and the 8B-shaped ViT
    (out_hidden_size stays the text hidden size, as in every Qwen3-VL)."""
    from transformers import Qwen3VLConfig

    from qwenvl_rbln.backends.tiny.derive import derived_config

    return derived_config(
        dense,
        Qwen3VLConfig,
        text={"tie_word_embeddings": False},
        vision=VISION_8B_DIMS,
        tie_word_embeddings=False,
        architectures=list(dense.architectures),
    )
