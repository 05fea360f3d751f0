"""No input overflows a compiled shape: one oversize policy for bucket-plan, infer and serve; videos capped per
frame; the artifact's processor files carry the plan's caps; the context checked like a bucket; padding rows free.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from qwenvl_rbln.artifacts.manifest import write_manifest
from qwenvl_rbln.jobs.bucket_plan_job import run_bucket_plan
from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.vision import frame_cap, geometry
from tests.fake_media import write_noise_video
from tests.fakes_rbln import run_main, write_artifact


def _plan(preset: str, *lines: dict, **kw) -> dict:
    return run_bucket_plan(
        preset=preset,
        sets=kw.pop("sets", None),
        model=None,
        inputs=None,
        sizes=None,
        workload=kw.pop("workload"),
        optimize=None,
        max_bucket=None,
        batch_trace=None,
        optimize_decoder=None,
        **kw,
    )[0]


def _workload(tmp_path: Path, *lines: dict) -> Path:
    p = tmp_path / "w.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


# --- the per-frame cap -------------------------------------------------------------------------------------------


def test_video_budget_keeps_every_frame_under_the_cap_and_leaves_long_videos_alone():
    cap = 16384 * 256
    assert frame_cap.video_budget(4, 4096, 25165824, cap) == (4096, cap * 4)
    assert frame_cap.video_budget(5, 4096, 25165824, cap) == (4096, cap * 4)  # t_bar = round(5/2)*2 = 4
    assert frame_cap.video_budget(3, 4096, 25165824, cap) == (4096, cap * 3)  # t_bar = 4 > T = 3
    assert frame_cap.video_budget(600, 4096, 25165824, cap) == (4096, 25165824)  # a long video: unchanged
    assert frame_cap.video_budget(4, 4096, 25165824, None) == (4096, 25165824)


def test_the_short_4k_clip_fits_the_vit_buckets_preset_and_a_5_minute_video_is_unchanged():
    caps = build_plan("rebel100-1npu-vit-buckets").processor
    assert caps.video_max_frame_pixels == 16384 * 256 and caps.video_max_pixels == 25165824
    clip = geometry.video_geometry_for(3840, 2160, 4, 2.0, caps)
    assert clip.patches <= 16384 and clip.vit_calls == 2
    stock = geometry.video_geometry(3840, 2160, 4, 2.0)  # the checkpoint's processor: 24,128 patches
    assert stock.patches == 24128
    five_min = geometry.video_geometry_for(1920, 1080, 300 * 30, 30.0, caps)
    assert five_min == geometry.video_geometry(1920, 1080, 300 * 30, 30.0)  # per-frame pixels not cut


def test_transformers_video_processor_applies_the_cap_as_qvl_predicts(tiny_model):
    """The real Qwen3VLVideoProcessor of the tiny model, with the cap installed as infer installs it."""
    import numpy as np

    from qwenvl_rbln.inference.inputs import apply_caps, load_processor

    caps = build_plan("cpu-tiny").processor  # largest bucket 4096: 1,048,576 px per frame
    processor = load_processor(Path(tiny_model), caps)
    video = np.zeros((4, 1080, 1920, 3), dtype=np.uint8)
    out = processor.video_processor(videos=[video], do_sample_frames=False, return_tensors="pt")
    t, h, w = (int(x) for x in out["video_grid_thw"][0])
    predicted = geometry.video_geometry(1920, 1080, 4, None, fps=None, max_frame_pixels=caps.video_max_frame_pixels)
    assert (t, h, w) == (predicted.temporal_patches, predicted.grid_h, predicted.grid_w) and h * w <= 4096
    off = type(caps)(**{**caps.to_dict(), "video_max_frame_pixels": None})
    apply_caps(processor, off)  # the same processor without the cap: the checkpoint's behaviour
    out = processor.video_processor(videos=[video], do_sample_frames=False, return_tensors="pt")
    assert int(out["video_grid_thw"][0][1] * out["video_grid_thw"][0][2]) > 4096
    apply_caps(processor, caps)


def test_vllm_max_pixels_kwarg_does_not_reach_the_video_processor(tiny_model):
    """vLLM merges the --mm-processor-kwargs of `qvl serve` into the processor's ``from_pretrained`` kwargs
    (vllm/transformers_utils/processor.py, _merge_mm_kwargs) and hands them to every processor call, the per-video
    ones included (vllm/model_executor/models/qwen3_vl.py, Qwen3VLMultiModalProcessor._call_hf_processor). In
    transformers 5.15.1 a load-time ``max_pixels`` sets the image processor's size only; the video processor has no
    such key and keeps the artifact's ``size``, and a call-time one changes no video grid: videos are never shrunk."""
    import numpy as np
    from transformers import AutoProcessor

    loaded = AutoProcessor.from_pretrained(str(tiny_model), local_files_only=True, max_pixels=65536)
    assert loaded.image_processor.size.longest_edge == 65536  # images: capped at load
    assert loaded.video_processor.size.longest_edge == 25165824  # videos: the file's budget, not the 65,536
    processor = AutoProcessor.from_pretrained(str(tiny_model), local_files_only=True)
    video = np.zeros((4, 480, 640, 3), dtype=np.uint8)
    text = "<|vision_start|><|video_pad|><|vision_end|>"
    kw = {"text": text, "videos": [video], "do_sample_frames": False}
    plain = processor(**kw)["video_grid_thw"].tolist()
    assert processor(**kw, max_pixels=65536)["video_grid_thw"].tolist() == plain  # videos not shrunk at call time


# --- bucket-plan: one policy, the context ------------------------------------------------------------------------


def test_bucket_plan_runs_the_4k_clip_capped_as_infer_does(tmp_path):
    wl = _workload(tmp_path, {"width": 3840, "height": 2160, "frames": 4, "fps": 2})
    data = _plan("rebel100-1npu-vit-buckets", workload=wl)
    (it,) = data["items"]
    assert it["error"] is None and it["capped"] is True and it["bucket"] == 16384 and it["patches"] <= 16384
    assert (it["resized_width"], it["resized_height"]) == (2720, 1536)
    # --on-oversize error: the per-frame cap is a plan cap (like max_pixels), so the clip still fits
    assert _plan("rebel100-1npu-vit-buckets", workload=wl, on_oversize="error")["items"][0]["error"] is None


def test_bucket_plan_under_error_lists_a_video_above_a_raised_frame_cap(tmp_path):
    wl = _workload(tmp_path, {"width": 3840, "height": 2160, "frames": 4, "fps": 2})
    sets = ["processor.video_max_frame_pixels=25165824"]
    listed = _plan("rebel100-1npu-vit-buckets", workload=wl, sets=sets, on_oversize="error")["items"][0]
    assert listed["bucket"] is None and "video_max_frame_pixels=4194304" in listed["error"]
    resized = _plan("rebel100-1npu-vit-buckets", workload=wl, sets=sets)["items"][0]
    assert resized["error"] is None and resized["oversize_capped"] and resized["patches_before_cap"] == 24128


def test_bucket_plan_refuses_what_infer_refuses_for_the_context(tmp_path, capsys):
    wl = _workload(tmp_path, {"width": 1280, "height": 720, "frames": 300, "fps": 30})
    code, out, err = run_main(["bucket-plan", "--preset", "cpu-tiny", "--workload", str(wl), "--json"], capsys)
    assert code == 2
    (it,) = json.loads(out)["items"]
    assert it["lm_tokens"] == 8800 and it["lm_fit"]["fits"] is False and it["lm_fit"]["reserve"] == 128
    # the sentence infer uses: "prompt of N tokens (M of them for its images/videos) + ... exceeds the compiled ..."
    assert "tokens (" in it["error"] and "of them for its images/videos) + a reserve of 128" in it["error"]
    assert "exceeds the compiled max_seq_len 4096" in it["error"]
    small = _workload(tmp_path, {"width": 1280, "height": 720, "frames": 40, "fps": 30})
    code, out, _ = run_main(["bucket-plan", "--preset", "cpu-tiny", "--workload", str(small), "--json"], capsys)
    assert code == 0 and json.loads(out)["items"][0]["lm_fit"]["fits"] is True


def test_infer_and_bucket_plan_share_the_length_sentence():
    from types import SimpleNamespace

    from qwenvl_rbln.inference.generation import length_error

    exc = length_error(SimpleNamespace(id="r1", source="command line"), 8894, 64, 4096, 8800)
    assert exc.message == "r1".join(["request ", ": prompt of 8894 tokens (8800 of them for its images/videos) + "]) + (
        "--max-new-tokens 64 = 8958 exceeds the compiled max_seq_len 4096"
    )


# --- the artifact carries its caps --------------------------------------------------------------------------------


def test_compile_writes_the_plans_caps_into_the_processor_files(tiny_rbln):
    from transformers import AutoProcessor

    proc = json.loads((tiny_rbln / "processor_config.json").read_text())
    assert proc["image_processor"]["size"] == {"shortest_edge": 65536, "longest_edge": 4096 * 256}
    video = proc["video_processor"]
    assert video["size"]["longest_edge"] == 25165824 and video["qvl_max_frame_pixels"] == 4096 * 256
    assert (video["fps"], video["min_frames"], video["max_frames"]) == (2.0, 4, 768)
    manifest = json.loads((tiny_rbln / "qvl-manifest.json").read_text())
    assert manifest["processor_files"]["processor_config.json:video_processor"]["qvl_max_frame_pixels"] == 1048576
    assert manifest["processor"]["video_max_frame_pixels"] == 1048576
    loaded = AutoProcessor.from_pretrained(str(tiny_rbln), local_files_only=True)  # any loader gets what fits
    assert loaded.image_processor.size.longest_edge == 1048576
    assert loaded.video_processor.qvl_max_frame_pixels == 1048576


def test_load_check_names_the_file_and_key_that_disagree(tiny_rbln, emulated, tmp_path, capsys):
    copy = tmp_path / "edited"
    shutil.copytree(tiny_rbln, copy)
    path = copy / "processor_config.json"
    data = json.loads(path.read_text())
    data["image_processor"]["size"]["longest_edge"] = 16777216
    path.write_text(json.dumps(data))
    code, out, err = run_main(["load-check", str(copy), "--emulate", "--no-runtime", "--json"], capsys)
    assert code == 2 and json.loads(out)["layout"]["modified"] == ["processor_config.json"]  # edited after compile
    warnings = json.loads(out)["processor"]["warnings"]
    assert any(p.startswith("processor_config.json image_processor.size.longest_edge=16777216") for p in warnings)


def test_serve_preflight_names_the_file_and_key_that_disagree(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("os.execvpe", lambda *a, **k: pytest.fail("exec attempted"))
    plan = build_plan("rebel100-1npu")
    root = write_artifact(tmp_path / "art", plan)
    video = {"video_processor_type": "Qwen3VLVideoProcessor", "size": {"shortest_edge": 4096, "longest_edge": 25165824}}
    (root / "video_preprocessor_config.json").write_text(json.dumps(video))
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "m"}})
    code, out, err = run_main(["serve", str(root), "--dry-run", "--json"], capsys)
    assert code == 0, err  # served, each frame capped through the plugin (tests/test_serve_processor.py)
    (video_cap,) = [c["detail"] for c in json.loads(out)["checks"] if c["check"] == "video cap"]
    assert "video_preprocessor_config.json qvl_max_frame_pixels=None" in video_cap and "16384" in video_cap
    video["qvl_max_frame_pixels"] = 16384 * 256
    (root / "video_preprocessor_config.json").write_text(json.dumps(video))
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "m"}})
    code, out, err = run_main(["serve", str(root), "--dry-run", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["env"]["QVL_FRAME_CAP"] == "1" and "QVL_MAX_FRAME_PIXELS" not in data["env"]
    (policy,) = [c["detail"] for c in data["checks"] if c["check"] == "oversize"]
    assert policy.startswith("runtime.on_oversize=resize: ") and "qvl_max_frame_pixels" in policy


def test_serve_names_a_modality_the_context_turns_off(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("os.execvpe", lambda *a, **k: pytest.fail("exec attempted"))
    plan = build_plan("rebel100-1npu", ["max_seq_len=16384"])
    root = write_artifact(tmp_path / "art", plan)
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "m"}})
    code, out, err = run_main(["serve", str(root), "--dry-run"], capsys)
    assert code == 0, err
    assert "# warn limit_mm_per_prompt" in out and "# ok   limit_mm_per_prompt" not in out
    (line,) = [line for line in out.splitlines() if line.startswith("# warn limit_mm_per_prompt")]
    assert "limit_mm_per_prompt video is 0" in line and "max_seq_len 16384" in line
    assert "limit_mm_per_prompt video is 0" not in err  # said once, in the # warn line (audit 2026-12-04 L10)


def test_the_plugin_installs_the_frame_cap_only_under_qvl_serve(monkeypatch):
    from qwenvl_rbln.serving import vllm_plugin

    calls = []
    monkeypatch.setattr(frame_cap, "install_on_class", lambda: calls.append(1) or True)
    monkeypatch.delenv("QVL_FRAME_CAP", raising=False)
    monkeypatch.delenv("QVL_VIT_PACKING", raising=False)
    vllm_plugin.register()
    assert calls == []
    monkeypatch.setenv("QVL_FRAME_CAP", "1")
    vllm_plugin.register()
    assert calls == [1]


def test_install_on_class_caps_processors_whose_config_has_the_key(tiny_model, monkeypatch):
    import numpy as np
    from transformers import AutoProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    monkeypatch.setattr(Qwen3VLVideoProcessor, "resize", Qwen3VLVideoProcessor.resize)  # undone after the test
    assert frame_cap.install_on_class() is True and frame_cap.install_on_class() is False
    vp = AutoProcessor.from_pretrained(str(tiny_model), local_files_only=True).video_processor
    video = np.zeros((4, 1080, 1920, 3), dtype=np.uint8)
    grid = vp(videos=[video], do_sample_frames=False, return_tensors="pt")["video_grid_thw"][0]
    assert int(grid[1] * grid[2]) > 4096  # no key in its config: unchanged
    vp.qvl_max_frame_pixels = 4096 * 256
    grid = vp(videos=[video], do_sample_frames=False, return_tensors="pt")["video_grid_thw"][0]
    assert int(grid[1] * grid[2]) <= 4096


# --- padding rows are free (emulated: optimum-rbln's real generate on qvl's CPU emulator) -------------------------


@pytest.fixture(scope="module")
def hd_clip(tmp_path_factory) -> Path:
    """2 s of 1920x1080 at 2 fps: 4 sampled frames of 2 M px, twice the tiny artifact's 1 M px per frame."""
    pytest.importorskip("av")
    return write_noise_video(tmp_path_factory.mktemp("clip") / "hd.mp4", 1920, 1080, frames=4, fps=2)


def test_padding_rows_carry_text_only_and_the_real_rows_tokens_are_unchanged(tiny_rbln, emulated, hd_clip, monkeypatch):
    from qwenvl_rbln.inference import generation
    from qwenvl_rbln.inference.runner import InferOptions, run_infer

    opts = {"directory": tiny_rbln, "max_new_tokens": 5, "videos": [str(hd_clip)], "prompt": "What happens?"}
    runs = {}
    for packing in (False, True):
        data = run_infer(InferOptions(**opts, vit_packing=packing))
        (batch,) = data["batches"]
        assert batch["padded_rows"] == 1  # batch_size 2, one real row
        runs[packing] = data
    unpacked, packed = runs[False]["batches"][0], runs[True]["batches"][0]
    (item,) = runs[False]["requests"][0]["vision"]
    assert item["capped"] and item["patches"] <= 4096 and item["calls"] == 2  # per-frame cap: fits bucket 4096
    from qwenvl_rbln.vision.bucket_plan.items import ItemPlanner

    planned = ItemPlanner(build_plan("cpu-tiny-rbln")).workload_entry((1920, 1080, 4, 2.0), 1)
    assert (planned["patches"], planned["vit_calls"], planned["capped"]) == (item["patches"], 2, True)  # one policy
    assert unpacked["timings"]["vision_calls"] == 2  # the real row's 2 temporal patches, nothing for padding
    assert packed["timings"]["vision_calls"] == packed["vit"]["graph_calls"] <= 2
    # the old padding (a copy of the real request) ran the real row's video twice; its tokens are the same
    monkeypatch.setattr(generation, "padding_row", lambda requests: requests[0])
    old = run_infer(InferOptions(**opts, vit_packing=False))
    assert old["batches"][0]["timings"]["vision_calls"] == 4
    assert old["requests"][0]["token_ids"] == runs[False]["requests"][0]["token_ids"]
    assert runs[True]["requests"][0]["token_ids"] == runs[False]["requests"][0]["token_ids"]


def test_a_compile_with_other_caps_rewrites_the_files_and_their_hashes(tiny_rbln, emulated, tmp_path, capsys):
    """The caps are not part of the compiled graphs: a second compile with another max_pixels may reuse the cache,
    and still writes its own caps into the files, with the manifest's hashes matching them."""
    from tests.emulated_rbln import compile_emulated

    out = compile_emulated(tmp_path / "small-caps", ["processor.max_pixels=262144"])
    proc = json.loads((out / "processor_config.json").read_text())
    assert proc["image_processor"]["size"]["longest_edge"] == 262144
    code, data, _ = run_main(["load-check", str(out), "--emulate", "--no-runtime", "--json"], capsys)
    report = json.loads(data)
    assert code == 0 and report["layout"]["ok"] and not report["layout"]["modified"], report["layout"]


# --- the oversize fix offers no bucket the memory planner says cannot load (D13) ---------------------------------

BIG_8B = ["processor.max_pixels=16777216"]  # 8000x8000 -> 4096x4096, 65,536 patches: a 402 GiB visual workspace


def test_bucket_plan_puts_the_cap_first_when_the_added_bucket_does_not_fit(tmp_path):
    wl = _workload(tmp_path, {"width": 8000, "height": 8000})
    (item,) = _plan("rebel100-8b", workload=wl, sets=BIG_8B, on_oversize="error")["items"]
    fix = item["error"].split("; fix: ", 1)[1]
    assert fix.startswith("cap the processor: --set processor.max_pixels=4194304")
    assert "add a bucket" not in fix
    assert (
        "a bucket of 65536 instead (--set visual.max_seq_len=[16384,65536]) costs memory the plan does not have" in fix
    )
    assert "memory verdict uncertain: visual workspace 402.03 GiB, device 0 454.01 GiB of 140.00 GiB usable" in fix


def test_bucket_plan_still_offers_first_an_added_bucket_that_fits(tmp_path):
    wl = _workload(tmp_path, {"width": 2400, "height": 1800})  # 16,800 patches: a bucket of 16800 fits on 8B
    (item,) = _plan("rebel100-8b", workload=wl, sets=BIG_8B, on_oversize="error")["items"]
    assert item["patches"] == 16800
    assert (
        item["error"].split("; fix: ", 1)[1].startswith("add a bucket: --set visual.max_seq_len=[16384,16800], or cap")
    )
    assert "costs memory" not in item["error"]


def test_infer_offers_the_resize_first_and_marks_a_recompile_that_cannot_load(tmp_path, capsys):
    from tests.test_bucket_plan_cli import _png_header_only

    plan = build_plan("rebel100-8b")
    root = write_artifact(tmp_path / "art", plan)
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "m"}})
    big = tmp_path / "big.png"
    big.write_bytes(_png_header_only(8000, 8000))
    argv = ["infer", str(root), "--image", str(big), "--prompt", "x", "--set", BIG_8B[0], "--on-oversize", "error"]
    code, out, err = run_main(argv, capsys)
    assert code == 2 and out == ""
    fix = err.strip().splitlines()[-1].split("; fix: ", 1)[1]
    assert fix.startswith("run it resized to the largest bucket 16384: --on-oversize resize (the default)")
    assert "recompile with a bucket that fits" not in fix
    assert "a bucket of 65536 instead (a recompile: `qvl compile --preset " in fix
    assert "visual.max_seq_len=[16384,65536]" in fix and "costs memory the plan does not have (memory verdict" in fix
