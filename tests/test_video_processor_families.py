"""Every video processor a Qwen3-VL checkpoint can bring: capped per frame, predicted by qvl's geometry, or refused.

A checkpoint without a video processor config (no ``video_preprocessor_config.json``, no ``video_processor``
section in ``processor_config.json``) gets transformers' fallback ``Qwen2VLVideoProcessor``, inferred from the
image processor's class; its ``resize`` has no ``temporal_factor`` and budgets each frame alone. ``qvl infer`` runs
it with qvl's Qwen3-VL video processor (``inference/inputs.py``), on both backends; the vLLM plugin's class patch
caps both families (``vision/frame_cap.py``); any other class is refused before a model loads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("av")

from qwenvl_rbln.vision import frame_cap, geometry  # noqa: E402
from tests.fake_media import write_sweep_video  # noqa: E402
from tests.fakes_rbln import refused_infer, run_main  # noqa: E402


def without_video_processor(src: Path, dst: Path, video_processor_type: str | None = None) -> Path:
    """``src`` (a Qwen3-VL directory) copied with no video processor config: the image section also written as a
    legacy ``preprocessor_config.json``, as older checkpoints have. ``video_processor_type``: instead, a video
    section naming that class."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "processor_config.json").read_text())
    video = config.pop("video_processor")
    (dst / "video_preprocessor_config.json").unlink(missing_ok=True)
    if video_processor_type:
        config["video_processor"] = {**video, "video_processor_type": video_processor_type}
    else:
        (dst / "preprocessor_config.json").write_text(json.dumps(config["image_processor"]))
    (dst / "processor_config.json").write_text(json.dumps(config))
    return dst


@pytest.fixture(scope="module")
def novp(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoProcessor

    path = without_video_processor(tiny_model, tmp_path_factory.mktemp("novp") / "tiny-no-video-config")
    vp = AutoProcessor.from_pretrained(str(path), local_files_only=True).video_processor
    assert type(vp).__name__ == "Qwen2VLVideoProcessor", "the fallback this file is about"
    return path


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sweep_video(tmp_path_factory.mktemp("clip") / "clip.mp4")  # 64x64, 5 sampled frames


def _vision_and_tokens(capsys: Any, *args: str) -> tuple[list[dict], int]:
    code, out, err = run_main(["infer", *args, "--max-new-tokens", "2", "--json"], capsys)
    assert code == 0, err
    (request,) = json.loads(out)["requests"]
    return request["vision"], request["prefill"]["tokens"]


def test_reference_infer_runs_a_video_on_a_checkpoint_without_video_processor_config(tiny_model, novp, clip, capsys):
    """Was: TypeError: resize_capped() missing 1 required positional argument: 'temporal_factor'. Now the same
    geometry and prompt as the checkpoint that ships its Qwen3-VL video processor."""
    args = ("--video", str(clip), "--prompt", "What happens?")
    got = _vision_and_tokens(capsys, str(novp), *args)
    want = _vision_and_tokens(capsys, str(tiny_model), *args)
    assert got == want
    assert got[0][0]["patches"] == 16 and got[0][0]["calls"] == 3  # 64x64 kept (the fallback would upscale it)


def test_emulated_infer_runs_a_video_on_an_artifact_without_video_processor_config(
    tiny_rbln, novp, clip, emulated, capsys, patched_classes
):
    """The compiled artifact saves the fallback as a ``Qwen2VLVideoProcessor`` section carrying qvl's caps: `qvl
    infer --emulate` runs it like the artifact of the full checkpoint, and the plugin's class patch caps it per
    frame at its ``qvl_max_frame_pixels`` (vLLM's load of the same directory)."""
    from transformers import AutoProcessor

    from tests.emulated_rbln import compile_emulated

    art = compile_emulated(novp.parent / "art", model=str(novp))
    section = json.loads((art / "processor_config.json").read_text())["video_processor"]
    assert section["video_processor_type"] == "Qwen2VLVideoProcessor" and section["qvl_max_frame_pixels"] == 4096 * 256
    args = ("--emulate", "--video", str(clip), "--prompt", "What happens?")
    assert _vision_and_tokens(capsys, str(art), *args) == _vision_and_tokens(capsys, str(tiny_rbln), *args)
    vp = AutoProcessor.from_pretrained(str(art), local_files_only=True).video_processor
    assert isinstance(vp, patched_classes[0]) and _patches(vp, 4, 3840, 2160) <= 4096


def test_the_loaded_processor_does_what_the_geometry_predicts(novp, tmp_path):
    """A tall short clip under the tiny preset's caps (per-frame cap 4096 patches): the processor's grid is
    ``video_geometry_for``'s, frame by frame capped; the fallback's per-frame image budget would differ."""
    import numpy as np

    from qwenvl_rbln.inference.inputs import load_processor
    from qwenvl_rbln.planning.plan import build_plan

    caps = build_plan("cpu-tiny").processor
    processor = load_processor(novp, caps)
    vp = processor.video_processor
    assert type(vp).__name__ == "Qwen3VLVideoProcessor" and (vp.patch_size, vp.merge_size) == (16, 2)
    for frames, (w, h) in ((4, (1000, 3000)), (5, (640, 360)), (2, (64, 40))):
        video = np.zeros((frames, h, w, 3), dtype=np.uint8)
        grid = vp(videos=[video], do_sample_frames=False, return_tensors="pt")["video_grid_thw"][0].tolist()
        want = geometry.video_geometry(w, h, frames, 2.0, **_same_frames(caps, frames))
        assert grid == [want.temporal_patches, want.grid_h, want.grid_w], (frames, w, h)


def _same_frames(caps: Any, frames: int) -> dict[str, Any]:
    """video_geometry's arguments for exactly ``frames`` sampled frames (the test feeds pre-sampled frames)."""
    return {
        "fps": None,
        "min_frames": frames,
        "max_frames": frames,
        "min_pixels": caps.video_min_pixels,
        "max_pixels": caps.video_max_pixels,
        "max_frame_pixels": caps.video_max_frame_pixels,
    }


def test_a_video_processor_of_another_family_is_refused_before_the_model_loads(
    tiny_model, clip, tmp_path, capsys, no_model_load
):
    other = without_video_processor(tiny_model, tmp_path / "llava-video", "LlavaOnevisionVideoProcessor")
    line = refused_infer(capsys, str(other), "--video", str(clip), "--prompt", "x")
    assert "LlavaOnevisionVideoProcessor" in line and str(other) in line, line
    assert '"video_processor_type": "Qwen3VLVideoProcessor"' in line, line


# --- the class patch the vLLM plugin installs ---------------------------------------------------------------------


@pytest.fixture
def patched_classes(monkeypatch):
    """install_on_class on both classes, undone after the test (and the default cap cleared)."""
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    for klass in (Qwen2VLVideoProcessor, Qwen3VLVideoProcessor):
        monkeypatch.setattr(klass, "resize", klass.resize)
    monkeypatch.setattr(frame_cap, "_default_cap", None)
    frame_cap.install_on_class()
    return Qwen2VLVideoProcessor, Qwen3VLVideoProcessor


def _patches(vp: Any, frames: int, w: int, h: int) -> int:
    import numpy as np

    video = np.zeros((frames, h, w, 3), dtype=np.uint8)
    grid = vp(videos=[video], do_sample_frames=False, return_tensors="pt")["video_grid_thw"][0]
    return int(grid[1] * grid[2])


def test_the_class_patch_caps_the_fallback_processor_per_frame(novp, patched_classes):
    from transformers import AutoProcessor

    vp = AutoProcessor.from_pretrained(str(novp), local_files_only=True).video_processor
    assert isinstance(vp, patched_classes[0])
    assert _patches(vp, 4, 1920, 1080) > 4096  # no cap anywhere: transformers' own result
    vp.qvl_max_frame_pixels = 1024 * 256
    for frames, (w, h) in ((4, (1920, 1080)), (3, (1080, 1920)), (2, (3000, 2000))):
        got = _patches(vp, frames, w, h)
        rh, rw = geometry.smart_resize(h, w, factor=32, min_pixels=min(65536, 1024 * 256), max_pixels=1024 * 256)
        assert got == (rh // 16) * (rw // 16) <= 1024, (frames, w, h)


def test_the_default_cap_reaches_processors_without_a_smaller_one(tiny_model, novp, patched_classes):
    """QVL_MAX_FRAME_PIXELS (the plugin's set_default_cap): a processor without qvl_max_frame_pixels, or with a
    larger one, is capped at the default; a smaller own cap still holds. Both families."""
    from transformers import AutoProcessor

    frame_cap.set_default_cap(256 * 256)
    for path in (novp, tiny_model):
        vp = AutoProcessor.from_pretrained(str(path), local_files_only=True).video_processor
        assert _patches(vp, 4, 1920, 1080) <= 256
        vp.qvl_max_frame_pixels = 4096 * 256
        assert _patches(vp, 4, 1920, 1080) <= 256
        vp.qvl_max_frame_pixels = 64 * 256
        assert _patches(vp, 4, 1920, 1080) <= 64
    frame_cap.set_default_cap(None)
    assert (
        _patches(AutoProcessor.from_pretrained(str(novp), local_files_only=True).video_processor, 4, 1920, 1080) > 256
    )


def test_the_wrapper_binds_by_name_whatever_the_resize_signature():
    """A subclass that takes its arguments in another order (or only by keyword) is capped the same."""

    class Size:
        def __init__(self, shortest_edge: int, longest_edge: int) -> None:
            self.shortest_edge, self.longest_edge = shortest_edge, longest_edge

    class Videos:
        shape = (1, 4, 3, 100, 100)

    class Qwen3VLVideoProcessor:  # a stand-in of the CLIP family, by name
        qvl_max_frame_pixels = 1000

        def resize(self, videos, *, temporal_factor: int, size: Size, factor: int, resample=None) -> tuple:
            return size.shortest_edge, size.longest_edge, temporal_factor

    vp = Qwen3VLVideoProcessor()
    assert frame_cap.install_on_instance(vp, 1000)
    assert vp.resize(Videos(), temporal_factor=2, size=Size(10, 10**6), factor=32) == (10, 4000, 2)


def test_the_plugin_reads_the_default_cap_and_warns_once_on_a_bad_value(monkeypatch, capsys):
    from qwenvl_rbln.serving import vllm_plugin

    seen = []
    monkeypatch.setattr(frame_cap, "install_on_class", lambda: True)
    monkeypatch.setattr(frame_cap, "set_default_cap", seen.append)
    monkeypatch.setenv("QVL_FRAME_CAP", "1")
    monkeypatch.setenv("QVL_MAX_FRAME_PIXELS", "1048576")
    vllm_plugin.register()
    assert seen == [1048576] and capsys.readouterr().err == ""
    for bad in ("lots", "-5", "0", "1.5e6"):
        monkeypatch.setenv("QVL_MAX_FRAME_PIXELS", bad)
        vllm_plugin.register()  # never raises
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("qvl: warning: QVL_MAX_FRAME_PIXELS=") and bad in err[0], err
    assert seen == [1048576, None, None, None, None]
