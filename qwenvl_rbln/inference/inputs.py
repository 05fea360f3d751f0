"""Processor inputs shared by both backends: pixel caps, media loading, one processor call per batch.

Both backends build a batch the same way, so the reference (transformers) and the NPU (optimum-rbln)
see identical ``input_ids`` / ``pixel_values`` for the same requests:

* images: EXIF transpose (as ``transformers.image_utils.load_image``), then RGB as vLLM's server converts them;
* videos: PyAV, decoding only the frames ``Qwen3VLVideoProcessor.sample_frames`` would pick
  (``linspace(0, total - 1, n).round()``) and passing them with their ``VideoMetadata``
  (``frames_indices`` included, for the ``<t seconds>`` timestamps) and ``do_sample_frames=False``.
  Same frames and timestamps as decoding everything and letting the processor sample, without
  holding every frame of a long video in memory (torchvision 0.29 has no ``read_video``, so
  transformers' own path-based loading does not work here anyway);
* text: ``processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`` per
  request, then one ``processor(text=..., images=..., videos=...)`` call per request under that request's
  own pixel caps (``Request.caps``: an oversize input is capped for its request only, so no request's
  result depends on the others in its batch), merged into one batch left padded as the tokenizer pads.

Before any model loads, ``check_media`` decodes every image fully and every video's sampled frames
(the same frames ``load_video`` will decode), so damaged pixel data fails in milliseconds, naming the
file and the request's ``file:line``, instead of after the model load and the earlier batches' output.

Heavy imports (torch, transformers, av, numpy) happen inside the functions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.inference import work

IMAGE_KEYS = ("pixel_values", "image_grid_thw")
VIDEO_KEYS = ("pixel_values_videos", "video_grid_thw")


def apply_caps(processor: Any, caps: Any) -> None:
    """Set the processor's pixel caps to ``caps`` (a ``plan.ProcessorCaps``) for images and videos.

    ``size={"shortest_edge": min, "longest_edge": max}`` is what the Qwen3-VL processors read; the
    legacy ``min_pixels``/``max_pixels`` attributes are set too, because a call-time pair of them
    would override ``size`` (reference section 5).
    """
    try:
        from transformers.image_utils import SizeDict
    except ImportError:  # pragma: no cover - older transformers
        SizeDict = None  # noqa: N806

    def size(lo: int, hi: int) -> Any:
        return (
            SizeDict(shortest_edge=lo, longest_edge=hi)
            if SizeDict is not None
            else {"shortest_edge": lo, "longest_edge": hi}
        )

    ip = getattr(processor, "image_processor", None)
    if ip is not None:
        ip.size = size(caps.min_pixels, caps.max_pixels)
        ip.min_pixels, ip.max_pixels = caps.min_pixels, caps.max_pixels
    vp = getattr(processor, "video_processor", None)
    if vp is not None:
        vp.size = size(caps.video_min_pixels, caps.video_max_pixels)
        if getattr(vp, "min_pixels", None) is not None or getattr(vp, "max_pixels", None) is not None:
            vp.min_pixels, vp.max_pixels = caps.video_min_pixels, caps.video_max_pixels
        vp.fps = caps.fps
        vp.min_frames = caps.min_frames
        vp.max_frames = caps.max_frames
        vp.num_frames = None
        from qwenvl_rbln.vision.frame_cap import install_on_instance

        install_on_instance(vp, getattr(caps, "video_max_frame_pixels", None))  # every frame fits the largest bucket


_PROCESSORS: dict[tuple[Any, ...], Any] = {}  # one checked processor per directory and file stamps


def load_processor(model_dir: Path, caps: Any) -> Any:
    """AutoProcessor from a local directory (never the hub), caps applied, left padding.

    Loaded once per process and directory (the prompt count before the model loads and the backend share
    it); ``apply_caps`` sets every cap it touches on each call, so a cached one carries no earlier caps."""
    processor = shared_processor(model_dir)
    apply_caps(processor, caps)
    processor.tokenizer.padding_side = "left"
    return processor


def shared_processor(model_dir: Path) -> Any:
    """The directory's checked processor, loaded once per process (caps are the caller's to apply)."""
    from qwenvl_rbln.inference.model_stamp import model_stamp

    root = Path(model_dir).absolute()
    key = (str(root), model_stamp(root))
    processor = _PROCESSORS.get(key)
    if processor is None:
        processor = _load_checked_processor(root)
        _PROCESSORS.clear()
        _PROCESSORS[key] = processor
    return processor


def _load_checked_processor(model_dir: Path) -> Any:
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(str(model_dir), local_files_only=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise InputError(
            f"{model_dir}: cannot load the Qwen3-VL processor ({type(exc).__name__}: {first[:200]})",
            "the directory needs processor_config.json (or preprocessor_config.json) and tokenizer files; "
            "recompile it with `qvl compile`",
        ) from None
    if not hasattr(processor, "image_processor") or not hasattr(processor, "tokenizer"):
        raise InputError(
            f"{model_dir}: AutoProcessor gave {type(processor).__name__}, not a Qwen3-VL processor",
            "point at a Qwen3-VL model directory (processor_config.json with Qwen3VLProcessor)",
        )
    _settle_video_processor(processor, model_dir)
    check_processor(processor, model_dir)
    return processor


QWEN3_VIDEO_KEEP = (  # what a Qwen2VLVideoProcessor carries over (from the checkpoint's image processor config)
    "patch_size",
    "temporal_patch_size",
    "merge_size",
    "image_mean",
    "image_std",
    "do_convert_rgb",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "resample",
)


def _settle_video_processor(processor: Any, model_dir: Path) -> None:
    """Give the processor the video processor qvl's plan describes, or refuse before any model loads.

    qvl's geometry, buckets and per-frame cap follow ``Qwen3VLVideoProcessor`` (one pixel budget over all sampled
    frames). A checkpoint without a video processor config gets transformers' fallback ``Qwen2VLVideoProcessor``
    (inferred from the image processor's class), whose resize is per frame with the image caps: qvl replaces it by
    a ``Qwen3VLVideoProcessor`` with the same patch/merge sizes and normalisation, as a shipped Qwen3-VL checkpoint
    has. Any other class is refused: neither qvl's bucket prediction nor its frame cap would hold for it.
    """
    from qwenvl_rbln.vision.frame_cap import CLIP, FRAME, family

    vp = getattr(processor, "video_processor", None)
    if vp is None:
        return
    kind = family(type(vp))
    if kind == CLIP:
        return
    if kind == FRAME:
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

        keep = {k: getattr(vp, k) for k in QWEN3_VIDEO_KEEP if getattr(vp, k, None) is not None}
        processor.video_processor = Qwen3VLVideoProcessor(**keep)
        return
    raise InputError(
        f"{model_dir}: the video processor is {type(vp).__name__}; qvl plans and caps videos for "
        "Qwen3VLVideoProcessor (or Qwen2VLVideoProcessor, which it replaces)",
        'set "video_processor_type": "Qwen3VLVideoProcessor" in video_preprocessor_config.json (or the '
        '"video_processor" section of processor_config.json), as the original Qwen3-VL checkpoint has',
    )


VISION_TOKENS = ("image_token", "video_token", "vision_start_token", "vision_end_token")
TOKENIZER_HINT = (
    "copy the tokenizer and processor files (tokenizer.json, tokenizer_config.json, chat_template.jinja or "
    "chat_template.json, processor_config.json) from the original Qwen3-VL model directory"
)


def check_processor(processor: Any, model_dir: Path) -> None:
    """InputError unless the tokenizer encodes Qwen3-VL's vision tokens as single ids and a chat template exists.

    Without tokenizer files transformers still builds a one-token vocabulary, and the failure surfaces
    only at the first image as a 'Mismatch in image token count' ValueError.
    """
    tokenizer = processor.tokenizer
    for attr in VISION_TOKENS:
        token = getattr(processor, attr, None)
        token_id = getattr(processor, f"{attr}_id", None)
        if not token:
            continue
        try:
            ids = tokenizer.encode(token, add_special_tokens=False)
        except Exception:  # noqa: BLE001 - a tokenizer that cannot encode is the same problem
            ids = []
        if ids != [token_id]:
            raise InputError(
                f"{model_dir}: the tokenizer has no {token} token (vocabulary of {len(tokenizer)}): its "
                "tokenizer files are missing or not Qwen3-VL's",
                TOKENIZER_HINT,
            )
    if not getattr(processor, "chat_template", None) and not getattr(tokenizer, "chat_template", None):
        raise InputError(f"{model_dir}: no chat template (chat_template.jinja or chat_template.json)", TOKENIZER_HINT)


_VISION_FAMILY = ("vision_", "image_", "video_")  # <|vision_start|>, <|vision_pad|>, <|image_pad|>, <|video_pad|>


def vision_placeholders(processor: Any) -> list[str]:
    """The token texts the processor and the model read as vision placeholders, taken from them, not a list of
    ours: the processor's own (``image_token``, ``video_token``, ``vision_start_token``, ``vision_end_token``),
    and every other special token of its tokenizer in that family (``<|vision_pad|>``).

    A prompt holding one breaks the processor's expansion (one placeholder per image or video) or the model's
    vision positions: generate fails, or pairs a batch-mate's image with the wrong features."""
    found = [getattr(processor, attr, None) for attr in VISION_TOKENS]
    tokenizer = getattr(processor, "tokenizer", None)
    for token in getattr(tokenizer, "all_special_tokens", None) or []:
        if str(token).strip("<|>").startswith(_VISION_FAMILY):
            found.append(token)
    return list(dict.fromkeys(t for t in found if isinstance(t, str) and t))


def check_prompt_text(processor: Any, request: Any) -> None:
    """InputError when the request's prompt or system prompt holds a vision placeholder token (only qvl writes
    them, one per image or video it passes), naming the token and, for a batch file, its ``file:line``."""
    from qwenvl_rbln.inference.requests import FLAGS_SOURCE

    flags = getattr(request, "source", FLAGS_SOURCE) == FLAGS_SOURCE
    tokens = vision_placeholders(processor)
    for key, text in (("prompt", request.prompt), ("system", request.system)):
        hit = next((t for t in tokens if t in (text or "")), None)
        if hit is None:
            continue
        where = f"--{key}" if flags else f"{request.source}: the {key}"
        raise InputError(
            f"{where} contains {hit}, a vision placeholder token of the model's tokenizer; qvl writes those itself, "
            "one per image or video it passes",
            f"remove {hit} from the {key} text; pass images and videos "
            + ("with --image/--video" if flags else 'under "images"/"videos"'),
        )


def check_prompt_texts(requests: list[Any], processor: Any) -> None:
    """``check_prompt_text`` for every request, the refusals reported together."""
    from qwenvl_rbln.errors import raise_all

    problems: list[InputError] = []
    for req in requests:
        try:
            check_prompt_text(processor, req)
        except InputError as exc:
            problems.append(exc)
    raise_all(problems, "requests cannot run", "correct each one listed; nothing ran")


def load_image(path: Path) -> Any:
    """PIL RGB image: EXIF transpose (as transformers' load_image), then RGB as ``qvl serve`` (vLLM) converts it
    (``images.to_rgb``); decode errors name the file."""
    from PIL import Image, ImageOps

    from qwenvl_rbln.inference.images import to_rgb

    try:
        with Image.open(path) as img:
            img.load()
            return to_rgb(ImageOps.exif_transpose(img))
    except Exception as exc:  # decode errors surface only here (probe reads headers)
        raise InputError(
            f"{path}: cannot decode the image ({type(exc).__name__}: {exc})", "re-export or re-download the image"
        ) from None


def sample_indices(
    total: int, video_fps: float, fps: float | None, min_frames: int, max_frames: int, num_frames: int | None = None
) -> list[int]:
    """``Qwen3VLVideoProcessor.sample_frames`` (transformers 5.15.1), as a list of frame indices."""
    import numpy as np

    if num_frames is None and fps is not None:
        num_frames = int(total / video_fps * fps)
        num_frames = min(max(num_frames, min_frames), max_frames, total)
    if num_frames is None:
        num_frames = min(max(total, min_frames), max_frames)
    return np.linspace(0, total - 1, num_frames).round().astype(int).tolist()


VIDEO_FIX = "re-encode it with ffmpeg (e.g. ffmpeg -i in -c:v libx264 out.mp4)"


@dataclass
class DecodedVideo:
    """The sampled frames of one video (``frames`` empty when only checking) and what the metadata needs."""

    indices: list[int]
    frames: dict[int, Any]
    decoded: set[int]
    total: int
    fps: float
    height: int
    width: int


def _frame_count(container: Any, stream: Any) -> int:
    total = int(stream.frames or 0)
    if total <= 0:  # webm/mkv store no frame count: count the packets (no decoding)
        total = sum(1 for p in container.demux(stream) if p.size)
        container.seek(0)
    return total


def _sampling(container: Any, stream: Any, sampling: Any) -> tuple[int, float, list[int]]:
    """(frame count, fps, the sampled frame indices) of an open video, nothing decoded."""
    total = _frame_count(container, stream)
    rate = stream.average_rate
    video_fps = float(rate) if rate else 24.0  # no fps metadata: assumed 24
    indices = sample_indices(
        total,
        video_fps,
        sampling.fps,
        sampling.min_frames,
        sampling.max_frames,
        getattr(sampling, "num_frames", None),
    )
    return total, video_fps, indices


def video_sampling(path: Path, sampling: Any) -> tuple[float, list[int]]:
    """(fps, sampled frame indices) as ``decode_video`` picks them, from the container alone (no decoding)."""
    import av

    try:
        container = av.open(str(path))
    except Exception as exc:
        raise InputError(f"{path}: not a readable video ({exc})", "re-encode it with ffmpeg") from None
    try:
        _, video_fps, indices = _sampling(container, container.streams.video[0], sampling)
    except Exception as exc:
        raise InputError(f"{path}: cannot read the video ({type(exc).__name__}: {exc})", VIDEO_FIX) from None
    finally:
        container.close()
    return video_fps, indices


def decode_video(path: Path, sampling: Any, *, keep: bool = True) -> DecodedVideo:
    """Decode ``path`` up to its last sampled frame (``sampling``: fps, min_frames, max_frames, num_frames).

    ``keep``: hold the sampled frames as RGB arrays (False: only prove they decode). Errors name the file.
    """
    import av

    try:
        container = av.open(str(path))
    except Exception as exc:
        raise InputError(f"{path}: not a readable video ({exc})", "re-encode it with ffmpeg") from None
    watched = work.watched()
    try:
        stream = container.streams.video[0]
        total, video_fps, indices = _sampling(container, stream, sampling)
        wanted, last = set(indices), indices[-1]
        frames: dict[int, Any] = {}
        decoded: set[int] = set()
        if watched:
            work.report("video.start", key=str(path), total=last + 1)
        for i, frame in enumerate(container.decode(video=0)):
            if i > last:
                break
            if watched and i % work.FRAME_EVERY == 0:
                work.report("video.frames", key=str(path), done=i)
            if i in wanted:
                decoded.add(i)
                if keep:
                    frames[i] = frame.to_ndarray(format="rgb24")
        height, width = stream.height, stream.width
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"{path}: cannot decode the video ({type(exc).__name__}: {exc})", VIDEO_FIX) from None
    finally:
        container.close()
        if watched:
            work.report("video.end", key=str(path))
    if not decoded:
        raise InputError(f"{path}: no frame could be decoded", "re-encode it with ffmpeg")
    _check_cut_short(path, indices, decoded, total)
    return DecodedVideo(indices, frames, decoded, total, video_fps, height, width)


def _check_cut_short(path: Path, indices: list[int], decoded: set[int], total: int) -> None:
    """InputError when sampled frames well before the end do not decode: the file is cut short (a faststart
    mp4 keeps its index, so the header still promises every frame). A container that over-reports its count
    by a frame or two (a slack of 2 % of the frames) is tolerated; the last decoded frame stands in."""
    missing = [i for i in indices if i not in decoded]
    if missing and missing[0] < total - max(2, total // 50):
        raise InputError(
            f"{path}: frame {missing[0]} of {total} does not decode (only {len(decoded)} of the {len(indices)} "
            "sampled frames do): the file is cut short or damaged",
            VIDEO_FIX,
        )


def load_video(path: Path, video_processor: Any) -> tuple[Any, Any]:
    """(frames ``[T, H, W, 3]`` uint8, ``VideoMetadata``) for the frames the processor would sample."""
    import numpy as np
    from transformers.video_utils import VideoMetadata

    v = decode_video(path, video_processor, keep=True)
    # a container that over-reports its frame count: repeat the last decoded frame, as a short read would
    got = [v.frames[i] if i in v.frames else v.frames[max(v.frames)] for i in v.indices]
    meta = VideoMetadata(
        total_num_frames=v.total,
        fps=v.fps,
        duration=v.total / v.fps,
        video_backend="pyav",
        height=v.height,
        width=v.width,
        frames_indices=np.asarray(v.indices),
    )
    return np.stack(got), meta


def check_image(path: Path) -> None:
    """Decode every pixel of ``path`` (Pillow), so damaged image data fails before a model loads."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img.load()
    except Exception as exc:  # noqa: BLE001 - any decode failure is the file's fault
        raise InputError(
            f"{path}: cannot decode the image ({type(exc).__name__}: {exc})", "re-export or re-download the image"
        ) from None


def check_media(requests: list[Any], sampling: Any) -> None:
    """Decode every request's images and the sampled frames of its videos, each file once, before any load.

    ``sampling``: the caps' fps / min_frames / max_frames (the processor's frame sampling). Errors name the
    file and, for a batch file, the request's ``file:line``.
    """
    from qwenvl_rbln.errors import raise_all
    from qwenvl_rbln.inference.requests import FLAGS_SOURCE

    done: set[Path] = set()
    problems: list[InputError] = []  # one per request that cannot run, reported together
    for req in requests:
        prefix = "" if req.source == FLAGS_SOURCE else f"{req.source}: "
        try:
            for kind, paths in (("image", req.images), ("video", req.videos)):
                for path in paths:
                    key = Path(path).absolute()
                    if key in done:
                        continue
                    try:
                        if kind == "image":
                            check_image(path)
                        else:
                            decode_video(path, sampling, keep=False)
                    except InputError as exc:
                        raise InputError(prefix + exc.message, exc.hint) from None
                    done.add(key)
        except InputError as exc:
            problems.append(exc)
    raise_all(problems, "requests cannot run", "correct each one listed; nothing ran")


def render_prompt(processor: Any, request: Any) -> str:
    return processor.apply_chat_template(request.messages(), tokenize=False, add_generation_prompt=True)


def _timestamps(processor: Any, indices: list[int], fps: float, temporal_patch_size: int) -> list[float]:
    """One timestamp per temporal patch, as ``Qwen3VLProcessor._calculate_timestamps`` gives them."""
    own = getattr(processor, "_calculate_timestamps", None)
    if callable(own):
        return list(own(list(indices), fps, temporal_patch_size))
    idx = list(indices)
    if len(idx) % temporal_patch_size:
        idx += [idx[-1]] * (temporal_patch_size - len(idx) % temporal_patch_size)
    ts = [i / fps for i in idx]
    return [(ts[i] + ts[i + temporal_patch_size - 1]) / 2 for i in range(0, len(ts), temporal_patch_size)]


def prompt_tokens(processor: Any, request: Any, items: list[Any], sampling: Any) -> int:
    """The prompt length ``build_inputs`` gives ``request``, counted without decoding any pixel.

    The chat template's text is tokenized with each image/video placeholder expanded as Qwen3VLProcessor
    expands it: ``lm_tokens`` pad tokens per image; per video temporal patch a ``<t seconds>`` timestamp
    (from the frames ``load_video`` samples) and the patch's pad tokens between vision start/end tokens.
    ``items``: the request's vision items (``vision_report.VisionItem``, images then videos, in order).
    """
    tokenizer = processor.tokenizer
    video_pad = processor.video_token
    start = getattr(processor, "vision_start_token", "<|vision_start|>")
    end = getattr(processor, "vision_end_token", "<|vision_end|>")
    tps = int(getattr(getattr(processor, "video_processor", None), "temporal_patch_size", None) or 2)
    text = render_prompt(processor, request)
    images = [it for it in items if it.kind == "image"]
    videos = [it for it in items if it.kind == "video"]
    extra = sum(it.lm_tokens - 1 for it in images)  # each placeholder stays one token in the text below
    parts = text.split(video_pad)
    if len(parts) - 1 != len(videos):  # a template that does not place one placeholder per video
        return len(tokenizer(text)["input_ids"]) + extra + sum(it.lm_tokens - 1 for it in videos)
    expanded = parts[0]
    for item, path, rest in zip(videos, request.videos, parts[1:], strict=True):
        fps, indices = video_sampling(path, sampling)
        stamps = _timestamps(processor, indices, fps, tps)
        per_patch = item.lm_tokens // max(item.calls, 1)
        expanded += "".join(f"<{t:.1f} seconds>{start}{video_pad}{end}" for t in stamps) + rest
        extra += len(stamps) * (per_patch - 1)
    return len(tokenizer(expanded)["input_ids"]) + extra


class _AmbiguousChannels(logging.Filter):
    """Drops transformers' "The channel dimension is ambiguous" warning (1- or 3-pixel-high images).

    Our images are PIL RGB: the torchvision backend turns them into channels-first tensors and then guesses
    channels-first, which is right; the PIL backend states channels-last itself. The guess is right, so the
    warning only alarms (passing ``input_data_format`` would be wrong for one of the two backends)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "channel dimension is ambiguous" not in record.getMessage()


def quiet_channel_warning() -> None:
    logger = logging.getLogger("transformers.image_utils")
    if not any(isinstance(f, _AmbiguousChannels) for f in logger.filters):
        logger.addFilter(_AmbiguousChannels())


def _request_inputs(processor: Any, request: Any) -> Any:
    """One request through the processor, under whatever caps the processor holds now."""
    quiet_channel_warning()
    kwargs: dict[str, Any] = {"text": [render_prompt(processor, request)], "return_tensors": "pt"}
    images = [load_image(p) for p in request.images]
    if images:
        kwargs["images"] = images
    if request.videos:
        loaded = [load_video(p, processor.video_processor) for p in request.videos]
        kwargs["videos"] = [frames for frames, _ in loaded]
        kwargs["video_metadata"] = [meta for _, meta in loaded]
        kwargs["do_sample_frames"] = False
    return processor(**kwargs)


SEQUENCE_PAD = {"input_ids": None, "attention_mask": 0, "mm_token_type_ids": 0, "token_type_ids": 0}


def merge_inputs(parts: list[Any], pad_id: int) -> Any:
    """Single-request processor outputs as one left-padded batch, as ``processor(..., padding=True)`` builds it.

    Per-token tensors (``SEQUENCE_PAD``) are left padded (input_ids with ``pad_id``); everything else
    (pixel values, grids) is concatenated in request order, as the processor flattens them.
    """
    import torch
    from transformers.feature_extraction_utils import BatchFeature

    width = max(int(p["input_ids"].shape[1]) for p in parts)
    merged: dict[str, Any] = {}
    for key in parts[0]:
        tensors = [p[key] for p in parts if key in p]
        if key in SEQUENCE_PAD:
            fill = pad_id if SEQUENCE_PAD[key] is None else SEQUENCE_PAD[key]
            tensors = [
                torch.nn.functional.pad(t, (width - t.shape[1], 0), value=fill) if t.shape[1] < width else t
                for t in tensors
            ]
        merged[key] = torch.cat(tensors, dim=0)
    for key in {k for p in parts for k in p} - set(merged):  # a modality only later requests have
        merged[key] = torch.cat([p[key] for p in parts if key in p], dim=0)
    return BatchFeature(data=merged)


def build_inputs(processor: Any, requests: list[Any], caps: Any = None) -> tuple[Any, dict[str, Any]]:
    """The batch of ``requests``; returns (BatchFeature, info with grids and lengths).

    Each request is processed under its own caps (``Request.caps``, else ``caps``, else the processor's
    current ones); the processor is left holding ``caps`` when given.
    """
    parts = []
    try:
        for r in requests:
            own = getattr(r, "caps", None) or caps
            if own is not None:
                apply_caps(processor, own)
            parts.append(_request_inputs(processor, r))
    finally:
        if caps is not None:
            apply_caps(processor, caps)
    pad_id = getattr(processor.tokenizer, "pad_token_id", None)
    inputs = merge_inputs(parts, 0 if pad_id is None else int(pad_id))
    mask = inputs["attention_mask"]
    info = {
        "prompt_tokens": [int(x) for x in mask.sum(dim=1).tolist()],
        "padded_length": int(mask.shape[1]),
        "image_grids": inputs["image_grid_thw"].tolist() if "image_grid_thw" in inputs else [],
        "video_grids": inputs["video_grid_thw"].tolist() if "video_grid_thw" in inputs else [],
    }
    return inputs, info
