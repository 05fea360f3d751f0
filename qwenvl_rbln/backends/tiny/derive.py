"""A tiny variant's config: the dense tiny config with some text or vision dims changed.

Why one function: every variant (MoE, 8B-shaped) must keep the dense tiny model's token ids and the dims it does not
change, so that the dense tiny model stays byte-for-byte what it was and each variant differs only where it says.
"""

from __future__ import annotations

from typing import Any

_NOT_COPIED = ("model_type", "architectures")


def derived_config(
    dense: Any,
    config_cls: Any,
    *,
    text: dict[str, Any],
    vision: dict[str, Any],
    tie_word_embeddings: bool,
    architectures: list[str],
) -> Any:
    """``config_cls`` (a transformers Qwen3-VL config class) built from ``dense``'s text and vision configs updated
    with ``text`` / ``vision``, its image/video token ids, and the given tying and architectures, in fp32."""
    data = dense.to_dict()
    text_cfg = {k: v for k, v in data["text_config"].items() if k not in _NOT_COPIED} | text
    vision_cfg = {k: v for k, v in data["vision_config"].items() if k not in _NOT_COPIED} | vision
    config = config_cls(
        text_config=text_cfg,
        vision_config=vision_cfg,
        image_token_id=dense.image_token_id,
        video_token_id=dense.video_token_id,
        vision_start_token_id=dense.vision_start_token_id,
        vision_end_token_id=dense.vision_end_token_id,
        tie_word_embeddings=tie_word_embeddings,
    )
    config.architectures = architectures
    config.dtype = "float32"
    return config
