"""What the static-shape ViT does with each image and video, decided before any model is loaded.

For every input: its size, the size the processor resizes it to, the ViT sequence length (pre-merge
patches per call), the compiled bucket that call lands in (smallest bucket >= patches, as
optimum-rbln's ``searchsorted``) and the padding that bucket executes. A video is one ViT call per
temporal patch (2 frames), all of the same length.

Oversize inputs (more patches than the largest bucket; possible when ``processor.max_pixels`` was
raised or the artifact has smaller buckets than the preset) are handled per ``on_oversize``:

* ``resize`` (default): cap the processor for that request only, so they fit: images
  ``max_pixels = largest * 256``; videos ``video_max_frame_pixels = largest * 256`` (the per-frame cap of
  ``vision/frame_cap.py``, which a preset sets by default, so only a raised cap gets here). Each request is
  processed under its own caps (``inputs.build_inputs``), so a request's result never depends on the
  other requests of the run; its report is recomputed with the cap and says so.
* ``error``: raise the InputError of ``buckets.oversize_error`` (input, patches, largest bucket); on
  compiled artifacts the fix is a recompile (the compiled buckets cannot change at run time) or a resize.

Pure Python (geometry + buckets): no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from qwenvl_rbln.errors import InputError, raise_all
from qwenvl_rbln.planning.plan import ON_OVERSIZE  # one spelling for every command
from qwenvl_rbln.vision.buckets import bucket_cost_clause, oversize_error, padding_pct, round_up, select_bucket
from qwenvl_rbln.vision.geometry import (
    IMAGE_MAX_PIXELS,
    VIDEO_MAX_PIXELS,
    image_capped,
    image_geometry_for,
    max_pixels_for_bucket,
    video_capped,
    video_geometry_for,
)


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
    capped: bool = False  # a pixel cap made it smaller than the stock processor would (as bucket-plan says)
    oversize_capped: bool = False  # resized further than the plan's caps so it fits the largest bucket
    patches_before_cap: int | None = None  # patches under the plan's caps, before the oversize cap
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
    """Per request id, its vision items and processor caps; what oversize handling did."""

    items: dict[str, list[VisionItem]]
    caps: Any  # plan.ProcessorCaps of the plan: what a request without oversize inputs is processed with
    request_caps: dict[str, Any]  # per request id: the caps its processor call uses
    buckets: list[int]
    on_oversize: str
    capped: list[dict[str, Any]] = field(default_factory=list)  # one entry per input that needed the cap

    @property
    def notes(self) -> list[str]:
        """One line per distinct cap, naming the requests it applies to."""
        changes: dict[tuple[str, int, int], list[str]] = {}
        for rid, caps in self.request_caps.items():
            for key in ("max_pixels", "video_max_frame_pixels"):
                old, new = getattr(self.caps, key), getattr(caps, key)
                if old != new:
                    changes.setdefault((key, old, new), []).append(rid)
        out = []
        for (key, old, new), rids in changes.items():
            what = "images" if key == "max_pixels" else "videos"
            fits = "every image fits" if key == "max_pixels" else "every frame (temporal patch) fits"
            shown = ", ".join(rids[:5]) + (f" and {len(rids) - 5} more" if len(rids) > 5 else "")
            out.append(
                f"{what}: processor {key} capped {old} -> {new} for request{'s' if len(rids) > 1 else ''} {shown} "
                f"so {fits} the largest ViT bucket {self.buckets[-1]} (--on-oversize resize)"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "buckets": self.buckets,
            "on_oversize": self.on_oversize,
            "processor": self.caps.to_dict(),
            "request_processor": {rid: c.to_dict() for rid, c in self.request_caps.items()},
            "capped": self.capped,
            "notes": self.notes,
            "items": {rid: [i.to_dict() for i in items] for rid, items in self.items.items()},
        }


def _padding(patches: int, bucket: int | None) -> float | None:
    return padding_pct(patches, bucket)


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


def image_item(
    info: Any,
    caps: Any,
    buckets: list[int],
    *,
    patch_size: int = 16,
    merge_size: int = 2,
    stock_max_pixels: int = IMAGE_MAX_PIXELS,
) -> VisionItem:
    try:
        g = image_geometry_for(info.width, info.height, caps, patch_size=patch_size, merge_size=merge_size)
    except InputError as exc:  # an impossible aspect ratio: named by its file, as bucket-plan names it
        raise InputError(f"{info.path}: {exc.message}", exc.hint) from None
    capped = image_capped(info.width, info.height, caps, stock_max_pixels, patch_size=patch_size, merge_size=merge_size)
    return _item(info.path, "image", g, 1, buckets, capped=capped)


def video_item(
    info: Any,
    caps: Any,
    buckets: list[int],
    *,
    patch_size: int = 16,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
    stock_video_max_pixels: int = VIDEO_MAX_PIXELS,
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
    capped = video_capped(
        info.width,
        info.height,
        info.total_frames,
        info.fps,
        caps,
        stock_video_max_pixels,
        patch_size=patch_size,
        merge_size=merge_size,
        temporal_patch_size=temporal_patch_size,
    )
    return _item(
        info.path, "video", g, g.vit_calls, buckets, frames=g.sampled_frames, notes=list(g.notes), capped=capped
    )


def _request_items(req: Any, caps: Any, buckets: list[int], geo: dict[str, int]) -> list[VisionItem]:
    tps = geo.get("temporal_patch_size", 2)
    ps, ms = geo.get("patch_size", 16), geo.get("merge_size", 2)
    stock, vstock = geo.get("stock_max_pixels", IMAGE_MAX_PIXELS), geo.get("stock_video_max_pixels", VIDEO_MAX_PIXELS)
    items = [image_item(i, caps, buckets, patch_size=ps, merge_size=ms, stock_max_pixels=stock) for i in req.image_info]
    items += [
        video_item(
            v, caps, buckets, patch_size=ps, merge_size=ms, temporal_patch_size=tps, stock_video_max_pixels=vstock
        )
        for v in req.video_info
    ]
    return items


def _list_arg(values: list[int]) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"


def bucket_memory_check(plan: Any) -> Callable[[int], str | None] | None:
    """``bucket_memory`` for ``buckets.oversize_error``: the memory planner's word on ``plan`` with an added ViT
    bucket as its largest (None: it fits; else the verdict with the visual workspace and the fullest device), so
    the oversize fix never offers, as plain, a bucket that cannot load. None off the rbln backend (no NPU memory)."""
    if getattr(plan, "backend", None) != "rbln":
        return None
    from qwenvl_rbln.memory.planner import estimate_plan
    from qwenvl_rbln.units import fmt_bytes

    answers: dict[int, str | None] = {}

    def cost(bucket: int) -> str | None:
        if bucket not in answers:
            try:
                report = estimate_plan(plan, largest_vit_bucket=bucket, suggest=False).to_dict()
            except Exception:  # no estimate: the fix stays as it was, never a crash in an error message
                answers[bucket] = None
                return None
            answers[bucket] = None if report["verdict"] == "fits" else _cost_text(report, fmt_bytes)
        return answers[bucket]

    return cost


def _cost_text(report: dict[str, Any], fmt: Callable[[Any], str]) -> str:
    """'memory verdict uncertain: visual workspace 402.03 GiB, device 0 454.02 GiB of 140.00 GiB usable'."""
    device = max(report["devices"], key=lambda d: d["total_bytes"] / max(d["usable_bytes"], 1))
    workspace = sum(i["bytes"] for d in report["devices"] for i in d["items"] if i["name"] == "visual.workspace")
    return (
        f"memory verdict {report['verdict']}: visual workspace {fmt(workspace)}, device {device['device']} "
        f"{fmt(device['total_bytes'])} of {fmt(device['usable_bytes'])} usable"
    )


def _cap_fix(item: VisionItem, largest: int, geo: dict[str, int]) -> str:
    """The processor cap that resizes ``item`` into the largest bucket, as a --set."""
    ps = geo["patch_size"]
    if item.kind == "video":
        return f"--set processor.video_max_frame_pixels={max_pixels_for_bucket(largest, ps)}"
    return f"--set processor.max_pixels={max_pixels_for_bucket(largest, ps)}"


def _oversize_error(
    item: VisionItem,
    buckets: list[int],
    geo: dict[str, int],
    recompile: Callable[[str], str] | None,
    resizable: bool = True,
    bucket_memory: Callable[[int], str | None] | None = None,
) -> InputError:
    """buckets.oversize_error, with fixes that work where the buckets are compiled (``recompile`` given);
    ``resizable``: --on-oversize resize would fit it (False: resizing was tried and cannot); ``bucket_memory``
    (``bucket_memory_check``): a bucket the plan has no memory for comes last, marked with its cost."""
    exc = oversize_error(
        item.input,
        item.patches,
        buckets,
        kind=item.kind,
        frames=item.frames,
        patch_size=geo["patch_size"],
        temporal_patch_size=geo["temporal_patch_size"],
        bucket_memory=bucket_memory,
    )
    resize = "--on-oversize resize (the default)"
    if recompile is None:
        return InputError(exc.message, f"{exc.hint}; or let qvl resize it: {resize}" if resizable else exc.hint)
    need = round_up(item.patches)
    command = recompile(f"visual.max_seq_len={_list_arg(sorted({*buckets, need}))}")
    cost = bucket_memory(need) if bucket_memory is not None else None
    resized = f"run it resized to the largest bucket {buckets[-1]}: {resize}, or cap the processor: " + _cap_fix(
        item, buckets[-1], geo
    )
    if cost:  # the resize first: the recompile is offered only with what it costs
        recompiled = bucket_cost_clause(need, f"a recompile: `{command}`", cost)
        return InputError(exc.message, f"{resized}; {recompiled}" if resizable else recompiled)
    hint = f"the compiled ViT buckets cannot change at run time: recompile with a bucket that fits: `{command}`"
    if resizable:
        hint += f"; or {resized}"
    return InputError(exc.message, hint)


def _capped_caps(caps: Any, over: list[VisionItem], largest: int, geo: dict[str, int]) -> Any:
    """``caps`` lowered just enough for ``over`` (one request's oversize inputs) to fit the largest bucket."""
    ps = geo["patch_size"]
    new = caps
    if any(i.kind == "image" for i in over):
        cap = min(caps.max_pixels, max_pixels_for_bucket(largest, ps))
        new = replace(new, max_pixels=cap, min_pixels=min(new.min_pixels, cap))
    if any(i.kind == "video" for i in over):  # per frame (vision/frame_cap.py): long videos keep their budget
        frame_cap = max_pixels_for_bucket(largest, ps)
        new = replace(new, video_max_frame_pixels=min(caps.video_max_frame_pixels or frame_cap, frame_cap))
    return new


def _plan_request(
    req: Any,
    caps: Any,
    buckets: list[int],
    geo: dict[str, int],
    on_oversize: str,
    recompile: Callable[[str], str] | None,
    bucket_memory: Callable[[int], str | None] | None = None,
) -> tuple[list[VisionItem], Any, list[dict[str, Any]]]:
    """(items, caps, capped entries) of one request, decided from that request alone."""
    items = _request_items(req, caps, buckets, geo)
    over = [i for i in items if i.bucket is None]
    if not over:
        return items, caps, []
    if on_oversize == "error":
        raise _oversize_error(over[0], buckets, geo, recompile, bucket_memory=bucket_memory)
    new_caps = _capped_caps(caps, over, buckets[-1], geo)
    new_items = _request_items(req, new_caps, buckets, geo)
    still = [i for i in new_items if i.bucket is None]
    if still:  # the max(factor, ...) floor of extreme aspect ratios: resizing cannot help
        raise _oversize_error(still[0], buckets, geo, recompile, resizable=False, bucket_memory=bucket_memory)
    capped = []
    for old, it in zip(items, new_items, strict=True):
        if old.bucket is None:
            it.oversize_capped, it.patches_before_cap = True, old.patches
            capped.append(
                {
                    "request": req.id,
                    "input": it.input,
                    "kind": it.kind,
                    "patches_before": old.patches,
                    "patches": it.patches,
                    "bucket": it.bucket,
                }
            )
        elif (old.resized_width, old.resized_height) != (it.resized_width, it.resized_height):
            it.notes.append("resized smaller by its request's oversize cap")
    return new_items, new_caps, capped


def plan_vision(
    requests: list[Any],
    caps: Any,
    buckets: list[int],
    *,
    on_oversize: str = "resize",
    patch_size: int = 16,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
    recompile: Callable[[str], str] | None = None,
    stock: dict[str, int] | None = None,
    bucket_memory: Callable[[int], str | None] | None = None,
) -> VisionPlan:
    """Bucket every image/video of ``requests`` (their ``image_info``/``video_info`` must be probed).

    ``caps`` is a ``plan.ProcessorCaps``; ``buckets`` the ViT buckets (any order). ``recompile(set)``
    gives the `qvl compile` command that adds ``--set set`` to the artifact (None: the buckets come from
    the preset, so ``--set visual.max_seq_len`` itself is the fix). ``bucket_memory`` (``bucket_memory_check``)
    marks an added bucket the plan has no memory for, and puts the resize first.
    """
    from qwenvl_rbln.inference.requests import FLAGS_SOURCE

    if on_oversize not in ON_OVERSIZE:
        raise InputError(
            f"--on-oversize {on_oversize!r} is not one of {', '.join(ON_OVERSIZE)}",
            "use --on-oversize resize (default) or --on-oversize error",
        )
    buckets = sorted(buckets)
    geo = {"patch_size": patch_size, "merge_size": merge_size, "temporal_patch_size": temporal_patch_size}
    if stock:  # the model's own processor caps (modelinfo.processor_defaults): what "capped" is measured against
        geo["stock_max_pixels"], geo["stock_video_max_pixels"] = stock["max_pixels"], stock["video_max_pixels"]
    items: dict[str, list[VisionItem]] = {}
    request_caps: dict[str, Any] = {}
    capped: list[dict[str, Any]] = []
    problems: list[InputError] = []  # every request that cannot run, reported together
    for req in requests:
        try:
            items[req.id], request_caps[req.id], req_capped = _plan_request(
                req, caps, buckets, geo, on_oversize, recompile, bucket_memory
            )
        except InputError as exc:  # name the batch file's line, as inputs.check_media does
            source = getattr(req, "source", FLAGS_SOURCE)
            prefix = "" if source == FLAGS_SOURCE else f"{source}: "
            problems.append(InputError(prefix + exc.message, exc.hint))
            continue
        capped.extend(req_capped)
    raise_all(problems, "requests cannot run", "correct each one listed; nothing ran")
    return VisionPlan(
        items=items, caps=caps, request_caps=request_caps, buckets=buckets, on_oversize=on_oversize, capped=capped
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
