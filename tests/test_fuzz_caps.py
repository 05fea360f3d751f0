"""Fuzz: 1,000 random images and videos (1,200 more for largest buckets of 256-768 patches) through transformers'
own Qwen3-VL processor, loaded from an emulated artifact's directory with qvl's per-frame cap installed as the vLLM
plugin installs it (on the class, read from the artifact's config). Every ViT segment fits the largest compiled
bucket, and every patch count and ViT call count equals what `qvl bucket-plan` predicts for the same input; what one
refuses, the other refuses.

Images: 1 px to 8K (7680 px), aspect ratios up to 1:200 (and a few beyond, which both must refuse). Videos: 1 to
2,000 frames, 0.5 to 60 fps, sizes up to 8K. Decoding 1,000 8K inputs would take minutes, so the sizes go through the
processor's own size code: the image processor's ``get_number_of_image_patches`` and the video processor's
``sample_frames`` and ``resize`` (transformers' ``smart_resize`` under the patched resize, with only the final pixel
resampling stubbed out); small inputs are also processed as real arrays, pixels and all. Seeded: deterministic.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("transformers")

from qwenvl_rbln.planning.plan import build_plan  # noqa: E402
from qwenvl_rbln.vision import frame_cap  # noqa: E402
from qwenvl_rbln.vision.bucket_plan.items import ItemPlanner  # noqa: E402

N = 1000
SEED = 22
EIGHT_K = 7680


def _draws(rng: np.random.Generator) -> list[dict]:
    out = []
    for i in range(N):
        long_side = int(math.exp(rng.uniform(0, math.log(EIGHT_K))))  # 1 px .. 8K, log-uniform
        ratio = math.exp(rng.uniform(0, math.log(200))) if i % 50 else rng.uniform(200, 260)  # 2 % beyond 1:200
        short = max(1, round(long_side / ratio))
        w, h = (long_side, short) if rng.random() < 0.5 else (short, long_side)
        if i % 2:
            out.append({"kind": "image", "width": w, "height": h})
        else:
            frames = int(math.exp(rng.uniform(0, math.log(2000))))  # 1 .. 2000
            out.append({"kind": "video", "width": w, "height": h, "frames": frames, "fps": rng.uniform(0.5, 60)})
    return out


@pytest.fixture(scope="module")
def artifact_processor(tiny_rbln):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(tiny_rbln), local_files_only=True)


@pytest.fixture
def size_probe(monkeypatch):
    """transformers' Qwen3VLVideoProcessor.resize with the plugin's class patch, and the final pixel resampling
    (the parent class's resize) replaced by a probe returning the target shape: the size code runs, no pixels."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_processing_utils import BaseVideoProcessor

    monkeypatch.setattr(Qwen3VLVideoProcessor, "resize", Qwen3VLVideoProcessor.resize)  # restored afterwards
    frame_cap.install_on_class()

    def probe(self, image, size, resample=None, **kw):
        return SimpleNamespace(shape=(*image.shape[:-2], size.height, size.width))

    monkeypatch.setattr(BaseVideoProcessor, "resize", probe, raising=False)


def _processor_video(vp, d) -> tuple[int, int, int] | str:
    """(grid_t, grid_h, grid_w) as transformers' video processor makes them, or the error it raises."""
    from transformers.video_utils import VideoMetadata

    meta = VideoMetadata(total_num_frames=d["frames"], fps=d["fps"])
    try:
        t = len(vp.sample_frames(meta))
        fake = SimpleNamespace(shape=(1, t, 3, d["height"], d["width"]))
        out = vp.resize(fake, size=vp.size, resample=vp.resample, factor=32, temporal_factor=vp.temporal_patch_size)
    except ValueError as exc:
        return str(exc)
    grid_t = -(-t // vp.temporal_patch_size)  # patchify repeats the last frame to a multiple of 2
    return grid_t, out.shape[-2] // vp.patch_size, out.shape[-1] // vp.patch_size


def _planned_and_processed(planner, ip, vp, d):
    """bucket-plan's entry for draw ``d`` and what transformers' processor makes of it: (item, processor result,
    ViT calls, patches per call), the result a string where transformers refuses the input."""
    if d["kind"] == "image":
        item = planner.workload_entry((d["width"], d["height"], None, None), 1)
        got = _processor_image(ip, d)
        return item, got, 1, got
    item = planner.workload_entry((d["width"], d["height"], d["frames"], d["fps"]), 1)
    got = _processor_video(vp, d)
    return (item, got, got[0], got[1] * got[2]) if not isinstance(got, str) else (item, got, None, got)


def _processor_image(ip, d) -> int | str:
    try:
        return ip.get_number_of_image_patches(d["height"], d["width"])
    except ValueError as exc:
        return str(exc)


def test_every_segment_fits_and_matches_bucket_plan(artifact_processor, size_probe, tiny_rbln):
    plan = build_plan("cpu-tiny-rbln")
    largest = max(plan.vit_buckets)
    proc = json.loads((tiny_rbln / "processor_config.json").read_text())
    assert proc["video_processor"]["qvl_max_frame_pixels"] == largest * 256  # the artifact carries the cap
    planner = ItemPlanner(plan)
    ip, vp = artifact_processor.image_processor, artifact_processor.video_processor
    seen = {"image": 0, "video": 0, "refused": 0, "frame_capped": 0}
    for d in _draws(np.random.default_rng(SEED)):
        item, got, calls, patches = _planned_and_processed(planner, ip, vp, d)
        if isinstance(got, str):  # transformers refuses it (aspect over 200, fewer than 2 frames): so does qvl
            assert item["patches"] is None and item["error"], (d, got, item)
            seen["refused"] += 1
            continue
        assert item["patches"] == patches and item["vit_calls"] == calls, (d, got, item)
        assert patches <= largest and item["bucket"] is not None, (d, got)  # every segment fits
        seen[d["kind"]] += 1
        seen["frame_capped"] += d["kind"] == "video" and item["capped"]
    # the draw covers each case: images, videos, the refusals, and videos the per-frame cap resized
    assert seen["image"] > 400 and seen["video"] > 350 and seen["refused"] > 10 and seen["frame_capped"] > 15, seen


def test_small_inputs_processed_as_real_arrays_match_too(artifact_processor):
    """Pixels and all, for the draws that are cheap to allocate: the same grids as the size code and bucket-plan."""
    plan = build_plan("cpu-tiny-rbln")
    planner = ItemPlanner(plan)
    rng = np.random.default_rng(SEED + 1)
    checked = 0
    vp = artifact_processor.video_processor
    frame_cap.install_on_instance(vp, vp.qvl_max_frame_pixels)  # as qvl infer installs it, from the artifact's file
    for _ in range(12):
        w, h = int(rng.integers(1, 700)), int(rng.integers(1, 700))
        if max(w, h) / min(w, h) > 200:
            continue
        image = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        out = artifact_processor.image_processor(images=[image], return_tensors="pt")
        item = planner.workload_entry((w, h, None, None), 1)
        assert int(out["image_grid_thw"][0].prod()) == item["patches"], (w, h)
        checked += 1
    for frames, (w, h) in ((4, (1600, 900)), (6, (640, 360)), (2, (1280, 720))):
        video = rng.integers(0, 255, (frames, h, w, 3), dtype=np.uint8)
        out = vp(videos=[video], do_sample_frames=False, return_tensors="pt")
        t, gh, gw = (int(x) for x in out["video_grid_thw"][0])
        item = planner.workload_entry((w, h, frames, 2.0), 1)  # 2 fps sampling of `frames` frames keeps them all
        assert (gh * gw, t) == (item["patches"], item["vit_calls"]) and gh * gw <= max(plan.vit_buckets)
        checked += 1
    assert checked >= 10


# --- small largest buckets (sources audit W5): the 32-px minimum side --------------------------------------------

SMALL_BUCKETS = (256, 384, 512, 640, 768)
SMALL_N = 240  # draws per bucket, most of them thin


def _thin_draws(rng: np.random.Generator, bucket: int) -> list[dict]:
    """Aspect ratios up to 200, two thirds of them above ``bucket / 8`` (where the minimum side starts to matter)."""
    out = []
    for i in range(SMALL_N):
        low = bucket / 8 if i % 3 else 1.0
        ratio = math.exp(rng.uniform(math.log(low), math.log(200)))
        long_side = int(math.exp(rng.uniform(math.log(64), math.log(EIGHT_K * 16))))  # up to 122,880 px
        short = max(1, round(long_side / ratio))
        w, h = (long_side, short) if rng.random() < 0.5 else (short, long_side)
        if i % 2:
            out.append({"kind": "image", "width": w, "height": h})
        else:
            frames = int(math.exp(rng.uniform(math.log(2), math.log(600))))
            out.append({"kind": "video", "width": w, "height": h, "frames": frames, "fps": rng.uniform(0.5, 30)})
    return out


def test_small_largest_buckets_hold_every_input_or_refuse_it_by_its_aspect(tiny_model, size_probe):
    """Largest buckets 256-768: a video is resized so each temporal patch fits (the per-frame cap lowers a thin
    frame's budget, in the processor and in bucket-plan alike); an image the minimum side would lift over the
    bucket is refused naming the aspect limit (and one min_pixels rounds up over it, with 256, naming that), and
    transformers indeed gives each refused image more patches than the bucket."""
    from transformers import AutoProcessor

    from qwenvl_rbln.inference.inputs import apply_caps

    seen = {"fit": 0, "thin_video_capped": 0, "thin_image_refused": 0}
    for bucket in SMALL_BUCKETS:
        plan = build_plan("cpu-tiny-rbln", [f"visual.max_seq_len=[{bucket}]"])
        processor = AutoProcessor.from_pretrained(str(tiny_model), local_files_only=True)
        apply_caps(processor, plan.processor)  # as qvl infer does (the artifact's files carry the same caps)
        assert processor.video_processor.qvl_max_frame_pixels == bucket * 256
        planner = ItemPlanner(plan)
        ip, vp = processor.image_processor, processor.video_processor
        for d in _thin_draws(np.random.default_rng(SEED + bucket), bucket):
            ratio = max(d["width"], d["height"]) / min(d["width"], d["height"])
            item, got, calls, patches = _planned_and_processed(planner, ip, vp, d)
            if isinstance(got, str):  # transformers refuses it: so does qvl
                assert item["patches"] is None and item["error"], (bucket, d, got, item)
                continue
            if d["kind"] == "image" and patches > bucket:  # refused, saying why: the minimum side or min_pixels
                assert item["patches"] is None and f"over processor.max_pixels={bucket * 256}" in item["error"]
                thin = "crop or pad it to an aspect ratio of at most" in item["error"]
                assert thin == (ratio > bucket / 4 - 1) or "processor.min_pixels=" in item["error"], (bucket, d, item)
                seen["thin_image_refused"] += thin
                continue
            assert item["patches"] == patches and item["vit_calls"] == calls, (bucket, d, got, item)
            assert patches <= bucket and item["bucket"] == bucket, (bucket, d, got)
            seen["fit"] += 1
            seen["thin_video_capped"] += d["kind"] == "video" and ratio > bucket / 4
    assert seen["fit"] > 600 and seen["thin_video_capped"] > 50 and seen["thin_image_refused"] > 30, seen
