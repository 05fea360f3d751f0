"""Exact Qwen3-VL preprocessing geometry, without torch or transformers.

The planner must know, before anything is loaded, how many ViT patches and LM tokens an
image or video becomes, because that decides the ViT bucket and the LM sequence length.
Every formula here mirrors transformers 5.15.1 line for line:

* images: ``transformers/models/qwen2_vl/image_processing_qwen2_vl.py::smart_resize``
  (used by ``Qwen2VLImageProcessor`` / ``Qwen2VLImageProcessorPil`` for ``qwen3_vl``);
* videos: ``transformers/models/qwen3_vl/video_processing_qwen3_vl.py`` (``sample_frames``,
  its own ``smart_resize`` and ``patchify``).

Python's ``round`` is banker's rounding (``round(2.5) == 2``), as in transformers; it matters
for sizes that are an odd multiple of ``factor / 2`` and for odd frame counts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.vision.frame_cap import video_budget

# Shipped Qwen3-VL preprocessor_config.json (image processor).
IMAGE_MIN_PIXELS = 65536  # size.shortest_edge
IMAGE_MAX_PIXELS = 16777216  # size.longest_edge
# Shipped Qwen3-VL video_preprocessor_config.json.
VIDEO_MIN_PIXELS = 4096  # size.shortest_edge (budget over all frames)
VIDEO_MAX_PIXELS = 25165824  # size.longest_edge (budget over all frames)
VIDEO_FPS = 2
VIDEO_MIN_FRAMES = 4
VIDEO_MAX_FRAMES = 768

PATCH_SIZE = 16
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
FACTOR = PATCH_SIZE * MERGE_SIZE  # 32: resized sides are multiples of this
MAX_ASPECT_RATIO = 200
# Qwen3VLVideoProcessor.sample_frames assumes this when the video has no fps metadata.
ASSUMED_VIDEO_FPS = 24


def _check_positive(height: float, width: float) -> None:
    if height <= 0 or width <= 0:
        raise InputError(
            f"size {width}x{height} (WxH) has a zero or negative side",
            "pass an image/video with positive width and height",
        )


def _check_aspect(height: float, width: float, shown: tuple[float, float] | None = None) -> None:
    """InputError when ``height``/``width`` (as transformers tests them) exceed the aspect limit; the message
    names ``shown`` (the input's own WxH, when the test runs on an upscaled copy) or the tested size."""
    _check_positive(height, width)
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        w, h = shown or (width, height)
        raise InputError(
            f"size {w}x{h} (WxH) has aspect ratio {ratio:.1f}, over Qwen3-VL's limit of {MAX_ASPECT_RATIO}",
            f"crop or pad it so the long side is at most {MAX_ASPECT_RATIO}x the short side",
        )


def smart_resize(
    height: int,
    width: int,
    factor: int = FACTOR,
    min_pixels: int = IMAGE_MIN_PIXELS,
    max_pixels: int = IMAGE_MAX_PIXELS,
) -> tuple[int, int]:
    """Return ``(resized_height, resized_width)`` exactly as transformers' image ``smart_resize``.

    Height first, like transformers. Both sides become multiples of ``factor`` and the area lands
    in ``[min_pixels, max_pixels]`` (except where the ``max(factor, ...)`` floor kicks in for
    extreme aspect ratios). Aspect ratio > 200 raises ``InputError`` (transformers: ValueError).
    """
    _check_aspect(height, width)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ImageGeometry:
    """What one image becomes: one ViT call of ``patches`` rows, ``lm_tokens`` image-pad tokens."""

    width: int
    height: int
    resized_width: int
    resized_height: int
    grid_h: int
    grid_w: int
    patches: int  # grid_h * grid_w, pre-merge: the ViT sequence length (bucket key)
    lm_tokens: int  # patches // merge_size**2: <|image_pad|> tokens in the LM sequence

    def to_dict(self) -> dict:
        return asdict(self)


def image_geometry(
    width: int,
    height: int,
    *,
    min_pixels: int = IMAGE_MIN_PIXELS,
    max_pixels: int = IMAGE_MAX_PIXELS,
    patch_size: int = PATCH_SIZE,
    merge_size: int = MERGE_SIZE,
) -> ImageGeometry:
    """Geometry of one image of ``width`` x ``height`` (width first; after EXIF transpose).

    Matches ``image_grid_thw == [1, grid_h, grid_w]`` from the Qwen2-VL image processor.
    """
    rh, rw = smart_resize(height, width, factor=patch_size * merge_size, min_pixels=min_pixels, max_pixels=max_pixels)
    grid_h, grid_w = rh // patch_size, rw // patch_size
    patches = grid_h * grid_w
    return ImageGeometry(
        width=width,
        height=height,
        resized_width=rw,
        resized_height=rh,
        grid_h=grid_h,
        grid_w=grid_w,
        patches=patches,
        lm_tokens=patches // merge_size**2,
    )


def sample_frame_count(
    total_frames: int,
    video_fps: float | None,
    *,
    fps: float | None = VIDEO_FPS,
    num_frames: int | None = None,
    min_frames: int = VIDEO_MIN_FRAMES,
    max_frames: int = VIDEO_MAX_FRAMES,
) -> int:
    """Number of frames ``Qwen3VLVideoProcessor.sample_frames`` picks (``len(indices)``).

    With ``fps`` (the default path): ``int(total / video_fps * fps)`` clamped to
    ``[min_frames, max_frames]`` and then to ``total_frames``, so short videos give fewer than
    ``min_frames`` and the count may be odd (the patchifier later repeats the last frame to reach
    a multiple of ``temporal_patch_size``). A missing (or zero) ``video_fps`` is taken as 24,
    as transformers does. ``num_frames`` (exclusive with ``fps``) is used as given; with neither,
    ``min(max(total, min_frames), max_frames)`` -- not capped at ``total``, frames repeat.
    """
    if fps is not None and num_frames is not None:
        raise InputError(
            f"both fps={fps} and num_frames={num_frames} were given for video sampling",
            "pass only one of fps or num_frames",
        )
    if num_frames is None and fps is not None:
        if not video_fps:
            video_fps = ASSUMED_VIDEO_FPS
        num_frames = int(total_frames / video_fps * fps)
        num_frames = min(max(num_frames, min_frames), max_frames, total_frames)
    if num_frames is None:
        num_frames = min(max(total_frames, min_frames), max_frames)
    return num_frames


def video_smart_resize(
    num_frames: int,
    height: int,
    width: int,
    *,
    temporal_factor: int = TEMPORAL_PATCH_SIZE,
    factor: int = FACTOR,
    min_pixels: int = VIDEO_MIN_PIXELS,
    max_pixels: int = VIDEO_MAX_PIXELS,
) -> tuple[int, int]:
    """Return ``(resized_height, resized_width)`` exactly as the Qwen3-VL video ``smart_resize``.

    Differs from the image one: sides below ``factor`` are first scaled up (``int()`` truncation),
    and the pixel budget covers ``t_bar * h * w`` with ``t_bar = round(T / 2) * 2`` (banker's, so
    T=5 budgets 4 frames) while ``beta`` uses the real ``T``. ``num_frames`` is the sampled count.
    """
    if num_frames < temporal_factor:
        raise InputError(
            f"video gives {num_frames} sampled frame(s); Qwen3-VL needs at least {temporal_factor}",
            f"use a video with at least {temporal_factor} frames, or pass a single frame as an image",
        )
    _check_positive(height, width)
    shown = (width, height)  # the input's own size, for the message
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height = int(height * scale)
        width = int(width * scale)
    _check_aspect(height, width, shown)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class VideoGeometry:
    """What one video becomes: ``vit_calls`` ViT calls of ``patches`` rows each, ``lm_tokens`` pads."""

    width: int
    height: int
    total_frames: int
    video_fps: float  # the fps used for sampling (24 when the file had none; see notes)
    sampled_frames: int  # frames the processor picks (may be odd)
    padded_frames: int  # sampled_frames rounded up to temporal_patch_size (last frame repeated)
    temporal_patches: int  # grid_t
    resized_width: int
    resized_height: int
    grid_h: int
    grid_w: int
    patches: int  # grid_h * grid_w per temporal patch: one ViT call's sequence length (bucket key)
    vit_calls: int  # = grid_t: optimum-rbln runs the ViT once per temporal patch
    lm_tokens: int  # grid_t * patches // merge_size**2 <|video_pad|> tokens (timestamps text extra)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d


def video_geometry(
    width: int,
    height: int,
    total_frames: int,
    video_fps: float | None,
    *,
    fps: float | None = VIDEO_FPS,
    min_frames: int = VIDEO_MIN_FRAMES,
    max_frames: int = VIDEO_MAX_FRAMES,
    min_pixels: int = VIDEO_MIN_PIXELS,
    max_pixels: int = VIDEO_MAX_PIXELS,
    patch_size: int = PATCH_SIZE,
    merge_size: int = MERGE_SIZE,
    temporal_patch_size: int = TEMPORAL_PATCH_SIZE,
    max_frame_pixels: int | None = None,
) -> VideoGeometry:
    """Geometry of one video; matches ``video_grid_thw`` of ``Qwen3VLVideoProcessor``.

    ``total_frames`` and ``video_fps`` are the container metadata (what transformers' decoders
    report). Fewer than ``temporal_patch_size`` sampled frames raises ``InputError``.
    ``max_frame_pixels``: qvl's per-frame cap (``frame_cap.video_budget``), as the patched processor applies it.
    """
    notes: list[str] = []
    used_fps = video_fps
    if fps is not None and not video_fps:
        used_fps = ASSUMED_VIDEO_FPS
        notes.append(f"video has no fps metadata; assumed {ASSUMED_VIDEO_FPS} fps as transformers does")
    if total_frames < 1:
        raise InputError(f"video reports {total_frames} frames", "check the file is a complete video")
    sampled = sample_frame_count(total_frames, used_fps, fps=fps, min_frames=min_frames, max_frames=max_frames)
    min_pixels, max_pixels = video_budget(
        sampled,
        min_pixels,
        max_pixels,
        max_frame_pixels,
        temporal_patch_size,
        height=height,
        width=width,
        factor=patch_size * merge_size,
    )
    rh, rw = video_smart_resize(
        sampled,
        height,
        width,
        temporal_factor=temporal_patch_size,
        factor=patch_size * merge_size,
        min_pixels=min_pixels,
        max_pixels=max_pixels,
    )
    padded = sampled + (-sampled % temporal_patch_size)
    if padded != sampled:
        notes.append(f"{sampled} sampled frames padded to {padded} by repeating the last frame")
    grid_t = padded // temporal_patch_size
    grid_h, grid_w = rh // patch_size, rw // patch_size
    patches = grid_h * grid_w
    return VideoGeometry(
        width=width,
        height=height,
        total_frames=total_frames,
        video_fps=float(used_fps) if used_fps else 0.0,
        sampled_frames=sampled,
        padded_frames=padded,
        temporal_patches=grid_t,
        resized_width=rw,
        resized_height=rh,
        grid_h=grid_h,
        grid_w=grid_w,
        patches=patches,
        vit_calls=grid_t,
        lm_tokens=grid_t * patches // merge_size**2,
        notes=tuple(notes),
    )


def max_pixels_for_bucket(bucket: int, patch_size: int = PATCH_SIZE) -> int:
    """Largest image ``max_pixels`` whose images never exceed a ViT bucket of ``bucket`` patches.

    smart_resize keeps ``h * w <= max_pixels`` (the ``max(factor, ...)`` floor only matters for
    buckets below ~800 with aspect ratios near 200), so ``patches <= bucket``.
    """
    return bucket * patch_size**2


def video_max_pixels_for_bucket(
    bucket: int, frames: int, patch_size: int = PATCH_SIZE, temporal_patch_size: int = TEMPORAL_PATCH_SIZE
) -> int:
    """Largest video ``max_pixels`` keeping every ViT call within ``bucket`` for >= ``frames`` sampled frames.

    The video budget is over all frames: per-frame pixels are at most ``max_pixels / min(T, t_bar)``
    where ``t_bar = round(T / 2) * 2`` (banker's rounding makes t_bar < T for T = 3, 5, 9, ...).
    Pass the smallest sampled frame count you will accept (``min_frames`` = 4 by default; shorter
    videos sample fewer frames and then need a smaller budget).
    """
    if frames < temporal_patch_size:
        raise InputError(
            f"frames={frames} is below the temporal patch size {temporal_patch_size}",
            f"pass frames >= {temporal_patch_size}",
        )
    t_bar = round(frames / temporal_patch_size) * temporal_patch_size
    return bucket * patch_size**2 * min(frames, t_bar)


def aspect_limit(max_patches: int, merge_size: int = MERGE_SIZE) -> float:
    """The aspect ratio above which an image resized within ``max_patches`` comes out over it anyway.

    ``smart_resize`` keeps each side at least ``patch_size x merge_size`` px: past the limit the short side stays
    ``merge_size`` patches wide and the long one gets ``merge_size * floor(sqrt(ratio * max_patches) / merge_size)``
    patches, more than ``max_patches`` when ``ratio >= (merge_size * (max_patches // merge_size**2 + 1))**2 /
    max_patches``: about ``max_patches / 4``, so only below 800 patches is it under Qwen3-VL's own limit of 200
    (sources audit W5).
    """
    return (merge_size * (max_patches // merge_size**2 + 1)) ** 2 / max_patches


def _over_max_pixels(
    width: int, height: int, patches: int, caps: Any, max_patches: int, factor: int, merge_size: int
) -> InputError:
    """Why an image resizes over ``max_pixels`` and the fix: its aspect ratio (the minimum side), or the rounding up
    to ``min_pixels`` (a ``min_pixels`` close to ``max_pixels``, as with a largest bucket of 256)."""
    ratio = max(width, height) / min(width, height)
    over = f"resizes to {patches} patches, over processor.max_pixels={caps.max_pixels} ({max_patches} patches)"
    limit = math.floor(aspect_limit(max_patches, merge_size) * 10) / 10
    if ratio > limit:
        return InputError(
            f"size {width}x{height} (WxH) {over}: its aspect ratio {ratio:.1f} is over {limit}, the most that "
            f"many patches hold, since each side stays at least {factor} px",
            f"crop or pad it to an aspect ratio of at most {limit}, or compile a largest ViT bucket of at least 800 "
            "patches (visual.max_seq_len) and raise processor.max_pixels with it",
        )
    return InputError(
        f"size {width}x{height} (WxH) {over}: processor.min_pixels={caps.min_pixels} rounds each side up to a "
        f"multiple of {factor} px",
        f"lower processor.min_pixels, e.g. --set processor.min_pixels={caps.max_pixels // 2}",
    )


def image_geometry_for(
    width: int, height: int, caps: Any, *, patch_size: int = PATCH_SIZE, merge_size: int = MERGE_SIZE
) -> ImageGeometry:
    """image_geometry under a plan's processor caps (anything with min_pixels / max_pixels).

    An image that resizes over ``max_pixels`` is refused, saying why: a plan's ``max_pixels`` is its largest ViT
    bucket's (x 16^2), which the image would overflow. That happens only with small buckets: the minimum side
    (an aspect ratio over ``aspect_limit``; crop or pad it) or ``min_pixels`` rounding up (lower it).
    """
    geo = image_geometry(
        width,
        height,
        min_pixels=caps.min_pixels,
        max_pixels=caps.max_pixels,
        patch_size=patch_size,
        merge_size=merge_size,
    )
    max_patches = caps.max_pixels // patch_size**2
    if geo.patches > max_patches:
        raise _over_max_pixels(width, height, geo.patches, caps, max_patches, patch_size * merge_size, merge_size)
    return geo


def video_geometry_for(
    width: int,
    height: int,
    total_frames: int,
    video_fps: float | None,
    caps: Any,
    *,
    patch_size: int = PATCH_SIZE,
    merge_size: int = MERGE_SIZE,
    temporal_patch_size: int = TEMPORAL_PATCH_SIZE,
) -> VideoGeometry:
    """video_geometry under a plan's processor caps (fps, frame limits, video pixel budget)."""
    return video_geometry(
        width,
        height,
        total_frames,
        video_fps,
        fps=caps.fps,
        min_frames=caps.min_frames,
        max_frames=caps.max_frames,
        min_pixels=caps.video_min_pixels,
        max_pixels=caps.video_max_pixels,
        patch_size=patch_size,
        merge_size=merge_size,
        temporal_patch_size=temporal_patch_size,
        max_frame_pixels=getattr(caps, "video_max_frame_pixels", None),
    )


# --- "capped": one meaning for bucket-plan and infer -------------------------------------------------------------


def image_capped(
    width: int,
    height: int,
    caps: Any,
    stock_max_pixels: int,
    *,
    patch_size: int = PATCH_SIZE,
    merge_size: int = MERGE_SIZE,
) -> bool:
    """True when the caps' ``max_pixels`` made the image smaller than the stock processor's ``max_pixels`` would.

    The meaning of ``capped`` in `bucket-plan` and `infer` alike (a plan's cap, or infer's per-request oversize
    cap): same input, same caps, same answer."""
    if caps.max_pixels >= stock_max_pixels:
        return False
    kw = {"min_pixels": caps.min_pixels, "patch_size": patch_size, "merge_size": merge_size}
    capped = image_geometry(width, height, max_pixels=caps.max_pixels, **kw)
    stock = image_geometry(width, height, max_pixels=stock_max_pixels, **kw)
    return stock.patches > capped.patches


def video_capped(
    width: int,
    height: int,
    total_frames: int,
    video_fps: float | None,
    caps: Any,
    stock_video_max_pixels: int,
    *,
    patch_size: int = PATCH_SIZE,
    merge_size: int = MERGE_SIZE,
    temporal_patch_size: int = TEMPORAL_PATCH_SIZE,
) -> bool:
    """``image_capped`` for a video: the caps' ``video_max_pixels`` and per-frame cap against the stock video
    processor's budget (which has no per-frame cap)."""
    frame_cap = getattr(caps, "video_max_frame_pixels", None)
    if caps.video_max_pixels >= stock_video_max_pixels and not frame_cap:
        return False
    kw = {"patch_size": patch_size, "merge_size": merge_size, "temporal_patch_size": temporal_patch_size}
    capped = video_geometry_for(width, height, total_frames, video_fps, caps, **kw)
    stock_caps = replace(caps, video_max_pixels=stock_video_max_pixels)
    if frame_cap:
        stock_caps = replace(stock_caps, video_max_frame_pixels=None)
    stock = video_geometry_for(width, height, total_frames, video_fps, stock_caps, **kw)
    return stock.patches > capped.patches
