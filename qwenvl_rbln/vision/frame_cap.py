"""The per-frame pixel cap of videos: every temporal patch fits the largest compiled ViT bucket.

Qwen3-VL's video processor caps the pixels over all sampled frames (``smart_resize`` in transformers'
``video_processing_qwen3_vl.py``: ``t_bar * h * w <= size.longest_edge``), so a short video keeps large frames:
with the shipped 25,165,824 and 4 sampled frames a frame may hold 6.3 M px, 24,128 patches per temporal patch,
beyond a 16,384-patch bucket. Lowering that budget for everyone would shrink long videos too (a 5-minute video's
frames are already small). qvl adds a second, per-frame cap ``max_frame_pixels`` (the largest bucket x 16^2 by
default) and applies it the only way transformers' own resize allows: for a video of ``T`` sampled frames the
budget handed to ``smart_resize`` becomes ``min(longest_edge, max_frame_pixels * min(T, t_bar))``. A long video's
budget is untouched (its frames are far below the cap); a short one is resized so each frame fits.

Two video processor families can load for a Qwen3-VL checkpoint (transformers 5.15.1), and their ``resize`` differ:

* ``Qwen3VLVideoProcessor`` (the shipped ``video_preprocessor_config.json``, or the model type's default):
  ``resize(videos, size, resample, factor, temporal_factor)``, a budget over all frames (``CLIP``);
* ``Qwen2VLVideoProcessor``: what ``AutoVideoProcessor`` infers from ``preprocessor_config.json``'s
  ``Qwen2VLImageProcessor`` when the checkpoint has no video processor config:
  ``resize(videos, size, resample, factor)``, the image ``smart_resize`` on each frame (``FRAME``), so the cap
  is simply ``min(longest_edge, max_frame_pixels)``.

The wrapper binds the call to the wrapped ``resize``'s own signature (never by position), so either family, and a
subclass that adds parameters, gets the same cap. Any other class is not capped: ``family`` says None, and
``qvl infer`` refuses it before a model loads (``inference/inputs.py``).

The same function decides qvl's geometry (``geometry.video_geometry``) and the processor's resize, so prediction
and processing agree by construction; ``tests/test_fuzz_caps.py`` checks it against transformers.

``install_on_instance`` wraps one loaded video processor (``qvl infer``); ``install_on_class`` patches both classes,
reading the cap from each processor's ``qvl_max_frame_pixels`` attribute, which ``qvl compile`` writes into the
artifact's video processor config, or from ``set_default_cap`` (the vLLM plugin's ``QVL_MAX_FRAME_PIXELS``, for
processor files written outside qvl): the smaller of the two holds. No torch or transformers import at module level.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
from typing import Any

ATTRIBUTE = "qvl_max_frame_pixels"  # the video processor config key and attribute the patched resize reads
CLIP = "clip"  # the pixel budget covers all sampled frames (Qwen3VLVideoProcessor)
FRAME = "frame"  # the pixel budget is per frame (Qwen2VLVideoProcessor)
FAMILIES = {"Qwen3VLVideoProcessor": CLIP, "Qwen2VLVideoProcessor": FRAME}  # class name -> family, MRO searched
CLASSES = (  # (module, class) install_on_class patches
    ("transformers.models.qwen3_vl.video_processing_qwen3_vl", "Qwen3VLVideoProcessor"),
    ("transformers.models.qwen2_vl.video_processing_qwen2_vl", "Qwen2VLVideoProcessor"),
)
_default_cap: int | None = None  # set_default_cap: every patched processor without a smaller cap of its own


def family(video_processor_class: type) -> str | None:
    """``CLIP`` or ``FRAME`` for a class of (or derived from) a known Qwen video processor; None for any other."""
    for klass in getattr(video_processor_class, "__mro__", ()):
        if klass.__name__ in FAMILIES:
            return FAMILIES[klass.__name__]
    return None


def video_budget(
    num_frames: int,
    min_pixels: int,
    max_pixels: int,
    max_frame_pixels: int | None,
    temporal_factor: int = 2,
    per_frame: bool = False,
    *,
    height: int | None = None,
    width: int | None = None,
    factor: int = 32,
) -> tuple[int, int]:
    """``(min_pixels, max_pixels)`` for the video ``smart_resize`` of ``num_frames`` sampled frames under the cap.

    ``smart_resize`` keeps ``t_bar * h * w`` within the budget (or, when over it, ``h * w <= budget / T``), with
    ``t_bar = round(T / 2) * 2``; a budget of ``cap * min(T, t_bar)`` therefore keeps every frame within ``cap``.
    ``per_frame`` (the ``FRAME`` family): the budget is one frame's, so it is ``min(max_pixels, cap)``.
    With the frame's ``height`` and ``width``, a thin frame is held to the cap too (``floor_safe_budget``).
    """
    if not max_frame_pixels or (not per_frame and num_frames < temporal_factor):
        return min_pixels, max_pixels
    if per_frame:
        budget = max_frame_pixels
    else:
        t_bar = round(num_frames / temporal_factor) * temporal_factor
        budget = max_frame_pixels * min(num_frames, t_bar)
    budget = min(budget, max_pixels)
    if height and width:
        budget = floor_safe_budget(
            budget, height, width, num_frames, max_frame_pixels, factor, per_frame, temporal_factor
        )
    if budget >= max_pixels:
        return min_pixels, max_pixels
    return min(min_pixels, budget), budget


def floor_safe_budget(
    budget: int,
    height: int,
    width: int,
    num_frames: int,
    cap: int,
    factor: int = 32,
    per_frame: bool = False,
    temporal_factor: int = 2,
) -> int:
    """``budget``, lowered for a thin frame so transformers' ``factor``-px minimum side cannot lift it over ``cap``.

    ``smart_resize`` keeps each side at least ``factor`` px (``max(factor, floor(side / beta / factor) * factor)``),
    so with a small cap (a largest bucket below 800 patches) a frame of aspect ratio above ``bucket / 4`` came out
    at ``factor`` x ``16 sqrt(ratio x bucket)`` px, over the cap (sources audit W5: bucket 512, 484x96,300 gave 636
    patches). Then the budget becomes ``t * short * L^2 / long`` with ``L`` the longest side a ``factor``-wide frame
    may have within the cap: the long side resizes to at most ``L`` and the frame fits. Every other frame keeps
    ``budget`` (the floor does not fire for it, and the budget already keeps it within the cap).
    """
    if not per_frame and (height < factor or width < factor):  # the Qwen3-VL video resize scales these up first
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    t = 1 if per_frame else num_frames
    t_bar = 1 if per_frame else round(num_frames / temporal_factor) * temporal_factor
    if t_bar * (round(height / factor) * factor) * (round(width / factor) * factor) <= budget:
        return budget  # not downscaled: the floor does not apply
    short, long = sorted((height, width))
    beta = math.sqrt(t * height * width / budget)
    if math.floor(short / beta / factor) >= 1 or factor * (math.floor(long / beta / factor) * factor) <= cap:
        return budget
    most = cap // (factor * factor) * factor  # the longest side a factor-wide frame may have within the cap
    return max(1, math.floor(t * short * most * most / long))


def set_default_cap(max_frame_pixels: int | None) -> None:
    """The cap for every patched processor that has none of its own, or a larger one (None: no default)."""
    global _default_cap
    _default_cap = max_frame_pixels if max_frame_pixels and max_frame_pixels > 0 else None


def _cap_of(processor: Any) -> int | None:
    own = getattr(processor, ATTRIBUTE, None)
    caps = [int(c) for c in (own, _default_cap) if isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0]
    return min(caps) if caps else None


def _capped_size(
    processor: Any, size: Any, shape: tuple[int, ...], factor: int, temporal_factor: int, kind: str
) -> Any:
    cap = _cap_of(processor)
    if not cap or size is None or not getattr(size, "longest_edge", None):
        return size
    num_frames, height, width = int(shape[1]), int(shape[-2]), int(shape[-1])
    lo, hi = video_budget(
        num_frames,
        size.shortest_edge,
        size.longest_edge,
        cap,
        temporal_factor,
        kind == FRAME,
        height=height,
        width=width,
        factor=factor,
    )
    if (lo, hi) == (size.shortest_edge, size.longest_edge):
        return size
    return type(size)(shortest_edge=lo, longest_edge=hi)


def _wrap(resize: Any, kind: str) -> Any:
    """``resize`` with the cap applied to its ``size``; arguments bound by ``resize``'s own signature."""
    signature = inspect.signature(resize)

    @functools.wraps(resize)
    def resize_capped(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        videos, size = bound.arguments.get("videos"), bound.arguments.get("size")
        if videos is not None and len(getattr(videos, "shape", ())) >= 4:  # (batch, frames, [channels,] h, w)
            factor = int(bound.arguments.get("factor") or 32)
            temporal_factor = int(bound.arguments.get("temporal_factor") or 2)
            bound.arguments["size"] = _capped_size(self, size, tuple(videos.shape), factor, temporal_factor, kind)
        return resize(*bound.args, **bound.kwargs)

    resize_capped.__qvl_frame_cap__ = True  # type: ignore[attr-defined]
    return resize_capped


def install_on_instance(video_processor: Any, max_frame_pixels: int | None) -> bool:
    """Cap one loaded video processor's frames at ``max_frame_pixels`` (None: no cap). False when it has no
    resize, or is of no family qvl knows (``family``: its resize is left alone)."""
    if video_processor is None or not hasattr(type(video_processor), "resize"):
        return False
    kind = family(type(video_processor))
    if kind is None:
        return False
    setattr(video_processor, ATTRIBUTE, max_frame_pixels)
    if not getattr(type(video_processor).resize, "__qvl_frame_cap__", False):
        video_processor.resize = types.MethodType(_wrap(type(video_processor).resize, kind), video_processor)
    return True


def install_on_class() -> bool:
    """Patch ``resize`` of transformers' Qwen3-VL and Qwen2-VL video processor classes (once each): every instance
    with a cap (its config's ``qvl_max_frame_pixels``, or ``set_default_cap``) is capped, every other one runs
    unchanged. False when already installed on both."""
    import importlib

    patched = False
    for module, name in CLASSES:
        klass = getattr(importlib.import_module(module), name)
        if getattr(klass.resize, "__qvl_frame_cap__", False):
            continue
        klass.resize = _wrap(klass.resize, FAMILIES[name])
        patched = True
    return patched
