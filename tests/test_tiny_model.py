"""The tiny Qwen3-VL builds offline, loads with the Auto classes, generates on image and video
prompts on CPU, and is byte-for-byte reproducible from its seed."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may touch the hub

pytest.importorskip("torch")
pytest.importorskip("transformers")

from qwenvl_rbln.backends.tiny import model as tm  # noqa: E402
from qwenvl_rbln.backends.tiny.tokenizer import VOCAB_SIZE  # noqa: E402
from qwenvl_rbln.errors import InputError  # noqa: E402

FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    tm.MARKER_FILE,
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tm.create_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen3-vl", seed=0)


@pytest.fixture(scope="module")
def loaded(tiny_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_dir).eval()
    return processor, model


@pytest.fixture(scope="module")
def video_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 frames of 64x64 at 8 fps (1 s), written with PyAV."""
    av = pytest.importorskip("av")
    import numpy as np

    path = tmp_path_factory.mktemp("video") / "tiny.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for i in range(8):
            frame = np.zeros((64, 64, 3), dtype=np.uint8)
            frame[:, : 8 * (i + 1)] = (255, 30 * i, 0)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def _image() -> Any:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 255, size=(48, 64, 3), dtype=np.uint8))


def _greedy(model: Any, inputs: Any, n: int = 5) -> Any:
    import torch

    with torch.inference_mode():
        return model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)


def test_layout_config_and_marker(tiny_dir: Path) -> None:
    assert {p.name for p in tiny_dir.iterdir()} >= FILES
    assert not [p for p in tiny_dir.parent.iterdir() if p.name.startswith(".")]  # no temp leftovers
    total = sum(p.stat().st_size for p in tiny_dir.iterdir())
    assert total < 5 * 1024 * 1024

    marker = tm.read_marker(tiny_dir)
    assert marker is not None and marker["seed"] == 0 and "meaningless" in marker["note"]
    assert tm.is_tiny_model(tiny_dir)

    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_vl"
    assert cfg["architectures"] == ["Qwen3VLForConditionalGeneration"]
    assert cfg["tie_word_embeddings"] is True
    text, vision = cfg["text_config"], cfg["vision_config"]
    assert (text["hidden_size"], text["num_hidden_layers"], text["head_dim"]) == (64, 3, 16)
    assert (text["num_attention_heads"], text["num_key_value_heads"]) == (4, 2)
    assert text["max_position_embeddings"] == 8192
    for rope in (text["rope_parameters"], text["rope_scaling"]):  # 5.x and hub/4.x spellings
        assert rope["mrope_interleaved"] is True
        assert sum(rope["mrope_section"]) == text["head_dim"] // 2
    assert text["rope_theta"] == text["rope_parameters"]["rope_theta"]
    assert vision["out_hidden_size"] == text["hidden_size"]
    assert vision["deepstack_visual_indexes"] == [0, 1, 2]
    assert (vision["patch_size"], vision["spatial_merge_size"], vision["temporal_patch_size"]) == (16, 2, 2)


def test_loads_with_auto_classes(tiny_dir: Path, loaded: tuple[Any, Any]) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    processor, model = loaded
    assert type(processor).__name__ == "Qwen3VLProcessor"
    assert type(processor.video_processor).__name__ == "Qwen3VLVideoProcessor"
    assert processor.image_processor.size["shortest_edge"] == 65536
    assert processor.image_processor.size["longest_edge"] == 16777216
    assert processor.video_processor.size["shortest_edge"] == 4096
    assert processor.video_processor.size["longest_edge"] == 25165824
    vp = processor.video_processor
    assert (vp.fps, vp.min_frames, vp.max_frames) == (2, 4, 768)
    assert isinstance(model, Qwen3VLForConditionalGeneration)
    assert model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert type(tok).__name__ == "Qwen2Tokenizer"
    assert len(tok) == model.config.text_config.vocab_size == VOCAB_SIZE
    cfg = model.config
    names = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]
    ids = dict(zip(["image", "video", "start", "end"], tok.convert_tokens_to_ids(names), strict=True))
    assert (cfg.image_token_id, cfg.video_token_id) == (ids["image"], ids["video"])
    assert (cfg.vision_start_token_id, cfg.vision_end_token_id) == (ids["start"], ids["end"])
    assert (processor.image_token_id, processor.video_token_id) == (ids["image"], ids["video"])
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    gen = model.generation_config
    assert gen.eos_token_id == tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])

    text = "Hello, wörld! 1234 <0.5 seconds> 日本"
    enc = tok(text).input_ids
    assert tok.decode(enc) == text
    assert tok("<|im_start|>user").input_ids[0] == tok.convert_tokens_to_ids("<|im_start|>")


def test_chat_template_is_qwen3_vl(loaded: tuple[Any, Any]) -> None:
    processor, _ = loaded
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe this image."}]},
    ]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe this image.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # no default system prompt (unlike Qwen2-VL)
    plain = processor.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n"


def test_generate_on_image(loaded: tuple[Any, Any], tmp_path: Path) -> None:
    processor, model = loaded
    image = _image()
    content = [{"type": "image", "image": image}, {"type": "text", "text": "Describe."}]
    messages = [{"role": "user", "content": content}]
    inputs = processor.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    # 48x64 is upscaled to >= 65536 pixels on a 32-pixel grid (ceil): 224x320 -> 14x20 patches, 70 tokens
    assert inputs["image_grid_thw"].tolist() == [[1, 14, 20]]
    assert inputs["pixel_values"].shape == (14 * 20, 3 * 2 * 16 * 16)
    n_pad = int((inputs["input_ids"] == processor.image_token_id).sum())
    assert n_pad == 14 * 20 // 4

    # an image path gives the same inputs
    image.save(tmp_path / "img.png")
    messages[0]["content"][0] = {"type": "image", "image": str(tmp_path / "img.png")}
    again = processor.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    assert again["input_ids"].tolist() == inputs["input_ids"].tolist()

    start = time.perf_counter()
    out = _greedy(model, inputs, n=5)
    assert time.perf_counter() - start < 20
    prompt_len = inputs["input_ids"].shape[1]
    assert out.shape == (1, prompt_len + 5)
    assert out[0, :prompt_len].tolist() == inputs["input_ids"][0].tolist()
    assert isinstance(processor.decode(out[0, prompt_len:], skip_special_tokens=True), str)
    assert out.tolist() == _greedy(model, inputs, n=5).tolist()  # greedy is reproducible

    # the image reaches the output (the weights are scaled so the model does not just echo tokens)
    from PIL import Image

    messages[0]["content"][0] = {"type": "image", "image": Image.new("RGB", (64, 48), (200, 30, 30))}
    flat = processor.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    assert flat["input_ids"].tolist() == inputs["input_ids"].tolist()
    assert _greedy(model, flat, n=5)[0, prompt_len:].tolist() != out[0, prompt_len:].tolist()


def test_generate_on_video(loaded: tuple[Any, Any], video_path: Path) -> None:
    # transformers 5.15 decodes video *paths* with torchcodec or torchvision.io.read_video (gone in
    # torchvision 0.29), so decode with PyAV and pass frames + metadata (needed for the timestamps).
    from transformers.video_utils import load_video

    processor, model = loaded
    frames, metadata = load_video(str(video_path), backend="pyav")
    assert frames.shape == (8, 64, 64, 3) and metadata.fps == 8
    content = [{"type": "video", "video": frames}, {"type": "text", "text": "What?"}]
    messages = [{"role": "user", "content": content}]
    inputs = processor.apply_chat_template(
        messages,
        tokenize=True,
        add_generation_prompt=True,
        return_dict=True,
        return_tensors="pt",
        processor_kwargs={"video_metadata": [metadata]},
    )
    # 1 s at fps=2 -> 2 frames, raised to min_frames=4 -> 2 temporal patches of 4x4 patches
    assert inputs["video_grid_thw"].tolist() == [[2, 4, 4]]
    assert inputs["pixel_values_videos"].shape == (2 * 4 * 4, 3 * 2 * 16 * 16)
    assert int((inputs["input_ids"] == processor.video_token_id).sum()) == 2 * 4 * 4 // 4
    prompt = processor.decode(inputs["input_ids"][0])
    assert "<0.1 seconds>" in prompt and "<0.8 seconds>" in prompt

    out = _greedy(model, inputs, n=5)
    assert out.shape == (1, inputs["input_ids"].shape[1] + 5)


def test_same_seed_same_bytes_other_seed_differs(tiny_dir: Path, tmp_path: Path) -> None:
    same = tm.create_tiny_model(tmp_path / "same", seed=0)
    for name in FILES:
        assert (same / name).read_bytes() == (tiny_dir / name).read_bytes(), name
    other = tm.create_tiny_model(tmp_path / "other", seed=1)
    assert (other / "model.safetensors").read_bytes() != (tiny_dir / "model.safetensors").read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    assert tm.read_marker(other)["seed"] == 1


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "precious.txt").write_text("keep me")
    for overwrite in (False, True):  # --force replaces a tiny model, never a directory of someone's files
        with pytest.raises(InputError) as exc:
            tm.create_tiny_model(target, overwrite=overwrite)
        assert "not a qvl tiny model" in exc.value.one_line() and "untouched" in exc.value.one_line()
        assert sorted(p.name for p in target.iterdir()) == ["precious.txt"]
        assert (target / "precious.txt").read_text() == "keep me"

    (tmp_path / "a_file").write_text("x")
    with pytest.raises(InputError):
        tm.create_tiny_model(tmp_path / "a_file")

    model = tmp_path / "model"
    tm.create_tiny_model(model, seed=1)
    with pytest.raises(InputError) as exc:
        tm.create_tiny_model(model, seed=2)
    assert exc.value.hint and "overwrite" in exc.value.hint and tm.read_marker(model)["seed"] == 1
    tm.create_tiny_model(model, seed=2, overwrite=True)
    assert tm.read_marker(model)["seed"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "model", "taken"]

    empty = tmp_path / "empty"
    empty.mkdir()
    assert tm.create_tiny_model(empty) == empty.absolute()  # an empty directory is fine


def test_ensure_tiny_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Default location from QVL_HOME; two concurrent callers build once and both get the result."""
    monkeypatch.setenv("QVL_HOME", str(tmp_path / "home"))
    target = tm.default_tiny_model_dir()
    assert target == tmp_path / "home" / "tiny-qwen3-vl"

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: tm.ensure_tiny_model(), range(2)))
    assert results == [target, target]
    assert tm.is_tiny_model(target)
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert tm.ensure_tiny_model() == target
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")
    with pytest.raises(InputError):
        tm.ensure_tiny_model(foreign)

    monkeypatch.delenv("QVL_HOME")
    assert tm.default_tiny_model_dir() == Path.home() / ".cache" / "qvl" / "tiny-qwen3-vl"


def test_cli_tiny_model(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from qwenvl_rbln.commands import tiny_model_cmd
    from qwenvl_rbln.views import render

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """Group so that `tiny-model` is a subcommand, as in qvl."""

    tiny_model_cmd.register(app)
    render.reset_consoles()
    runner = CliRunner()
    target = tmp_path / "cli-model"

    result = runner.invoke(app, ["tiny-model", str(target), "--seed", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["path"] == str(target) and data["created"] is True and data["seed"] == 2
    assert data["files"]["model.safetensors"] > 0 and "meaningless" in data["note"]

    again = json.loads(runner.invoke(app, ["tiny-model", str(target), "--seed", "2", "--json"]).stdout)
    assert again["created"] is False

    clash = runner.invoke(app, ["tiny-model", str(target), "--seed", "3"])
    assert isinstance(clash.exception, InputError)

    forced = runner.invoke(app, ["tiny-model", str(target), "--seed", "3", "--force"])
    assert forced.exit_code == 0, forced.output
    assert "wrote tiny Qwen3-VL" in forced.stdout and str(target) in forced.stdout.replace("\n", "")
    assert tm.read_marker(target)["seed"] == 3


def test_lost_race_keeps_the_winner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "raced"

    def slow_write(tmp: Path, seed: int) -> None:
        (tmp / "config.json").write_text("{}")
        target.mkdir()  # another process finished first
        (target / "winner.txt").write_text("theirs")

    monkeypatch.setattr(tm, "_write_model", slow_write)
    with pytest.raises(InputError):
        tm.create_tiny_model(target)
    assert (target / "winner.txt").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raced"]  # temp dir cleaned up


def test_unwritable_target_is_one_line_exit_2_and_leaves_nothing(tmp_path: Path) -> None:
    """A path below a regular file (ENOTDIR, which root cannot bypass) through the real CLI, for both the
    explicit directory and a QVL_HOME that the default tiny model would live in."""
    from tests.helpers_cli import run_qvl

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for args, env, needle in (
        (["tiny-model", str(blocker / "m")], {}, "cannot write the tiny model"),
        (  # QVL_HOME below a file is named as such before anything is written (issue 25)
            ["compile", "--preset", "cpu-tiny", "-o", str(tmp_path / "out")],
            {"QVL_HOME": str(blocker / "home")},
            "which is a file, not a directory",
        ),
    ):
        result = run_qvl(*args, env=env)
        assert result.exit_code == 2, result
        errors = [ln for ln in result.stderr.splitlines() if ln.startswith("qvl: ")]
        assert len(errors) == 1 and needle in errors[0] and str(blocker) in errors[0]
        assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_full_disk_while_writing_is_exit_5_and_the_temp_dir_is_gone(tmp_path: Path, monkeypatch) -> None:
    import errno

    from qwenvl_rbln.errors import BackendError

    def full(tmp: Path, seed: int) -> None:
        (tmp / "partial.bin").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "model.safetensors"))

    monkeypatch.setattr(tm, "_write_model", full)
    with pytest.raises(BackendError) as info:
        tm.create_tiny_model(tmp_path / "m")
    assert info.value.exit_code == 5 and "No space left" in info.value.one_line()
    assert list(tmp_path.iterdir()) == []


def test_safetensors_own_full_disk_error_is_exit_5(tmp_path: Path, monkeypatch) -> None:
    """safetensors raises SafetensorError (not OSError) for 'No space left on device': once an internal error."""
    from qwenvl_rbln.errors import BackendError

    class SafetensorError(Exception):
        pass

    def full(tmp: Path, seed: int) -> None:
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, message: "No space left on device" })')

    monkeypatch.setattr(tm, "_write_model", full)
    with pytest.raises(BackendError) as info:
        tm.create_tiny_model(tmp_path / "m")
    assert info.value.exit_code == 5 and "No space left on device" in info.value.one_line()
    assert list(tmp_path.iterdir()) == []
