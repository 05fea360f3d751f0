"""Items of a bucket plan: one dict per image, video, size or workload line, with its resized geometry,
ViT patches, bucket, padding and ViT calls under one plan's buckets and processor caps.

Header reads and arithmetic only (no torch, no terminal); ``bucket_report.py`` sums the items up.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import QvlError
from qwenvl_rbln.planning.catalogue.modelinfo import processor_defaults
from qwenvl_rbln.vision import context, geometry
from qwenvl_rbln.vision.buckets import oversize_error, padding_pct, select_bucket, vit_cost_fn


def blank_item(input_name: str, kind: str, source: str, count: int = 1) -> dict[str, Any]:
    """An item with every reported key present (None until planned), so the JSON shape never varies."""
    return {
        "input": input_name,
        "kind": kind,
        "source": source,
        "count": count,
        "width": None,
        "height": None,
        "resized_width": None,
        "resized_height": None,
        "patches": None,
        "bucket": None,
        "padding_pct": None,
        "lm_tokens": None,
        "vit_calls": None,
        "vit_calls_packed": None,
        "capped": None,
        "oversize_capped": None,
        "lm_fit": None,
        "error": None,
    }


class ItemPlanner:
    """Turns sizes and files into item dicts under one plan's buckets and processor caps."""

    def __init__(
        self,
        plan: Any,
        on_oversize: str | None = None,
        bucket_memory: Callable[[int], str | None] | None = None,
    ):
        self.plan = plan
        # the memory planner's word on an added bucket, handed down (buckets.oversize_error): None asks nothing
        self.bucket_memory = bucket_memory
        # one policy (runtime.on_oversize / --on-oversize) for bucket-plan, infer and serve: resize or error
        self.on_oversize = on_oversize or getattr(plan, "runtime", {}).get("on_oversize", "resize")
        self.buckets: list[int] = list(plan.vit_buckets)
        self.caps = plan.processor
        self.vision = plan.geometry.vision
        self.stock = processor_defaults(plan.model_id)
        self.packing = bool(getattr(plan, "runtime", {}).get("vit_packing", True))
        self.cost = vit_cost_fn(self.vision)
        self.max_seq_len: int = plan.resolved.max_seq_len

    def image(self, item: dict[str, Any], width: int, height: int) -> dict[str, Any]:
        """One image size planned, resized into the largest bucket under ``--on-oversize resize``."""
        return self._policy(self._image(item, width, height), lambda p, it: p._image(it, width, height))

    def video(self, item: dict[str, Any], width: int, height: int, frames: int, fps: float | None) -> dict[str, Any]:
        """One video planned, each frame resized into the largest bucket under ``--on-oversize resize``."""
        planned = self._video(item, width, height, frames, fps)
        return self._policy(planned, lambda p, it: p._video(it, width, height, frames, fps))

    def _policy(self, item: dict[str, Any], redo: Any) -> dict[str, Any]:
        """An item above the largest bucket: under ``resize`` planned again under the cap infer applies to it
        (``inference.vision_report``), reported as capped with its resized size; under ``error`` left as is."""
        item["oversize_capped"] = False if item["patches"] is not None else None
        if item["bucket"] is not None or item["patches"] is None or self.on_oversize != "resize":
            return item
        cap = self.buckets[-1] * self.vision.patch_size**2
        key = "video_max_frame_pixels" if item["kind"] == "video" else "max_pixels"
        changes: dict[str, int] = {key: min(getattr(self.caps, key) or cap, cap)}
        if key == "max_pixels":
            changes["min_pixels"] = min(self.caps.min_pixels, cap)
        fresh = blank_item(item["input"], item["kind"], item["source"], item["count"])
        if "images" in item:
            fresh["images"] = item["images"]
        new = redo(self.with_caps(dataclasses.replace(self.caps, **changes)), fresh)
        if new["bucket"] is None:  # the max(factor, ...) floor of extreme aspect ratios: resizing cannot help
            return item
        new.update(capped=True, oversize_capped=True, patches_before_cap=item["patches"])
        new.setdefault("notes", []).append(
            f"{item['patches']} patches above the largest ViT bucket {self.buckets[-1]}: resized with processor.{key}="
            f"{changes[key]} for its request (--on-oversize resize)"
        )
        return new

    # the geometry of one image size, with the bucket and padding
    def _image(self, item: dict[str, Any], width: int, height: int) -> dict[str, Any]:
        v = self.vision
        item["width"], item["height"] = width, height
        try:
            geo = geometry.image_geometry_for(
                width, height, self.caps, patch_size=v.patch_size, merge_size=v.spatial_merge_size
            )
        except QvlError as exc:
            item["error"] = f"{item['input']}: {exc.one_line()}"
            return item
        images = item.get("images", 1)  # a workload line's "images": N, one request
        item.update(
            resized_width=geo.resized_width,
            resized_height=geo.resized_height,
            patches=geo.patches,
            lm_tokens=geo.lm_tokens * images,
            vit_calls=images,
            lm_fit=context.item_fit(images * context.image_tokens(geo.lm_tokens), self.max_seq_len),
        )
        item["capped"] = geometry.image_capped(  # the one meaning infer reports too
            width, height, self.caps, self.stock["max_pixels"], patch_size=v.patch_size, merge_size=v.spatial_merge_size
        )
        return self._bucket(item, "image")

    def _video(self, item: dict[str, Any], width: int, height: int, frames: int, fps: float | None) -> dict[str, Any]:
        v = self.vision
        c = self.caps
        item.update(width=width, height=height, total_frames=frames, fps=fps)
        try:
            geo = geometry.video_geometry_for(
                width,
                height,
                frames,
                fps,
                c,
                patch_size=v.patch_size,
                merge_size=v.spatial_merge_size,
                temporal_patch_size=v.temporal_patch_size,
            )
        except QvlError as exc:
            item["error"] = f"{item['input']}: {exc.one_line()}"
            return item
        item.update(
            resized_width=geo.resized_width,
            resized_height=geo.resized_height,
            patches=geo.patches,
            lm_tokens=geo.lm_tokens,
            vit_calls=geo.vit_calls,
            sampled_frames=geo.sampled_frames,
            notes=list(geo.notes),
            capped=False,
            lm_fit=context.item_fit(
                context.video_tokens(geo.lm_tokens, geo.temporal_patches, frames, fps), self.max_seq_len
            ),
        )
        item["capped"] = geometry.video_capped(  # the one meaning infer reports too
            width,
            height,
            frames,
            fps,
            c,
            self.stock["video_max_pixels"],
            patch_size=v.patch_size,
            merge_size=v.spatial_merge_size,
            temporal_patch_size=v.temporal_patch_size,
        )
        return self._bucket(item, "video", frames=geo.sampled_frames)

    def _bucket(self, item: dict[str, Any], kind: str, frames: int | None = None) -> dict[str, Any]:
        patches = item["patches"]
        bucket = select_bucket(patches, self.buckets)
        item["bucket"] = bucket
        if bucket is None:
            item["error"] = oversize_error(
                item["input"],
                patches,
                self.buckets,
                kind=kind,
                frames=frames,
                patch_size=self.vision.patch_size,
                temporal_patch_size=self.vision.temporal_patch_size,
                bucket_memory=self.bucket_memory,
            ).one_line()
        elif item["lm_fit"] and not item["lm_fit"]["fits"]:  # the context is a compiled shape too: infer refuses it
            fit = item["lm_fit"]
            reserve = f"a reserve of {fit['reserve']} for the template, prompt text and output"
            message = context.length_message(
                item["input"], fit["tokens"], fit["reserve"], fit["max_seq_len"], fit["tokens"], new=reserve
            )
            item["error"] = f"{message}; fix: {context.LENGTH_FIX}"
        if bucket is not None:
            item["padding_pct"] = padding_pct(patches, bucket)  # the one rounding infer reports too
            item["vit_calls_packed"] = item["vit_calls"]
            if self.packing:  # one request's segments share calls (packing.py); requests are never packed together
                from qwenvl_rbln.vision.packing import uniform_cost

                item["vit_calls_packed"] = uniform_cost(patches, item["vit_calls"], self.buckets, self.cost)[0]
        return item

    def file(self, path: Path) -> dict[str, Any]:
        from qwenvl_rbln.vision.media import classify, probe_image, probe_video

        kind = classify(path)
        item = blank_item(str(path), kind, "file")
        try:
            if kind == "video":
                info = probe_video(path)
                return self.video(item, info.width, info.height, info.total_frames, info.fps)
            info = probe_image(path)
        except QvlError as exc:
            item["error"] = exc.one_line()
            return item
        except Exception as exc:  # a probe bug must not hide the other items
            item["error"] = f"{path}: could not be read ({type(exc).__name__}: {exc})"
            return item
        return self.image(item, info.width, info.height)

    def size(self, text: str, width: int, height: int) -> dict[str, Any]:
        return self.image(blank_item(text, "size", "size"), width, height)

    def with_caps(self, caps: Any) -> ItemPlanner:
        """The same planner under other processor caps (to show what a suggested --set processor.* does)."""
        other = copy.copy(self)
        other.caps = caps
        return other

    def again(self, item: dict[str, Any]) -> dict[str, Any]:
        """A planned item planned again under this planner's caps, from its known size (no file is re-read)."""
        new = blank_item(item["input"], item["kind"], item["source"], item["count"])
        if "images" in item:
            new["images"] = item["images"]
        if item["kind"] == "video":
            return self.video(new, item["width"], item["height"], item["total_frames"], item["fps"])
        return self.image(new, item["width"], item["height"])

    def workload_entry(self, key: tuple, count: int) -> dict[str, Any]:
        width, height, frames, fps = key[:4]
        if frames is None:
            images = key[4] if len(key) > 4 else 1
            item = blank_item(f"{width}x{height}" + (f" x{images}" if images > 1 else ""), "size", "workload", count)
            if images > 1:
                item["images"] = images
            return self.image(item, width, height)
        rate = f"@{fps:g}fps" if fps else ""
        item = blank_item(f"{width}x{height} {frames}f{rate}", "video", "workload", count)
        return self.video(item, width, height, frames, fps)
