"""`qvl serve` claims only what vLLM will do (QA re-audit of issue 29).

- N2: a video processor class qvl's per-frame cap does not patch (``vision.frame_cap.FAMILIES``) is refused before
  vLLM starts, as `qvl infer` refuses it; `qvl load-check` warns about it. No video processor file at all resolves to
  transformers' fallback (Qwen2VLVideoProcessor from the image processor, or the model type's Qwen3VLVideoProcessor).
- N4: the multimodal limits are worked out in the --max-model-len serve passes (the compiled max_seq_len: a pool that
  cannot hold it is refused, tests/test_serve_pool.py), and `qvl tune` prints the same builder's line; bench-serve's
  images fit that length too.
- N5b: an IPv6 host is shown as ``[::]:8000``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import rbln_config_json, run_main, write_artifact

OTHER = "LlavaOnevisionVideoProcessor"
VIDEO = {"size": {"shortest_edge": 4096, "longest_edge": 25165824}, "patch_size": 16, "merge_size": 2}


@pytest.fixture
def no_exec(monkeypatch):
    monkeypatch.setattr("os.execvpe", lambda *a, **k: pytest.fail("exec attempted"))


def artifact(path: Path, preset: str = "rebel100-1npu", kv_blocks: int | None = None) -> Path:
    plan = build_plan(preset)
    return write_artifact(path, plan, cfg=rbln_config_json(plan, kv_blocks=kv_blocks))


def serve(capsys, *args: str) -> tuple[int, str, str]:
    return run_main(["serve", *args, "--dry-run"], capsys)


# ------------------------------------------------------------------------------------------ N2: video class


@pytest.mark.parametrize(
    ("name", "data", "shown"),
    [
        ("video_preprocessor_config.json", {**VIDEO, "video_processor_type": OTHER}, f"video_processor_type='{OTHER}'"),
        (
            "processor_config.json",
            {"video_processor": {**VIDEO, "video_processor_type": OTHER}},
            f"video_processor.video_processor_type='{OTHER}'",
        ),
        # no video processor config: transformers infers the class from the image processor's
        (
            "preprocessor_config.json",
            {"image_processor_type": "LlavaOnevisionImageProcessor"},
            "image_processor_type='LlavaOnevisionImageProcessor' loads the video processor ",
        ),
    ],
)
def test_serve_refuses_a_video_processor_class_the_frame_cap_does_not_patch(
    name, data, shown, tmp_path, capsys, no_exec
):
    root = artifact(tmp_path / "art")
    (root / name).write_text(json.dumps(data))
    code, out, err = serve(capsys, str(root))
    assert code == 2 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert len(err.strip().splitlines()) == 1, err
    assert line.startswith(f"qvl: error: {root / name}: {shown}"), line
    assert OTHER in line, line
    assert "Qwen3VLVideoProcessor and Qwen2VLVideoProcessor" in line and "nothing was started" in line
    assert '"video_processor_type": "Qwen3VLVideoProcessor"' in line and "recompile" in line
    assert "video cap" not in out and "caps every video frame" not in out + err


def test_no_video_processor_file_resolves_to_transformers_fallback_which_is_capped(tmp_path, capsys, no_exec):
    root = artifact(tmp_path / "art")  # processor_config.json is {}: no video section anywhere
    code, out, err = serve(capsys, str(root), "--json")
    assert code == 0, err
    (check,) = [c for c in json.loads(out)["checks"] if c["check"] == "video processor"]
    assert check["ok"] and "Qwen3VLVideoProcessor (the model type's default)" in check["detail"]
    # an older checkpoint: only preprocessor_config.json, whose Qwen2VLImageProcessor gives Qwen2VLVideoProcessor
    (root / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "Qwen2VLImageProcessor"}))
    code, out, err = serve(capsys, str(root), "--json")
    assert code == 0, err
    (check,) = [c for c in json.loads(out)["checks"] if c["check"] == "video processor"]
    assert "Qwen2VLVideoProcessor (preprocessor_config.json image_processor_type)" in check["detail"], check


def test_video_processor_class_follows_transformers_order_and_frame_caps_list(tmp_path, monkeypatch):
    from qwenvl_rbln.jobs.processor_fix import video_processor_class

    root = artifact(tmp_path / "art")
    (root / "video_preprocessor_config.json").write_text(json.dumps({"video_processor_type": OTHER}))
    assert video_processor_class(root)["cls"] == OTHER and not video_processor_class(root)["supported"]
    # processor_config.json's nested video_processor wins over video_preprocessor_config.json
    section = {"video_processor": {"video_processor_type": "Qwen2VLVideoProcessor"}}
    (root / "processor_config.json").write_text(json.dumps(section))
    assert video_processor_class(root) == {
        "cls": "Qwen2VLVideoProcessor",
        "file": "processor_config.json",
        "section": "video_processor",
        "key": "video_processor_type",
        "value": "Qwen2VLVideoProcessor",
        "supported": True,
    }
    # one source: what counts as supported is frame_cap.FAMILIES, nothing copied
    (root / "processor_config.json").write_text("{}")
    monkeypatch.setitem(__import__("qwenvl_rbln.vision.frame_cap").vision.frame_cap.FAMILIES, OTHER, "clip")
    assert video_processor_class(root)["supported"]


def test_load_check_warns_about_a_video_processor_class_qvl_cannot_cap(tmp_path, capsys):
    root = artifact(tmp_path / "art")
    (root / "video_preprocessor_config.json").write_text(json.dumps({"video_processor_type": OTHER}))
    code, out, err = run_main(["load-check", str(root), "--no-runtime", "--json"], capsys)
    assert code == 0, err
    processor = json.loads(out)["processor"]
    (warning,) = [w for w in processor["warnings"] if OTHER in w]
    assert str(root / "video_preprocessor_config.json") in warning and "video_processor_type=" in warning
    assert '"video_processor_type": "Qwen3VLVideoProcessor"' in warning
    assert processor["fix_line"] and "Qwen3VLVideoProcessor" in processor["fix_line"]
    code, _, err = run_main(["load-check", str(root), "--no-runtime", "--strict"], capsys)
    assert code == 2 and OTHER in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------ N4: limits


def limits_of(argv: list[str]) -> dict[str, int]:
    return json.loads(argv[argv.index("--limit-mm-per-prompt") + 1])


def test_serve_limits_are_worked_out_in_the_max_model_len_serve_passes(tmp_path, capsys, no_exec):
    from qwenvl_rbln.vision import context

    root = artifact(tmp_path / "art", "rebel100-1npu-batch4")  # max_seq_len 32768, a full KV pool
    code, out, err = serve(capsys, str(root), "--json")
    assert code == 0, err
    data = json.loads(out)
    held = int(data["argv"][data["argv"].index("--max-model-len") + 1])
    assert held == 32768
    limits = limits_of(data["argv"])
    image = context.image_tokens(16384 // 4)
    assert limits["image"] == 7 and limits["image"] * image <= held - context.RESERVE_TOKENS < 8 * image
    assert limits["video"] == 1  # an 18,816-token video fits 32768 once
    (check,) = [c for c in data["checks"] if c["check"] == "limit_mm_per_prompt"]
    assert check["ok"] and "max_seq_len 32768" in check["detail"]


def test_tune_prints_the_same_limits():
    from qwenvl_rbln.serving.command import placement, plan_artifact, vllm_launch

    art = plan_artifact(build_plan("rebel100-1npu-batch4"), "/tmp/not-written")
    argv = vllm_launch(art, None, placement(art, None, None, None)).argv
    assert argv[argv.index("--max-model-len") + 1] == "32768"
    assert limits_of(argv) == {"image": 7, "video": 1}


def test_bench_serve_images_fit_the_max_model_len(tmp_path, capsys, no_exec):
    root = artifact(tmp_path / "art", "rebel100-1npu-batch4")
    # 4098 image tokens + 28700 text + 64 do not fit max_seq_len 32768
    code, _, err = run_main(
        ["bench-serve", str(root), "--input-len", "28000", "--output-len", "700", "--dry-run"], capsys
    )
    assert code == 2 and "Traceback" not in err
    assert "do not fit max_seq_len 32768" in err


# ------------------------------------------------------------------------------------------ N5b: IPv6


def test_an_ipv6_host_is_shown_in_brackets(tmp_path, capsys, monkeypatch, no_exec):
    from qwenvl_rbln.serving.options import host_port

    assert host_port("::", 8000) == "[::]:8000" and host_port("[::1]", 80) == "[::1]:80"
    assert host_port("0.0.0.0", 8000) == "0.0.0.0:8000" and host_port("box.local", 1) == "box.local:1"
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    root = artifact(tmp_path / "art")
    code, out, err = serve(capsys, str(root), "--host", "::", "--no-auth", "--json")
    assert code == 0, err
    (auth,) = [c for c in json.loads(out)["checks"] if c["check"] == "auth"]
    assert "[::]:8000" in auth["detail"] and ":::8000" not in auth["detail"] + err
    code, out, err = serve(capsys, str(root), "--host", "::1", "--json")
    (auth,) = [c for c in json.loads(out)["checks"] if c["check"] == "auth"]
    assert code == 0 and "[::1]:8000 listens on loopback" in auth["detail"]
