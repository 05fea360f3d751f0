"""`qvl infer` refuses bad input up front: one `qvl: error:` line, exit 2, nothing streamed, no model loaded.

Damaged media that passes the header probe, model directories without a usable tokenizer, torch devices that
are not there, non-finite sampling flags and lengths past the compiled max_seq_len; plus Ctrl-C during a
stream ending the streamed line first.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
av = pytest.importorskip("av")

from qwenvl_rbln.errors import BackendError, InputError  # noqa: E402
from tests.fake_media import write_noise_video  # noqa: E402
from tests.fakes_rbln import refused_infer as refused  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "assets" / "demo.jpg"


@pytest.fixture(scope="module")
def tiny() -> Path:
    from qwenvl_rbln.backends.tiny.model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="module")
def artifact(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`qvl compile --preset cpu-tiny` (max_seq_len 4096)."""
    from qwenvl_rbln.jobs.compile_job import run_compile
    from qwenvl_rbln.memory.planner import estimate_plan
    from qwenvl_rbln.planning.plan import build_plan

    plan = build_plan("cpu-tiny", output_dir=str(tmp_path_factory.mktemp("art") / "cpu-tiny"))
    run_compile(plan, estimate_plan(plan), use_cache=False, heartbeat_s=0)
    return Path(plan.output_dir)


# ------------------------------------------------------------------------------------- media that lies


def _faststart_mp4_cut_in_half(path: Path) -> Path:
    """A faststart mp4 (index first) cut in half: the header still promises all 40 frames."""
    full = write_noise_video(path.with_name("full-" + path.name), 160, 120, frames=40, fps=10, movflags="faststart")
    data = full.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _png_with_damaged_idat(path: Path) -> Path:
    """A PNG whose IDAT data is zeroed in the middle, its CRC recomputed: every header and chunk check passes."""
    import numpy as np
    from PIL import Image

    Image.fromarray(np.random.default_rng(1).integers(0, 255, (200, 300, 3), dtype=np.uint8)).save(path)
    data = bytearray(path.read_bytes())
    at = data.find(b"IDAT")
    length = struct.unpack(">I", data[at - 4 : at])[0]
    start = at + 4
    data[start + length // 2 : start + length // 2 + 64] = bytes(64)
    data[start + length : start + length + 4] = struct.pack(">I", zlib.crc32(data[at : start + length]))
    path.write_bytes(bytes(data))
    return path


def test_damaged_media_that_passes_the_probe_is_refused_before_the_model_loads(
    artifact, tmp_path, capsys, no_model_load
):
    from qwenvl_rbln.vision.media import probe_image, probe_video

    video = _faststart_mp4_cut_in_half(tmp_path / "half.mp4")
    png = _png_with_damaged_idat(tmp_path / "idat.png")
    probe_video(video), probe_image(png)  # the header probe cannot see it: the pixel data is what is damaged
    line = refused(capsys, str(artifact), "--video", str(video), "--prompt", "x")
    assert f"{video}: frame " in line and "the file is cut short or damaged" in line and "ffmpeg" in line
    line = refused(capsys, str(artifact), "--image", str(png), "--prompt", "x")
    assert f"{png}: cannot decode the image" in line and "re-export" in line

    batch = tmp_path / "r.jsonl"  # earlier requests are fine: nothing of theirs is streamed first
    batch.write_text(
        json.dumps({"prompt": "one", "images": [str(DEMO)]})
        + "\n"
        + json.dumps({"prompt": "two"})
        + "\n"
        + json.dumps({"prompt": "three", "video": "half.mp4"})
        + "\n"
    )
    line = refused(capsys, str(artifact), "--batch-file", str(batch), "--json")
    assert f"{batch}:3: {video}: frame " in line
    batch.write_text(json.dumps({"prompt": "one", "images": ["idat.png"]}) + "\n")
    assert f"{batch}:1: {png}: cannot decode the image" in refused(capsys, str(artifact), "--batch-file", str(batch))


def test_media_check_decodes_each_file_once(tmp_path, monkeypatch):
    """A batch naming one image 50 times decodes it once: the check stays cheap for large batches."""
    from qwenvl_rbln.inference import inputs
    from qwenvl_rbln.inference.requests import Request
    from qwenvl_rbln.planning.plan import build_plan

    seen: list[Path] = []
    monkeypatch.setattr(inputs, "check_image", seen.append)
    reqs = [Request(id=str(n), prompt="x", images=[DEMO], source=f"r.jsonl:{n}") for n in range(50)]
    inputs.check_media(reqs, build_plan("cpu-tiny").processor)
    assert seen == [DEMO]


# --------------------------------------------------------------------------------- tokenizer and processor


def test_model_directory_without_tokenizer_files_is_refused(tiny, tmp_path, capsys, no_model_load):
    model = tmp_path / "no-tokenizer"
    shutil.copytree(tiny, model)
    for f in model.glob("tokenizer*.json"):
        f.unlink()
    line = refused(capsys, str(model), "--image", str(DEMO), "--prompt", "hi")
    assert f"{model}: no tokenizer.json or vocab.json and merges.txt" in line and "fix: copy the tokenizer" in line
    shutil.copy2(tiny / "tokenizer.json", model / "tokenizer.json")
    (model / "processor_config.json").unlink()
    line = refused(capsys, str(model), "--prompt", "hi")
    assert f"{model}: no processor_config.json or preprocessor_config.json" in line


def test_loaders_refuse_a_tokenizer_without_the_vision_tokens(tiny, tmp_path):
    """What the file check cannot see: transformers builds a one-token tokenizer when its files are gone."""
    from qwenvl_rbln.inference import inputs
    from qwenvl_rbln.planning.plan import build_plan

    model = tmp_path / "no-tokenizer"
    shutil.copytree(tiny, model)
    for f in model.glob("tokenizer*.json"):
        f.unlink()
    with pytest.raises(InputError) as e:
        inputs.load_processor(model, build_plan("cpu-tiny").processor)
    assert e.value.message.startswith(f"{model}: the tokenizer has no <|image_pad|> token (vocabulary of 1)")


def test_check_processor_needs_single_token_vision_ids_and_a_chat_template():
    from qwenvl_rbln.inference.inputs import check_processor

    class Tok:
        chat_template = None

        def __init__(self, vocab: dict[str, int]):
            self.vocab = vocab

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [self.vocab[text]] if text in self.vocab else [7, 8, 9]

        def __len__(self) -> int:
            return len(self.vocab)

    class Proc:
        image_token, image_token_id = "<|image_pad|>", 1
        video_token, video_token_id = "<|video_pad|>", 2
        chat_template = "{{ messages }}"

        def __init__(self, tok: Tok):
            self.tokenizer = tok

    good = {"<|image_pad|>": 1, "<|video_pad|>": 2}
    check_processor(Proc(Tok(good)), Path("m"))
    with pytest.raises(InputError, match=r"m: the tokenizer has no <\|video_pad\|> token \(vocabulary of 1\)"):
        check_processor(Proc(Tok({"<|image_pad|>": 1})), Path("m"))
    proc = Proc(Tok(good))
    proc.chat_template = None
    with pytest.raises(InputError, match="no chat template"):
        check_processor(proc, Path("m"))


# ------------------------------------------------------------------------------------------- flags


def test_torch_device_must_be_cpu_cuda_or_cuda_n(artifact, capsys, monkeypatch, no_model_load):
    import torch

    for bad in ("tpu", "cuda:x", "gpu0"):
        line = refused(capsys, str(artifact), "--prompt", "hi", "--torch-device", bad)
        assert f"--torch-device '{bad}' is not cpu, cuda or cuda:N" in line
    monkeypatch.setenv("QVL_TORCH_DEVICE", "tpu")
    assert "QVL_TORCH_DEVICE 'tpu' is not cpu, cuda or cuda:N" in refused(capsys, str(artifact), "--prompt", "hi")
    monkeypatch.delenv("QVL_TORCH_DEVICE")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = refused(capsys, str(artifact), "--prompt", "hi", "--torch-device", "cuda")
    assert "--torch-device cuda: no CUDA GPU is available" in line and "--torch-device cpu" in line
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    line = refused(capsys, str(artifact), "--prompt", "hi", "--torch-device", "cuda:1")
    assert "--torch-device cuda:1: this machine has 1 CUDA GPU" in line


def test_a_cuda_device_from_the_environment_says_how_to_undo_it(artifact, capsys, monkeypatch, no_model_load):
    """QVL_TORCH_DEVICE=cuda without a GPU: leaving --torch-device out changes nothing; the fix names the variable."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("QVL_TORCH_DEVICE", "cuda")
    line = refused(capsys, str(artifact), "--prompt", "hi")
    assert "QVL_TORCH_DEVICE cuda: no CUDA GPU is available" in line
    assert "fix: unset QVL_TORCH_DEVICE or set it to cpu" in line and "leave --torch-device out" not in line
    line = refused(capsys, str(artifact), "--prompt", "hi", "--torch-device", "cuda:0")
    assert "--torch-device cuda:0: no CUDA GPU" in line and "--torch-device cpu" in line
    assert "leave --torch-device out" not in line  # the variable would still ask for the GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("QVL_TORCH_DEVICE", "cuda:2")
    line = refused(capsys, str(artifact), "--prompt", "hi")
    assert "QVL_TORCH_DEVICE cuda:2: this machine has 1 CUDA GPU" in line and "set QVL_TORCH_DEVICE to an index" in line


@pytest.mark.parametrize(("flag", "value"), [("--temperature", "nan"), ("--temperature", "inf"), ("--top-p", "nan")])
def test_sampling_flags_must_be_finite(artifact, capsys, no_model_load, flag, value):
    """nan ran greedy and printed `NaN` (not JSON); inf sampled uniformly."""
    line = refused(capsys, str(artifact), "--prompt", "hi", flag, value, "--json")
    assert f"{flag} {value} is not a finite number" in line


def test_max_new_tokens_past_max_seq_len_is_refused_before_generate(artifact, capsys, monkeypatch, no_model_load):
    line = refused(capsys, str(artifact), "--prompt", "hi", "--max-new-tokens", "5000")
    assert "request 1: prompt of 12 tokens + --max-new-tokens 5000 = 5012 exceeds the compiled max_seq_len 4096" in line
    line = refused(capsys, str(artifact), "--image", str(DEMO), "--prompt", "hi", "--max-new-tokens", "3900")
    assert "prompt of 314 tokens (300 of them for its images/videos) + --max-new-tokens 3900 = 4214" in line
    assert "at most 3782" in line


def test_the_limit_refused_before_the_load_is_the_exact_one(artifact, tmp_path, capsys, monkeypatch):
    """The limit named before the model loads is the real one: following it passes the exact check after the load
    (it said 3795, counting only the image's tokens, and the check after the load then refused 3795 with 3782)."""
    from qwenvl_rbln.inference import generation, reference

    loads: list[Any] = []
    load = reference.load_reference
    monkeypatch.setattr(reference, "load_reference", lambda *a, **k: loads.append(a) or load(*a, **k))

    def reached(*a: Any, **k: Any) -> None:
        raise InputError("generate reached", "nothing")

    monkeypatch.setattr(generation, "_run_generate", reached)
    batch = tmp_path / "c3.jsonl"
    batch.write_text(json.dumps({"prompt": "a", "images": [str(DEMO)]}) + "\n")
    line = refused(capsys, str(artifact), "--batch-file", str(batch), "--max-new-tokens", "4000")
    assert line.startswith(f"qvl: error: request 1 ({batch}:1): prompt of 314 tokens (300 of them for its images")
    assert "+ --max-new-tokens 4000 = 4314 exceeds the compiled max_seq_len 4096" in line
    assert "at most 3782," in line and loads == []
    assert "at most 3782," in refused(capsys, str(artifact), "--batch-file", str(batch), "--max-new-tokens", "3783")
    assert loads == []
    line = refused(capsys, str(artifact), "--batch-file", str(batch), "--max-new-tokens", "3782")
    assert line == "qvl: error: generate reached; fix: nothing" and len(loads) == 1


def test_the_exact_length_check_names_the_batch_file_line():
    """The check after the load (the processor's own count) names `file:line` as the one before it does."""
    from qwenvl_rbln.inference.generation import GenerationOptions, check_lengths
    from qwenvl_rbln.inference.requests import Request

    reqs = [Request(id="1", prompt="a", source="c3.jsonl:1"), Request(id="2", prompt="b")]
    with pytest.raises(InputError) as e:
        check_lengths(reqs, [314, 12], GenerationOptions(3795), 4096, strict=True)
    assert e.value.message == (
        "request 1 (c3.jsonl:1): prompt of 314 tokens + --max-new-tokens 3795 = 4109 exceeds the compiled "
        "max_seq_len 4096"
    )
    assert "at most 3782," in e.value.hint
    with pytest.raises(InputError) as e:
        check_lengths(reqs[1:], [12], GenerationOptions(4090), 4096, strict=True)
    assert e.value.message.startswith("request 2: prompt of 12 tokens")  # the command line: no source
    (warning,) = check_lengths(reqs[:1], [314], GenerationOptions(3795), 4096, strict=False)
    assert warning.startswith("request 1 (c3.jsonl:1): ") and warning.endswith("(the NPU would refuse it)")
    with pytest.raises(InputError) as e:
        check_lengths(reqs[1:], [4096], GenerationOptions(1), 4096, strict=True)
    assert "the prompt alone fills it" in e.value.hint and "at most" not in e.value.hint


def test_prompt_plus_max_new_tokens_is_checked_before_generate_on_torch(artifact, capsys, monkeypatch):
    import transformers

    def boom(*a: Any, **k: Any) -> None:
        raise AssertionError("generate ran a request the compiled max_seq_len cannot hold")

    monkeypatch.setattr(transformers.Qwen3VLForConditionalGeneration, "generate", boom)
    line = refused(capsys, str(artifact), "--prompt", "hi", "--max-new-tokens", "4090")
    assert "request 1: prompt of 12 tokens + --max-new-tokens 4090 = 4102 exceeds the compiled max_seq_len" in line


# ------------------------------------------------------------------------------------------- Ctrl-C


class _InterruptedModel:
    """Streams two tokens, then fails as ``error`` (a Ctrl-C, or a backend error)."""

    generation_config = None

    def __init__(self, tokenizer: Any, error: BaseException):
        self.ids = tokenizer("Hello world").input_ids[:2]
        self.error = error

    def generate(self, streamer: Any = None, **kwargs: Any) -> Any:
        import torch

        streamer.put(torch.tensor([[1, 2, 3]]))
        for i in self.ids:
            streamer.put(torch.tensor([i]))
        raise self.error


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("device lost")])
def test_an_interrupted_stream_ends_its_line_first(tiny, error):
    """`...apqvl: interrupted` on one line: the streamed text must end its line before cli prints anything."""
    from transformers import AutoProcessor

    from qwenvl_rbln.inference.generation import GenerationOptions, generate_batch
    from qwenvl_rbln.inference.requests import Request

    processor = AutoProcessor.from_pretrained(tiny, local_files_only=True)
    model = _InterruptedModel(processor.tokenizer, error)
    sink = io.StringIO()
    expected = (KeyboardInterrupt,) if isinstance(error, KeyboardInterrupt) else (BackendError,)
    with pytest.raises(expected):
        generate_batch(model, processor, [Request(id="1", prompt="hi")], GenerationOptions(4), sink=sink)
    text = sink.getvalue()
    assert text.strip() and text.endswith("\n") and text.count("\n") == 1
