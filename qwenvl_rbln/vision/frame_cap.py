"""The per-frame pixel cap of videos: every temporal patch fits the largest compiled ViT bucket.

Qwen3-VL's video processor caps the pixels over all sampled frames (``smart_resize`` in transformers'
``video_processing_qwen3_vl.py``: ``t_bar * h * w <= size.longest_edge``), so a short video keeps large frames:
with the shipped 25,165,824 and 4 sampled frames a frame may hold 6.3 M px, 24,128 patches per temporal patch,
beyond a 16,384-patch bucket. Lowering that budget for everyone would shrink long videos too (a 5-minute video's
frames are already small). qvl adds a second, per-frame cap ``max_frame_pixels`` (the largest bucket x 16^2 by
default) and applies it the only way transformers' own resize allows: for a video of ``T`` sampled frames the
budget handed to ``smart_resize`` becomes ``min(longest_edge, max_frame_pixels * min(T, t_bar))``. A long video's
budget is untouched (its frames are far below the cap); a short one is resized so each frame fits.

The same function decides qvl's geometry (``geometry.video_geometry``) and the processor's resize (``install``), so
prediction and processing agree by construction; ``tests/test_fuzz_caps.py`` checks it against transformers.

``install_on_instance`` wraps one loaded ``Qwen3VLVideoProcessor`` (``qvl infer``); ``install_on_class`` patches the
class, reading the cap from each processor's ``qvl_max_frame_pixels`` attribute, which ``qvl compile`` writes into the
artifact's video processor config (the vLLM plugin). No torch or transformers import at module level.
"""

from __future__ import annotations

import types
from typing import Any

ATTRIBUTE = "qvl_max_frame_pixels"  # the video processor config key and attribute the patched resize reads


def video_budget(
    num_frames: int,
    min_pixels: int,
    max_pixels: int,
    max_frame_pixels: int | None,
    temporal_factor: int = 2,
) -> tuple[int, int]:
    """``(min_pixels, max_pixels)`` for the video ``smart_resize`` of ``num_frames`` sampled frames under the cap.

    ``smart_resize`` keeps ``t_bar * h * w`` within the budget (or, when over it, ``h * w <= budget / T``), with
    ``t_bar = round(T / 2) * 2``; a budget of ``cap * min(T, t_bar)`` therefore keeps every frame within ``cap``.
    """
    if not max_frame_pixels or num_frames < temporal_factor:
        return min_pixels, max_pixels
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    budget = max_frame_pixels * min(num_frames, t_bar)
    if budget >= max_pixels:
        return min_pixels, max_pixels
    return min(min_pixels, budget), budget


def _capped_size(processor: Any, size: Any, num_frames: int, temporal_factor: int) -> Any:
    cap = getattr(processor, ATTRIBUTE, None)
    if not cap or size is None or not getattr(size, "longest_edge", None):
        return size
    lo, hi = video_budget(num_frames, size.shortest_edge, size.longest_edge, int(cap), temporal_factor)
    if (lo, hi) == (size.shortest_edge, size.longest_edge):
        return size
    return type(size)(shortest_edge=lo, longest_edge=hi)


def _wrap(resize: Any) -> Any:
    def resize_capped(self: Any, videos: Any, size: Any, resample: Any, factor: int, temporal_factor: int, **kw: Any):
        size = _capped_size(self, size, int(videos.shape[1]), temporal_factor)
        return resize(self, videos, size=size, resample=resample, factor=factor, temporal_factor=temporal_factor, **kw)

    resize_capped.__qvl_frame_cap__ = True  # type: ignore[attr-defined]
    resize_capped.__wrapped__ = resize  # type: ignore[attr-defined]
    return resize_capped


def install_on_instance(video_processor: Any, max_frame_pixels: int | None) -> bool:
    """Cap one loaded video processor's frames at ``max_frame_pixels`` (None: no cap). False when it has no resize."""
    if video_processor is None or not hasattr(type(video_processor), "resize"):
        return False
    setattr(video_processor, ATTRIBUTE, max_frame_pixels)
    if not getattr(type(video_processor).resize, "__qvl_frame_cap__", False):
        video_processor.resize = types.MethodType(_wrap(type(video_processor).resize), video_processor)
    return True


def install_on_class() -> bool:
    """Patch transformers' ``Qwen3VLVideoProcessor.resize`` (once): every instance whose config carries
    ``qvl_max_frame_pixels`` is capped, every other one runs unchanged. False when already installed."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    if getattr(Qwen3VLVideoProcessor.resize, "__qvl_frame_cap__", False):
        return False
    Qwen3VLVideoProcessor.resize = _wrap(Qwen3VLVideoProcessor.resize)
    return True
