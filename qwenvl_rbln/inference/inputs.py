"""Processor inputs shared by both backends: pixel caps, media loading, one processor call per batch.

Both backends build a batch the same way, so the reference (transformers) and the NPU (optimum-rbln)
see identical ``input_ids`` / ``pixel_values`` for the same requests:

* images: ``transformers.image_utils.load_image`` (EXIF transpose + RGB), as the chat template does;
* videos: PyAV, decoding only the frames ``Qwen3VLVideoProcessor.sample_frames`` would pick
  (``linspace(0, total - 1, n).round()``) and passing them with their ``VideoMetadata``
  (``frames_indices`` included, for the ``<t seconds>`` timestamps) and ``do_sample_frames=False``.
  Same frames and timestamps as decoding everything and letting the processor sample, without
  holding every frame of a long video in memory (torchvision 0.29 has no ``read_video``, so
  transformers' own path-based loading does not work here anyway);
* text: ``processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`` per
  request, then one ``processor(text=..., images=..., videos=..., padding=True)`` call, left padded.

Heavy imports (torch, transformers, av, numpy) happen inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError

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


def load_processor(model_dir: Path, caps: Any) -> Any:
    """AutoProcessor from a local directory (never the hub), caps applied, left padding."""
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
    apply_caps(processor, caps)
    processor.tokenizer.padding_side = "left"
    return processor


def load_image(path: Path) -> Any:
    """PIL RGB image after EXIF transpose (transformers' load_image); decode errors name the file."""
    from transformers.image_utils import load_image as hf_load_image

    try:
        return hf_load_image(str(path))
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


def load_video(path: Path, video_processor: Any) -> tuple[Any, Any]:
    """(frames ``[T, H, W, 3]`` uint8, ``VideoMetadata``) for the frames the processor would sample."""
    import av
    import numpy as np
    from transformers.video_utils import VideoMetadata

    try:
        container = av.open(str(path))
    except Exception as exc:
        raise InputError(f"{path}: not a readable video ({exc})", "re-encode it with ffmpeg") from None
    try:
        stream = container.streams.video[0]
        total = int(stream.frames or 0)
        rate = stream.average_rate
        notes = []
        if total <= 0:  # webm/mkv store no frame count: count the packets (no decoding)
            total = sum(1 for p in container.demux(stream) if p.size)
            container.seek(0)
        video_fps = float(rate) if rate else None
        if not video_fps:
            video_fps = 24.0
            notes.append("no fps metadata: assumed 24")
        indices = sample_indices(
            total,
            video_fps,
            video_processor.fps,
            video_processor.min_frames,
            video_processor.max_frames,
            getattr(video_processor, "num_frames", None),
        )
        wanted = set(indices)
        last = indices[-1]
        frames: dict[int, Any] = {}
        for i, frame in enumerate(container.decode(video=0)):
            if i > last:
                break
            if i in wanted:
                frames[i] = frame.to_ndarray(format="rgb24")
        height, width = stream.height, stream.width
    except InputError:
        raise
    except Exception as exc:
        raise InputError(
            f"{path}: cannot decode the video ({type(exc).__name__}: {exc})",
            "re-encode it with ffmpeg (e.g. ffmpeg -i in -c:v libx264 out.mp4)",
        ) from None
    finally:
        container.close()
    if not frames:
        raise InputError(f"{path}: no frame could be decoded", "re-encode it with ffmpeg")
    # a container that over-reports its frame count: repeat the last decoded frame, as a short read would
    got = [frames[i] if i in frames else frames[max(frames)] for i in indices]
    video = np.stack(got)
    meta = VideoMetadata(
        total_num_frames=total,
        fps=video_fps,
        duration=total / video_fps,
        video_backend="pyav",
        height=height,
        width=width,
        frames_indices=np.asarray(indices),
    )
    return video, meta


def render_prompt(processor: Any, request: Any) -> str:
    return processor.apply_chat_template(request.messages(), tokenize=False, add_generation_prompt=True)


def build_inputs(processor: Any, requests: list[Any]) -> tuple[Any, dict[str, Any]]:
    """One processor call for a batch of requests; returns (BatchFeature, info with grids and lengths)."""
    texts = [render_prompt(processor, r) for r in requests]
    images = [load_image(p) for r in requests for p in r.images]
    videos: list[Any] = []
    metas: list[Any] = []
    for r in requests:
        for p in r.videos:
            frames, meta = load_video(p, processor.video_processor)
            videos.append(frames)
            metas.append(meta)
    kwargs: dict[str, Any] = {"text": texts, "padding": True, "return_tensors": "pt"}
    if images:
        kwargs["images"] = images
    if videos:
        kwargs["videos"] = videos
        kwargs["video_metadata"] = metas
        kwargs["do_sample_frames"] = False
    inputs = processor(**kwargs)
    mask = inputs["attention_mask"]
    info = {
        "prompt_tokens": [int(x) for x in mask.sum(dim=1).tolist()],
        "padded_length": int(mask.shape[1]),
        "image_grids": inputs["image_grid_thw"].tolist() if "image_grid_thw" in inputs else [],
        "video_grids": inputs["video_grid_thw"].tolist() if "video_grid_thw" in inputs else [],
    }
    return inputs, info
