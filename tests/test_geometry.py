"""geometry.py must reproduce transformers 5.15.1's Qwen3-VL preprocessing exactly.

The hand-written cases pin the reference doc's worked values; the comparison tests run the real
transformers functions and processors (skipped when transformers is not installed).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.vision import frame_cap
from qwenvl_rbln.vision import geometry as g

# --- reference doc section 5 worked values ----------------------------------------------------------


@pytest.mark.parametrize(
    ("h", "w", "rh", "rw", "patches", "tokens"),
    [
        (224, 224, 256, 256, 256, 64),
        (512, 512, 512, 512, 1024, 256),
        (720, 1280, 704, 1280, 3520, 880),
        (1080, 1920, 1088, 1920, 8160, 2040),
        (2048, 2048, 2048, 2048, 16384, 4096),
        (4000, 3000, 4000, 3008, 47000, 11750),
    ],
)
def test_image_worked_table(h: int, w: int, rh: int, rw: int, patches: int, tokens: int) -> None:
    assert g.smart_resize(h, w) == (rh, rw)
    geo = g.image_geometry(w, h)
    assert (geo.resized_height, geo.resized_width) == (rh, rw)
    assert (geo.grid_h, geo.grid_w) == (rh // 16, rw // 16)
    assert geo.patches == patches
    assert geo.lm_tokens == tokens


@pytest.mark.parametrize(
    ("frames", "h", "w", "rh", "rw", "patches", "calls", "tokens"),
    [
        (16, 720, 1280, 704, 1280, 3520, 8, 7040),
        (64, 720, 1280, 448, 832, 1456, 32, 11648),
        (4, 1080, 1920, 1088, 1920, 8160, 2, 4080),
        (4, 2160, 3840, 1856, 3328, 24128, 2, 12064),  # doc: "~24k patches" (over a 16384 bucket)
    ],
)
def test_video_worked_examples(
    frames: int, h: int, w: int, rh: int, rw: int, patches: int, calls: int, tokens: int
) -> None:
    assert g.video_smart_resize(frames, h, w) == (rh, rw)
    # `frames` frames at 2 fps sample exactly `frames` frames with the shipped fps=2.
    geo = g.video_geometry(w, h, frames, 2.0)
    assert geo.sampled_frames == frames
    assert (geo.resized_height, geo.resized_width) == (rh, rw)
    assert (geo.patches, geo.vit_calls, geo.temporal_patches) == (patches, calls, calls)
    assert geo.lm_tokens == tokens


# --- exact-behaviour details ------------------------------------------------------------------------


def test_bankers_rounding() -> None:
    # 80 / 32 = 2.5 rounds to 2 (half-to-even), not 3.
    assert g.smart_resize(80, 4000, min_pixels=1) == (64, 4000)
    assert g.smart_resize(112, 4000, min_pixels=1) == (128, 4000)  # 3.5 -> 4


def test_aspect_ratio_limit() -> None:
    assert g.smart_resize(10, 2000)  # exactly 200 is allowed
    with pytest.raises(InputError) as e:
        g.image_geometry(2001, 10)
    assert "2001x10" in e.value.message and "200" in e.value.message
    assert e.value.hint
    with pytest.raises(InputError):
        g.video_smart_resize(4, 10, 2001)
    with pytest.raises(InputError):
        g.image_geometry(0, 10)


def test_a_thin_video_refused_for_its_aspect_names_its_own_size() -> None:
    """transformers scales a side below 32 px up before its aspect test (16x4000 -> 32x8000); the refusal names the
    size the user's file has, as the bucket-plan table does (new-user audit D15)."""
    for call in (
        lambda: g.video_smart_resize(4, 4000, 16),
        lambda: g.video_geometry(16, 4000, 48, 24.0),
    ):
        with pytest.raises(InputError) as e:
            call()
        assert e.value.message.startswith("size 16x4000 (WxH) has aspect ratio 250.0"), e.value.message
        assert "32x8000" not in e.value.message


def test_a_thin_short_video_fits_a_small_largest_bucket() -> None:
    """Sources audit W5: with the per-frame cap of a largest bucket of 512, a 4-frame 484x96,300 clip came out at
    32x5,088 px, 636 patches. The cap lowers a thin frame's budget so the minimum side cannot lift it over."""
    kw = {"fps": None, "min_frames": 4, "max_frames": 4, "max_frame_pixels": 512 * 256}
    geo = g.video_geometry(484, 96300, 4, 2.0, **kw)
    assert geo.resized_width == 32 and geo.patches <= 512
    lo, hi = frame_cap.video_budget(4, g.VIDEO_MIN_PIXELS, g.VIDEO_MAX_PIXELS, 512 * 256)  # without the frame size
    normal = g.video_geometry(1920, 1080, 4, 2.0, **kw)  # a frame the floor does not touch keeps its budget
    assert (normal.resized_height, normal.resized_width) == g.video_smart_resize(
        4, 1080, 1920, min_pixels=lo, max_pixels=hi
    )


def test_an_image_the_minimum_side_lifts_over_max_pixels_is_refused_naming_the_aspect_limit() -> None:
    from qwenvl_rbln.planning.plan import ProcessorCaps

    caps = ProcessorCaps(min_pixels=4096, max_pixels=512 * 256, video_min_pixels=4096, video_max_pixels=25165824)
    assert g.image_geometry(100, 20000, min_pixels=4096, max_pixels=512 * 256).patches == 640  # what transformers does
    with pytest.raises(InputError) as e:
        g.image_geometry_for(100, 20000, caps)
    assert "aspect ratio 200.0 is over 130.0" in e.value.message and "640 patches" in e.value.message
    assert "at most 130.0" in e.value.hint
    assert g.image_geometry_for(100, 12900, caps).patches <= 512  # 129:1 fits
    assert g.aspect_limit(800) > 200 > g.aspect_limit(768)  # only buckets below 800 are concerned


def test_max_floor_branch_for_skinny_images() -> None:
    # With a tiny budget the short side floors to 0 and is lifted to `factor`, so the result
    # overshoots max_pixels: the one case where smart_resize does not honour its budget.
    h, w = g.smart_resize(6400, 32, max_pixels=32 * 32 * 10)
    assert (h, w) == (1408, 32)
    assert h * w > 32 * 32 * 10


@pytest.mark.parametrize(
    ("total", "vfps", "expected"),
    [
        (30, 10.0, 6),  # 3 s at 2 fps
        (7, 2.0, 7),  # odd count kept; patchify pads to 8
        (3, None, 3),  # no fps -> 24 assumed -> 0 -> min_frames 4 -> capped at total 3
        (1, 30.0, 1),
        (100_000, 30.0, 768),  # max_frames
        (48, 24.0, 4),  # 2 s -> 4
        (10, 0.0, 4),  # fps 0 treated as missing (transformers would divide by zero)
    ],
)
def test_sample_frame_count(total: int, vfps: float | None, expected: int) -> None:
    assert g.sample_frame_count(total, vfps) == expected


def test_sample_frame_count_other_paths() -> None:
    assert g.sample_frame_count(2, 30.0, fps=None) == 4  # no fps: not capped at total, frames repeat
    assert g.sample_frame_count(2000, 30.0, fps=None) == 768
    assert g.sample_frame_count(100, 30.0, fps=None, num_frames=10) == 10
    with pytest.raises(InputError):
        g.sample_frame_count(100, 30.0, fps=2, num_frames=10)


def test_video_geometry_notes_and_padding() -> None:
    geo = g.video_geometry(64, 48, 7, None)
    assert geo.video_fps == 24.0
    assert geo.sampled_frames == 4  # int(7/24*2)=0 -> min_frames 4
    assert any("24 fps" in n for n in geo.notes)
    odd = g.video_geometry(64, 48, 7, 2.0)
    assert (odd.sampled_frames, odd.padded_frames, odd.temporal_patches) == (7, 8, 4)
    assert any("padded" in n for n in odd.notes)
    d = odd.to_dict()
    assert d["notes"] == list(odd.notes) and d["lm_tokens"] == odd.lm_tokens
    with pytest.raises(InputError) as e:
        g.video_geometry(64, 48, 1, 30.0)
    assert "1 sampled frame" in e.value.message
    with pytest.raises(InputError):
        g.video_geometry(64, 48, 0, 30.0)


def test_video_upscales_small_frames() -> None:
    # 8x8 -> 32x32 before budgeting (image smart_resize has no such step).
    assert g.video_smart_resize(5, 8, 8) == (32, 32)
    assert g.video_smart_resize(4, 10, 100) == (32, 320)


def test_bucket_helpers() -> None:
    assert g.max_pixels_for_bucket(1024) == 262144
    assert g.max_pixels_for_bucket(768) == 768 * 256
    assert g.video_max_pixels_for_bucket(16384, 4) == 16384 * 256 * 4
    assert g.video_max_pixels_for_bucket(16384, 5) == 16384 * 256 * 4  # t_bar = round(2.5)*2 = 4
    assert g.video_max_pixels_for_bucket(16384, 7) == 16384 * 256 * 7
    with pytest.raises(InputError):
        g.video_max_pixels_for_bucket(1024, 1)


def test_image_geometry_to_dict() -> None:
    d = g.image_geometry(1280, 720).to_dict()
    assert d == {
        "width": 1280,
        "height": 720,
        "resized_width": 1280,
        "resized_height": 704,
        "grid_h": 44,
        "grid_w": 80,
        "patches": 3520,
        "lm_tokens": 880,
    }


def test_module_imports_nothing_heavy() -> None:
    code = (
        "import sys, qwenvl_rbln.vision.geometry, qwenvl_rbln.vision.media; "
        "bad = [m for m in ('torch', 'transformers', 'PIL', 'av', 'numpy') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


# --- property tests (pure) -------------------------------------------------------------------------

_side = st.integers(min_value=1, max_value=20000)


def _aspect_ok(h: int, w: int) -> bool:
    return max(h, w) / min(h, w) <= 200


@settings(max_examples=400, deadline=None)
@given(h=_side, w=_side, bucket=st.sampled_from([1024, 4096, 16384]))
def test_image_bucket_never_exceeded(h: int, w: int, bucket: int) -> None:
    if not _aspect_ok(h, w):
        return
    geo = g.image_geometry(w, h, max_pixels=g.max_pixels_for_bucket(bucket))
    assert geo.patches <= bucket
    assert geo.resized_height % 32 == 0 and geo.resized_width % 32 == 0


@settings(max_examples=400, deadline=None)
@given(
    h=st.integers(1, 8000),
    w=st.integers(1, 8000),
    min_frames=st.integers(2, 12),
    extra=st.integers(0, 40),
    bucket=st.sampled_from([1024, 4096, 16384]),
)
def test_video_bucket_never_exceeded(h: int, w: int, min_frames: int, extra: int, bucket: int) -> None:
    if not _aspect_ok(h, w):
        return
    frames = min_frames + extra  # any sampled count >= the one the budget was made for
    rh, rw = g.video_smart_resize(frames, h, w, max_pixels=g.video_max_pixels_for_bucket(bucket, min_frames))
    assert (rh // 16) * (rw // 16) <= bucket


# --- against the real transformers code ------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(
    h=st.integers(1, 200_000),
    w=st.integers(1, 200_000),
    min_pixels=st.sampled_from([1, 3136, 65536, 262144]),
    max_pixels=st.sampled_from([200_000, 262144, 1048576, 16777216, 10**9]),
)
def test_smart_resize_matches_transformers(h: int, w: int, min_pixels: int, max_pixels: int) -> None:
    mod = pytest.importorskip("transformers.models.qwen2_vl.image_processing_qwen2_vl")
    try:
        expected = mod.smart_resize(h, w, factor=32, min_pixels=min_pixels, max_pixels=max_pixels)
    except ValueError:
        with pytest.raises(InputError):
            g.smart_resize(h, w, 32, min_pixels, max_pixels)
        return
    assert g.smart_resize(h, w, 32, min_pixels, max_pixels) == expected


@settings(max_examples=500, deadline=None)
@given(
    t=st.integers(2, 1000),
    h=st.integers(1, 20000),
    w=st.integers(1, 20000),
    min_pixels=st.sampled_from([4096, 131072]),
    max_pixels=st.sampled_from([786432, 4194304, 25165824]),
)
def test_video_smart_resize_matches_transformers(t: int, h: int, w: int, min_pixels: int, max_pixels: int) -> None:
    mod = pytest.importorskip("transformers.models.qwen3_vl.video_processing_qwen3_vl")
    try:
        expected = mod.smart_resize(t, h, w, temporal_factor=2, factor=32, min_pixels=min_pixels, max_pixels=max_pixels)
    except ValueError:
        with pytest.raises(InputError):
            g.video_smart_resize(t, h, w, min_pixels=min_pixels, max_pixels=max_pixels)
        return
    assert g.video_smart_resize(t, h, w, min_pixels=min_pixels, max_pixels=max_pixels) == expected


@pytest.fixture(scope="module")
def image_processor():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torchvision")
    return transformers.Qwen2VLImageProcessor(
        size={"shortest_edge": g.IMAGE_MIN_PIXELS, "longest_edge": g.IMAGE_MAX_PIXELS},
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )


@pytest.fixture(scope="module")
def video_processor():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torchvision")
    return transformers.Qwen3VLVideoProcessor(
        size={"shortest_edge": g.VIDEO_MIN_PIXELS, "longest_edge": g.VIDEO_MAX_PIXELS},
        fps=g.VIDEO_FPS,
        min_frames=g.VIDEO_MIN_FRAMES,
        max_frames=g.VIDEO_MAX_FRAMES,
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )


IMAGE_SIZES = [  # (height, width)
    (1, 1),
    (3, 7),
    (31, 33),
    (48, 80),
    (80, 48),
    (224, 224),
    (257, 255),
    (480, 640),
    (720, 1280),
    (1080, 1920),
    (1440, 2560),
    (2048, 2048),
    (4000, 3000),
    (10, 2000),
    (2000, 10),
    (16, 3200),
    (5, 999),
    (1, 150),
    (4096, 6144),
    (333, 7777),
]


@pytest.mark.parametrize(("h", "w"), IMAGE_SIZES)
def test_image_processor_grid_matches(image_processor, h: int, w: int) -> None:
    import torch

    out = image_processor(
        torch.zeros(3, h, w, dtype=torch.uint8), input_data_format="channels_first", return_tensors="pt"
    )
    geo = g.image_geometry(w, h)
    assert out["image_grid_thw"].tolist() == [[1, geo.grid_h, geo.grid_w]]
    assert out["pixel_values"].shape[0] == geo.patches


@pytest.mark.parametrize(
    ("h", "w", "min_pixels", "max_pixels"),
    [(1080, 1920, 65536, 1024 * 256), (4000, 3000, 65536, 4096 * 256), (100, 100, 200_000, 16777216)],
)
def test_image_processor_custom_budget(h: int, w: int, min_pixels: int, max_pixels: int) -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    proc = transformers.Qwen2VLImageProcessor(
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    out = proc(torch.zeros(3, h, w, dtype=torch.uint8), input_data_format="channels_first", return_tensors="pt")
    geo = g.image_geometry(w, h, min_pixels=min_pixels, max_pixels=max_pixels)
    assert out["image_grid_thw"].tolist() == [[1, geo.grid_h, geo.grid_w]]


VIDEO_CASES = [  # (total_frames, fps, height, width)
    (30, 10.0, 48, 64),
    (7, 2.0, 48, 64),
    (3, None, 48, 64),
    (5, 2.0, 8, 8),
    (9, 2.0, 16, 3200),
    (2, 30.0, 96, 96),
    (61, 30.0, 90, 160),
    (16, 2.0, 720, 1280),
]


@pytest.mark.parametrize(("total", "vfps", "h", "w"), VIDEO_CASES)
def test_video_processor_grid_matches(video_processor, total: int, vfps: float | None, h: int, w: int) -> None:
    import numpy as np

    video = np.zeros((total, h, w, 3), dtype=np.uint8)
    out = video_processor(
        videos=[video],
        video_metadata=[{"total_num_frames": total, "fps": vfps}],
        do_sample_frames=True,
        return_metadata=True,
        return_tensors="pt",
    )
    geo = g.video_geometry(w, h, total, vfps)
    assert out["video_grid_thw"].tolist() == [[geo.temporal_patches, geo.grid_h, geo.grid_w]]
    assert len(out["video_metadata"][0].frames_indices) == geo.sampled_frames
    assert out["pixel_values_videos"].shape[0] == geo.vit_calls * geo.patches


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(total=st.integers(1, 200_000), vfps=st.one_of(st.none(), st.floats(0.5, 240.0)))
def test_sample_frames_matches_transformers(video_processor, total: int, vfps: float | None) -> None:
    from transformers.video_utils import VideoMetadata

    indices = video_processor.sample_frames(VideoMetadata(total_num_frames=total, fps=vfps))
    assert len(indices) == g.sample_frame_count(total, vfps)
