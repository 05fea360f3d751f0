"""The compiled context as a shape: LM tokens of an input against ``max_seq_len``, before anything runs.

A prompt longer than the compiled ``max_seq_len`` cannot run on the NPU, like a ViT segment above the largest
bucket. ``qvl infer`` counts each prompt exactly with the tokenizer; `bucket-plan` and `qvl serve` read headers only,
so they count an input's own tokens (its pad tokens, the vision start/end pair around each image or temporal patch,
and a video's ``<t seconds>`` timestamps counted as one token per character: an upper bound) and keep
``RESERVE_TOKENS`` free for the chat template, the prompt text and the output. What they refuse, infer refuses too;
both say it with ``length_message``.
"""

from __future__ import annotations

from typing import Any

# The chat template (about 20 tokens: system and user turn markers, the assistant header), a prompt of about
# 40 tokens and qvl infer's default --max-new-tokens 64, rounded up: what an input must leave free in the context.
RESERVE_TOKENS = 128
DELIMITERS = 2  # <|vision_start|> ... <|vision_end|> around each image and each temporal patch


def length_message(
    who: str, prompt_tokens: int, max_new_tokens: int, max_seq_len: int, media_tokens: int = 0, new: str = ""
) -> str:
    """The one sentence for a prompt that does not fit the compiled context (``infer`` and ``bucket-plan``)."""
    media = f" ({media_tokens} of them for its images/videos)" if media_tokens else ""
    new = new or f"--max-new-tokens {max_new_tokens}"
    return (
        f"{who}: prompt of {prompt_tokens} tokens{media} + {new} = {prompt_tokens + max_new_tokens} "
        f"exceeds the compiled max_seq_len {max_seq_len}"
    )


LENGTH_FIX = (
    "shorten the prompt or shrink the media (lower processor.max_pixels / video_max_pixels / fps / max_frames), or "
    "recompile with a larger rbln_config.max_seq_len"
)


def image_tokens(lm_tokens: int) -> int:
    """The tokens one image puts in the prompt: its pads and the start/end pair."""
    return lm_tokens + DELIMITERS


def video_tokens(lm_tokens: int, temporal_patches: int, total_frames: int, fps: float | None) -> int:
    """An upper bound of the tokens one video puts in the prompt: pads, a start/end pair and a ``<t seconds>``
    timestamp per temporal patch (each character counted as a token; the last timestamp is the longest)."""
    duration = total_frames / fps if fps else total_frames / 24  # transformers assumes 24 fps without metadata
    stamp = len(f"<{duration:.1f} seconds>")
    return lm_tokens + temporal_patches * (DELIMITERS + stamp)


def item_fit(tokens: int, max_seq_len: int, reserve: int = RESERVE_TOKENS) -> dict[str, Any]:
    """An input's tokens against the context less the reserve: the per-item ``lm_fit`` of bucket-plan."""
    room = max_seq_len - reserve
    return {"tokens": tokens, "max_seq_len": max_seq_len, "reserve": reserve, "room": room, "fits": tokens <= room}


def items_per_context(tokens: int, max_seq_len: int, reserve: int = RESERVE_TOKENS) -> int:
    """How many inputs of ``tokens`` each fit one prompt with the reserve left free (0: not even one)."""
    return max(0, (max_seq_len - reserve) // max(1, tokens))
