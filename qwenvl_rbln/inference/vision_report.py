"""What the static-shape ViT does with each image and video, decided before any model is loaded.

For every input: its size, the size the processor resizes it to, the ViT sequence length (pre-merge
patches per call), the compiled bucket that call lands in (smallest bucket >= patches, as
optimum-rbln's ``searchsorted``) and the padding that bucket executes. A video is one ViT call per
temporal patch (2 frames), all of the same length.

Oversize inputs (more patches than the largest bucket; possible when ``processor.max_pixels`` was
raised or the artifact has smaller buckets than the preset) are handled per ``on_oversize``:

* ``resize`` (default): cap the processor so they fit: images ``max_pixels = largest * 256``;
  videos ``video_max_pixels = geometry.video_max_pixels_for_bucket(largest, T)`` for the smallest
  sampled frame count ``T`` among the oversize videos. The processor is one object per run, so the
  cap applies to every input of the run; the whole report is recomputed with it and says so.
* ``error``: raise the InputError of ``buckets.oversize_error`` (input, patches, largest bucket, both fixes).

Pure Python (geometry + buckets): no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from qwenvl_rbln.buckets import oversize_error, select_bucket
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.geometry import (
    image_geometry_for,
    max_pixels_for_bucket,
    video_geometry_for,
    video_max_pixels_for_bucket,
)

ON_OVERSIZE = ("resize", "error")


@dataclass
class VisionItem:
    """One image or video as the ViT sees it."""

    input: str
    kind: str  # "image" | "video"
    width: int
    height: int
    resized_width: int
    resized_height: int
    grid_h: int
    grid_w: int
    patches: int  # pre-merge patches per ViT call: the bucket key
    calls: int  # ViT calls: 1 per image, temporal patches per video
    bucket: int | None
    padding_pct: float | None  # share of the bucket that is padding (executed, useless)
    lm_tokens: int  # <|image_pad|>/<|video_pad|> tokens in the LM sequence
    frames: int | None = None  # video: frames sampled by the processor
    capped: bool = False  # resized further than the plan's caps so it fits the largest bucket
    patches_before_cap: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def label(self) -> str:
        if self.kind == "video":
            return f"{self.calls} x {self.patches} patches -> bucket {self.bucket}"
        return f"{self.patches} patches -> bucket {self.bucket}"


@dataclass
class VisionPlan:
    """Per request id, its vision items; the processor caps actually used; what oversize handling did."""

    items: dict[str, list[VisionItem]]
    caps: Any  # plan.ProcessorCaps actually handed to the processor
    plan_caps: Any  # the plan's caps before oversize handling
    buckets: list[int]
    on_oversize: str
    capped: list[dict[str, Any]] = field(default_factory=list)  # one entry per input that needed the cap

    @property
    def notes(self) -> list[str]:
        out = []
        if self.caps.max_pixels != self.plan_caps.max_pixels:
            out.append(
                f"images: processor max_pixels capped {self.plan_caps.max_pixels} -> {self.caps.max_pixels} "
                f"so every image fits the largest ViT bucket {self.buckets[-1]} (--on-oversize resize)"
            )
        if self.caps.video_max_pixels != self.plan_caps.video_max_pixels:
            out.append(
                f"videos: processor video_max_pixels capped {self.plan_caps.video_max_pixels} -> "
                f"{self.caps.video_max_pixels} so every temporal patch fits bucket {self.buckets[-1]} "
                "(--on-oversize resize)"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "buckets": self.buckets,
            "on_oversize": self.on_oversize,
            "processor": self.caps.to_dict(),
            "plan_processor": self.plan_caps.to_dict(),
            "capped": self.capped,
            "notes": self.notes,
            "items": {rid: [i.to_dict() for i in items] for rid, items in self.items.items()},
        }


def _padding(patches: int, bucket: int | None) -> float | None:
    return None if bucket is None else round(100.0 * (bucket - patches) / bucket, 1)


def _item(path: Any, kind: str, g: Any, calls: int, buckets: list[int], **extra: Any) -> VisionItem:
    """A VisionItem from an ImageGeometry or VideoGeometry (same field names) and its bucket."""
    bucket = select_bucket(g.patches, buckets)
    return VisionItem(
        input=str(path),
        kind=kind,
        width=g.width,
        height=g.height,
        resized_width=g.resized_width,
        resized_height=g.resized_height,
        grid_h=g.grid_h,
        grid_w=g.grid_w,
        patches=g.patches,
        calls=calls,
        bucket=bucket,
        padding_pct=_padding(g.patches, bucket),
        lm_tokens=g.lm_tokens,
        **extra,
    )


def image_item(info: Any, caps: Any, buckets: list[int], *, patch_size: int = 16, merge_size: int = 2) -> VisionItem:
    g = image_geometry_for(info.width, info.height, caps, patch_size=patch_size, merge_size=merge_size)
    return _item(info.path, "image", g, 1, buckets)


def video_item(
    info: Any, caps: Any, buckets: list[int], *, patch_size: int = 16, merge_size: int = 2, temporal_patch_size: int = 2
) -> VisionItem:
    try:
        g = video_geometry_for(
            info.width,
            info.height,
            info.total_frames,
            info.fps,
            caps,
            patch_size=patch_size,
            merge_size=merge_size,
            temporal_patch_size=temporal_patch_size,
        )
    except InputError as exc:
        raise InputError(f"{info.path}: {exc.message}", exc.hint) from None
    return _item(info.path, "video", g, g.vit_calls, buckets, frames=g.sampled_frames, notes=list(g.notes))


def _items(requests: list[Any], caps: Any, buckets: list[int], geo: dict[str, int]) -> dict[str, list[VisionItem]]:
    tps = geo.get("temporal_patch_size", 2)
    ps, ms = geo.get("patch_size", 16), geo.get("merge_size", 2)
    out: dict[str, list[VisionItem]] = {}
    for req in requests:
        items = [image_item(i, caps, buckets, patch_size=ps, merge_size=ms) for i in req.image_info]
        items += [
            video_item(v, caps, buckets, patch_size=ps, merge_size=ms, temporal_patch_size=tps) for v in req.video_info
        ]
        out[req.id] = items
    return out


def _oversize(items: dict[str, list[VisionItem]]) -> list[VisionItem]:
    return [i for group in items.values() for i in group if i.bucket is None]


def plan_vision(
    requests: list[Any],
    caps: Any,
    buckets: list[int],
    *,
    on_oversize: str = "resize",
    patch_size: int = 16,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
) -> VisionPlan:
    """Bucket every image/video of ``requests`` (their ``image_info``/``video_info`` must be probed).

    ``caps`` is a ``plan.ProcessorCaps``; ``buckets`` the compiled ViT buckets (any order).
    """
    if on_oversize not in ON_OVERSIZE:
        raise InputError(
            f"--on-oversize {on_oversize!r} is not one of {', '.join(ON_OVERSIZE)}",
            "use --on-oversize resize (default) or --on-oversize error",
        )
    buckets = sorted(buckets)
    largest = buckets[-1]
    geo = {"patch_size": patch_size, "merge_size": merge_size, "temporal_patch_size": temporal_patch_size}
    items = _items(requests, caps, buckets, geo)
    over = _oversize(items)
    plan_caps = caps
    capped: list[dict[str, Any]] = []
    if over:
        first = over[0]
        if on_oversize == "error":
            raise oversize_error(
                first.input,
                first.patches,
                buckets,
                kind=first.kind,
                frames=first.frames,
                patch_size=patch_size,
                temporal_patch_size=temporal_patch_size,
            )
        new = caps
        if any(i.kind == "image" for i in over):
            cap = min(caps.max_pixels, max_pixels_for_bucket(largest, patch_size))
            new = replace(new, max_pixels=cap, min_pixels=min(new.min_pixels, cap))
        videos = [i for i in over if i.kind == "video"]
        if videos:
            frames = min(max(i.frames or temporal_patch_size, temporal_patch_size) for i in videos)
            vcap = min(
                caps.video_max_pixels, video_max_pixels_for_bucket(largest, frames, patch_size, temporal_patch_size)
            )
            new = replace(new, video_max_pixels=vcap, video_min_pixels=min(new.video_min_pixels, vcap))
        before = {(rid, n): it for rid, group in items.items() for n, it in enumerate(group)}
        items = _items(requests, new, buckets, geo)
        still = _oversize(items)
        if still:  # the max(factor, ...) floor of extreme aspect ratios: resizing cannot help
            s = still[0]
            raise oversize_error(
                s.input,
                s.patches,
                buckets,
                kind=s.kind,
                frames=s.frames,
                patch_size=patch_size,
                temporal_patch_size=temporal_patch_size,
            )
        for rid, group in items.items():
            for n, it in enumerate(group):
                old = before[(rid, n)]
                if old.bucket is None:
                    it.capped = True
                    it.patches_before_cap = old.patches
                    capped.append(
                        {
                            "request": rid,
                            "input": it.input,
                            "kind": it.kind,
                            "patches_before": old.patches,
                            "patches": it.patches,
                            "bucket": it.bucket,
                        }
                    )
                elif (old.resized_width, old.resized_height) != (it.resized_width, it.resized_height):
                    it.notes.append("resized smaller by the run-wide oversize cap")
        caps = new
    return VisionPlan(
        items=items, caps=caps, plan_caps=plan_caps, buckets=buckets, on_oversize=on_oversize, capped=capped
    )


def check_grids(
    items: list[VisionItem],
    image_grids: list[list[int]],
    video_grids: list[list[int]],
    buckets: list[int],
    *,
    patch_size: int = 16,
    merge_size: int = 2,
) -> list[str]:
    """Compare the predicted geometry with the processor's ``*_grid_thw`` (in order); fix items, return warnings.

    ``items`` are the vision items of a batch in processor order (each request's images then videos,
    request after request); the processor consumes images and videos as two separate flat lists.
    """
    warnings: list[str] = []
    imgs = iter(image_grids)
    vids = iter(video_grids)
    for it in items:
        grid = next(imgs if it.kind == "image" else vids, None)
        if grid is None:
            continue
        t, h, w = (int(x) for x in grid)
        calls = t if it.kind == "video" else 1
        if (h, w, calls) != (it.grid_h, it.grid_w, it.calls):
            warnings.append(
                f"{it.input}: the processor made grid {t}x{h}x{w}, qvl predicted "
                f"{it.calls}x{it.grid_h}x{it.grid_w}; reporting the processor's"
            )
            it.grid_h, it.grid_w, it.calls = h, w, calls
            it.patches = h * w
            it.resized_height, it.resized_width = h * patch_size, w * patch_size
            it.lm_tokens = calls * it.patches // merge_size**2
            it.bucket = select_bucket(it.patches, sorted(buckets))  # what the NPU picks for the real length
            it.padding_pct = _padding(it.patches, it.bucket)
    return warnings
