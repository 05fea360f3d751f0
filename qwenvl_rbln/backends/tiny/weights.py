"""The tiny model's Qwen3-VL pieces: dimensions, config, processor, generation config and the seeded weights.

Its own module because these say what the tiny model *is* (the real Qwen3-VL architecture, shrunk), apart from
its tokenizer (``tiny.tokenizer``) and from where and how the directory is written (``tiny.model``). Heavy
imports (torch, transformers) happen inside functions only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qwenvl_rbln.backends.tiny.tokenizer import QWEN3_VL_CHAT_TEMPLATE, QWEN_ADDED_TOKENS, VOCAB_SIZE, build_tokenizer

# Model dimensions: the real Qwen3-VL layout, shrunk. mrope_section sums to head_dim // 2 and keeps
# the real T>H=W split ([24, 20, 20] for head_dim 128).
TEXT_DIMS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_theta": 5_000_000.0,
    "mrope_section": [4, 2, 2],
}
VISION_DIMS: dict[str, Any] = {
    "depth": 3,
    "hidden_size": 64,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 128,
    "num_heads": 4,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [0, 1, 2],
}
# Same processor settings as the shipped Qwen3-VL preprocessor_config.json / video_preprocessor_config.json.
IMAGE_SIZE = {"shortest_edge": 65536, "longest_edge": 16777216}
VIDEO_SIZE = {"shortest_edge": 4096, "longest_edge": 25165824}
# Weight init std: 1/sqrt(hidden) (unit-gain layers) instead of the usual 0.02. At 0.02 a tiny model
# with tied embeddings just echoes its last prompt token forever, whatever the image; at unit gain the
# greedy output depends on the image and the prompt, which backend-vs-backend comparisons need.
INIT_RANGE = 0.125


def build_config(tokenizer: Any) -> Any:
    """Qwen3VLConfig with the tiny dims and token ids taken from ``tokenizer``."""
    from transformers import Qwen3VLConfig

    names = [t for t, _ in QWEN_ADDED_TOKENS]
    ids = dict(zip(names, tokenizer.convert_tokens_to_ids(names), strict=True))
    t = TEXT_DIMS
    text_config = {
        "vocab_size": VOCAB_SIZE,
        **{k: v for k, v in t.items() if k not in ("rope_theta", "mrope_section")},
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": t["rope_theta"],
            "mrope_section": list(t["mrope_section"]),
            "mrope_interleaved": True,
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": INIT_RANGE,
        "use_cache": True,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "tie_word_embeddings": True,
        "dtype": "float32",
    }
    vision_config = {**VISION_DIMS, "out_hidden_size": t["hidden_size"], "initializer_range": INIT_RANGE}
    config = Qwen3VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    config.dtype = "float32"
    return config


def build_processor(tokenizer: Any) -> Any:
    """Qwen3VLProcessor with the shipped Qwen3-VL image/video settings and the real chat template."""
    from transformers import Qwen3VLProcessor, Qwen3VLVideoProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    common = {
        "patch_size": VISION_DIMS["patch_size"],
        "temporal_patch_size": VISION_DIMS["temporal_patch_size"],
        "merge_size": VISION_DIMS["spatial_merge_size"],
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_convert_rgb": True,
    }
    image_processor = Qwen2VLImageProcessor(size=dict(IMAGE_SIZE), **common)
    video_processor = Qwen3VLVideoProcessor(
        size=dict(VIDEO_SIZE), fps=2, min_frames=4, max_frames=768, do_sample_frames=True, **common
    )
    return Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=QWEN3_VL_CHAT_TEMPLATE,
    )


def _generation_config(tokenizer: Any) -> Any:
    """The shipped Qwen3-VL Instruct sampling defaults; callers wanting greedy pass do_sample=False."""
    from transformers import GenerationConfig

    eos, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    return GenerationConfig(
        bos_token_id=eos,
        pad_token_id=eos,
        eos_token_id=[im_end, eos],
        do_sample=True,
        top_k=20,
        top_p=0.8,
        temperature=0.7,
        repetition_penalty=1.0,
    )


def _add_legacy_rope_keys(config_path: Path) -> None:
    """Also spell RoPE the way the shipped checkpoints (and transformers < 5) do.

    transformers 5 writes ``rope_parameters``; Hub checkpoints carry ``rope_scaling`` + ``rope_theta``,
    which 5.x still reads (to the same values). Writing both keeps the tiny model readable by
    4.x-era tooling such as optimum-rbln.
    """
    data = json.loads(config_path.read_text(encoding="utf-8"))
    text = data["text_config"]
    rope = text["rope_parameters"]
    text["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    text["rope_theta"] = rope["rope_theta"]
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_checkpoint(tmp: Path, seed: int, moe: bool = False, shape: str = "2b") -> None:
    """The Hugging Face files of the tiny model in ``tmp``: seeded random weights, config, generation config,
    tokenizer and processor (the qvl marker is written by ``tiny_model``); ``moe``: the Qwen3-VL-MoE variant;
    ``shape`` "8b": untied lm_head and a narrower ViT (``tiny.untied``)."""
    import torch
    from transformers.utils import logging as hf_logging

    from qwenvl_rbln.backends.tiny.moe import model_class, moe_config_from
    from qwenvl_rbln.backends.tiny.untied import untied_config_from

    tokenizer = build_tokenizer()
    config = build_config(tokenizer)
    if moe:
        config = moe_config_from(config)
    elif shape == "8b":
        config = untied_config_from(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(moe)(config).to(torch.float32).eval()
    model.generation_config = _generation_config(tokenizer)
    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar on stderr for a 3 MB file
    try:
        model.save_pretrained(tmp)
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    _add_legacy_rope_keys(tmp / "config.json")
    build_processor(tokenizer).save_pretrained(tmp)
