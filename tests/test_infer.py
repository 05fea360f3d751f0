"""`qvl infer` on the torch reference backend with the offline tiny Qwen3-VL.

The key property: qvl's reference tokens are exactly what transformers' own ``generate`` gives on the same
inputs built the documented way (chat template with the image path / PyAV frames + metadata), greedy, for
an image, a video and a text-only request. Everything runs in-process through ``cli.main`` (exit codes and
the one-line errors included); one compiled tiny artifact and one loaded model serve the whole module.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
av = pytest.importorskip("av")

from qwenvl_rbln.errors import InputError  # noqa: E402
from qwenvl_rbln.inference import requests as rq  # noqa: E402
from tests.fake_media import write_sweep_video  # noqa: E402
from tests.fakes_rbln import refused_infer as refused  # noqa: E402
from tests.fakes_rbln import run_main  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "assets" / "demo.jpg"
N = 10  # new tokens per request


# ----------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny() -> Path:
    from qwenvl_rbln.backends.tiny.model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("media")
    video = write_sweep_video(d / "clip.mp4")  # 2.5 s -> 5 sampled frames -> 3 temporal patches
    corrupt = d / "cut.jpg"
    corrupt.write_bytes(DEMO.read_bytes()[:2000])  # header fine, data cut short
    return {"image": DEMO, "video": video, "corrupt": corrupt, "dir": d}


@pytest.fixture(scope="module")
def artifact(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`qvl compile --preset cpu-tiny` (batch_size 2, decoder graphs [2, 1], buckets 256/1024/4096)."""
    from qwenvl_rbln.jobs.compile_job import run_compile
    from qwenvl_rbln.memory.planner import estimate_plan
    from qwenvl_rbln.planning.plan import build_plan

    out = tmp_path_factory.mktemp("art") / "cpu-tiny"
    plan = build_plan("cpu-tiny", output_dir=str(out))
    run_compile(plan, estimate_plan(plan), use_cache=False, heartbeat_s=0)
    return out


@pytest.fixture(scope="module")
def direct(tiny: Path) -> tuple[Any, Any]:
    """transformers itself: a fresh processor and model loaded straight from the tiny model directory."""
    from transformers import AutoProcessor, Qwen3VLForConditionalGeneration

    return AutoProcessor.from_pretrained(tiny), Qwen3VLForConditionalGeneration.from_pretrained(tiny).eval()


def infer(capsys: Any, *args: str) -> tuple[int, dict[str, Any] | None, str, str]:
    code, out, err = run_main(["infer", *args, "--json"], capsys)
    return code, (json.loads(out) if code == 0 else None), out, err


REQUESTS = {
    "image": lambda m: (
        ["--image", str(m["image"]), "--prompt", "Describe this image."],
        [m["image"]],
        [],
        "Describe this image.",
    ),
    "video": lambda m: (["--video", str(m["video"]), "--prompt", "What happens?"], [], [m["video"]], "What happens?"),
    "text": lambda m: (
        ["--prompt", "Say hello to the user.", "--system", "Be brief."],
        [],
        [],
        "Say hello to the user.",
    ),
}


def transformers_generate(
    direct: tuple[Any, Any], images: list[Path], videos: list[Path], prompt: str, system: str | None = None
) -> tuple[list[int], Any]:
    """Greedy tokens from transformers' own generate on inputs built as its docs/the tiny-model README do."""
    import torch
    from transformers.video_utils import load_video

    processor, model = direct
    content: list[dict[str, Any]] = [{"type": "image", "image": str(p)} for p in images]
    metas = []
    for v in videos:
        frames, meta = load_video(str(v), backend="pyav")
        content.append({"type": "video", "video": frames})
        metas.append(meta)
    content.append({"type": "text", "text": prompt})
    messages = [{"role": "user", "content": content}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    kwargs = {"processor_kwargs": {"video_metadata": metas}} if metas else {}
    inputs = processor.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=True, return_tensors="pt", **kwargs
    )
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=N, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist(), inputs


# ------------------------------------------------------------------------------------- reference == generate


@pytest.mark.parametrize("kind", ["image", "video", "text"])
def test_reference_tokens_equal_transformers_generate(kind, artifact, media, direct, capsys):
    args, images, videos, prompt = REQUESTS[kind](media)
    code, data, out, err = infer(capsys, str(artifact), *args, "--max-new-tokens", str(N))
    assert code == 0, err
    want, inputs = transformers_generate(direct, images, videos, prompt, "Be brief." if kind == "text" else None)
    (req,) = data["requests"]
    assert req["token_ids"] == want
    assert len(want) == N or want[-1] in direct[1].generation_config.eos_token_id
    assert req["prefill"]["tokens"] == inputs["input_ids"].shape[1]  # same prompt, token for token
    assert data["generation"]["mode"] == "greedy" and data["backend"] == "torch"
    assert data["tiny_model"] is True and "meaningless" in data["notice"] and "meaningless" in err
    # streamed text went to stderr: stdout is exactly one JSON document
    assert json.loads(out) == data
    if req["text"].strip():
        assert req["text"].strip()[:5] in err
    if kind == "image":
        (v,) = req["vision"]
        grid = inputs["image_grid_thw"][0].tolist()
        assert v["patches"] == grid[1] * grid[2] == 1200  # 640x480 -> 30x40 patches
        assert (v["bucket"], v["padding_pct"]) == (4096, 70.7)
    if kind == "video":
        (v,) = req["vision"]
        grid = inputs["video_grid_thw"][0].tolist()
        assert (v["calls"], v["patches"], v["frames"]) == (grid[0], grid[1] * grid[2], 5) == (3, 16, 5)
        assert v["bucket"] == 256


def test_output_depends_on_the_input(artifact, media, capsys):
    """A guard for the test above: the tiny model's tokens change with the image, so equality means something."""
    code, a, _, err = infer(
        capsys, str(artifact), "--image", str(media["image"]), "--prompt", "Describe.", "--max-new-tokens", "6"
    )
    assert code == 0, err
    code, b, _, err = infer(capsys, str(artifact), "--prompt", "Describe.", "--max-new-tokens", "6")
    assert code == 0, err
    assert a["requests"][0]["token_ids"] != b["requests"][0]["token_ids"]


# ------------------------------------------------------------------------------------------ batch and shape


def test_batch_file_batches_up_to_batch_size_and_reports_padding(artifact, media, direct, capsys):
    lines = [
        {"id": "img", "prompt": "Describe this image.", "images": [str(media["image"])]},
        {"id": "vid", "prompt": "What happens?", "video": "clip.mp4"},  # relative to the batch file
        {"prompt": "Say hello to the user.", "system": "Be brief."},
    ]
    batch = media["dir"] / "requests.jsonl"
    batch.write_text("\n".join(json.dumps(x) for x in lines[:2]) + "\n# a comment\n\n" + json.dumps(lines[2]) + "\n")
    code, data, out, err = infer(capsys, str(artifact), "--batch-file", str(batch), "--max-new-tokens", str(N))
    assert code == 0, err
    assert [r["id"] for r in data["requests"]] == ["img", "vid", "3"]
    assert [r["batch"] for r in data["requests"]] == [0, 0, 1]
    b0, b1 = data["batches"]
    assert (b0["real_rows"], b0["padded_rows"], b0["decoder_graph"]) == (2, 0, "decoder_batch_2")
    assert (b1["real_rows"], b1["padded_rows"], b1["decoder_graph"]) == (1, 1, "decoder_batch_2")
    assert (b1["vllm_rbln_graph"], b1["vllm_rbln_padded_rows"]) == ("decoder_batch_1", 0)
    assert data["requests"][2]["padded_rows"] == 1 and data["requests"][0]["padded_rows"] == 0
    # batching (left padding) does not change any request's greedy tokens
    for req, kind in zip(data["requests"], ["image", "video", "text"], strict=True):
        _, images, videos, prompt = REQUESTS[kind](media)
        want, _ = transformers_generate(direct, images, videos, prompt, "Be brief." if kind == "text" else None)
        assert req["token_ids"] == want, kind
    assert data["requests"][1]["vision"][0]["input"] == str(media["dir"] / "clip.mp4")


def test_json_shape_and_human_output(artifact, media, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at 80 columns when stdout is not a terminal
    code, data, _, err = infer(
        capsys, str(artifact), "--image", str(media["image"]), "--prompt", "Describe.", "--max-new-tokens", "4"
    )
    assert code == 0, err
    assert {
        "backend",
        "artifact_dir",
        "preset",
        "batch_size",
        "vit_buckets",
        "processor",
        "generation",
        "requests",
        "batches",
        "timings",
        "memory",
        "warnings",
    } <= set(data)
    req = data["requests"][0]
    assert {"id", "text", "token_ids", "vision", "decoder_graph", "timings", "prefill", "finish_reason"} <= set(req)
    assert {"input", "patches", "bucket", "padding_pct", "resized_width", "resized_height"} <= set(req["vision"][0])
    t = req["timings"]
    for key in ("preprocess_s", "vision_s", "prefill_s", "ttft_s", "decode_s", "decode_tokens_per_s"):
        assert t[key] is not None and t[key] >= 0, key
    assert t["vision_calls"] >= 1 and t["ttft_s"] >= t["vision_s"]
    assert data["preset"] == "cpu-tiny" and data["batch_size"] == 2 and data["vit_buckets"] == [256, 1024, 4096]
    assert data["memory"]["peak_rss_bytes"] > 50 * 2**20
    assert data["processor"]["max_pixels"] == 4096 * 256

    code, out, err = run_main(
        ["infer", str(artifact), "--image", str(media["image"]), "--prompt", "Describe.", "--max-new-tokens", "4"],
        capsys,
    )
    assert code == 0, err
    assert "decoder_batch_2 with 1 padded row of 2" in out and "1200" in out and "4096" in out
    assert "peak RSS" in out and "TTFT" in out and "measured: wall clock" in out  # where times come from
    assert req["text"].strip()[:3] in out  # streamed to stdout for people
    assert "meaningless" in err


def test_default_directory_is_the_presets_output_dir(artifact, media, capsys, monkeypatch, tmp_path):
    """`qvl compile --preset P` then `qvl infer --preset P ...` (no DIR) runs what compile wrote."""
    import shutil

    monkeypatch.chdir(tmp_path)
    code, _, _, err = infer(capsys, "--preset", "cpu-tiny", "--prompt", "hi")
    assert code == 2 and "no artifacts at qvl-out/cpu-tiny" in err and "qvl compile --preset cpu-tiny" in err
    shutil.copytree(artifact, tmp_path / "qvl-out" / "cpu-tiny")
    code, data, _, err = infer(capsys, "--preset", "cpu-tiny", "--prompt", "hi", "--max-new-tokens", "3")
    assert code == 0, err
    assert data["artifact_dir"] == str(tmp_path / "qvl-out" / "cpu-tiny") and data["requests"][0]["num_tokens"] == 3


def test_plain_hugging_face_directory_runs_on_the_reference(tiny, artifact, capsys):
    """`qvl infer MODEL_DIR` without compiling: same tokens as the compiled torch artifact."""
    args = ["--prompt", "Say hello to the user.", "--max-new-tokens", "5"]
    code, data, _, err = infer(capsys, str(tiny), *args)
    assert code == 0, err
    assert (data["artifact_kind"], data["backend"], data["preset"]) == ("hf", "torch", "cpu-tiny")
    code, compiled, _, err = infer(capsys, str(artifact), *args)
    assert code == 0, err
    assert data["requests"][0]["token_ids"] == compiled["requests"][0]["token_ids"]


def test_oversize_inputs_are_resized_to_the_largest_bucket(artifact, media, capsys):
    """processor.max_pixels raised past the largest bucket: resize caps it (reported), error refuses."""
    from PIL import Image

    big = media["dir"] / "big.png"
    Image.new("RGB", (2048, 1536), (20, 120, 200)).save(big)  # 12288 patches at the shipped caps
    over = ["--set", "processor.max_pixels=16777216"]
    code, _, out, err = infer(
        capsys, str(artifact), "--image", str(big), "--prompt", "x", *over, "--on-oversize", "error"
    )
    assert code == 2 and json.loads(out)["error"]["exit_code"] == 2
    assert "big.png: 12288 patches exceed the largest ViT bucket 4096" in err
    assert "visual.max_seq_len=[256,1024,4096,12288]" in err and "processor.max_pixels=1048576" in err
    # infer cannot change compiled buckets: the bucket fix is a recompile, the other one a resize
    assert "recompile with a bucket that fits: `qvl compile --preset cpu-tiny --set " in err
    assert f"visual.max_seq_len=[256,1024,4096,12288] -o {artifact} --force`" in err
    assert "--on-oversize resize" in err
    code, data, _, err = infer(
        capsys, str(artifact), "--image", str(big), "--prompt", "x", *over, "--max-new-tokens", "2"
    )
    assert code == 0, err
    (v,) = data["requests"][0]["vision"]
    assert v["capped"] is True and v["patches_before_cap"] == 12288 and v["patches"] <= 4096 and v["bucket"] == 4096
    assert data["requests"][0]["processor"]["max_pixels"] == 1048576
    assert data["oversize"]["capped"][0]["patches_before"] == 12288
    assert "capped" in err


def test_sampling_is_seeded(artifact, capsys):
    args = [str(artifact), "--prompt", "Describe.", "--max-new-tokens", "8", "--temperature", "1.5", "--top-p", "0.95"]
    _, a, _, _ = infer(capsys, *args, "--seed", "3")
    _, b, _, _ = infer(capsys, *args, "--seed", "3")
    assert a["generation"]["mode"] == "sampling" and a["generation"]["temperature"] == 1.5
    assert a["requests"][0]["token_ids"] == b["requests"][0]["token_ids"]


def test_compare_two_runs_end_to_end(artifact, media, capsys, tmp_path):
    args = [str(artifact), "--image", str(media["image"]), "--prompt", "Describe.", "--max-new-tokens", "5"]
    for name in ("a", "b"):
        code, _, out, err = infer(capsys, *args)
        assert code == 0, err
        (tmp_path / f"{name}.json").write_text(out)
    code, out, err = run_main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["summary"]["agreement_pct"] == 100.0


# ------------------------------------------------------------------------------------------------ bad input


def test_missing_and_corrupt_media(artifact, media, capsys, no_model_load):
    line = refused(capsys, str(artifact), "--image", str(media["dir"] / "nope.jpg"), "--prompt", "x")
    assert "nope.jpg: no such file" in line
    line = refused(capsys, str(artifact), "--image", str(media["corrupt"]))
    assert "cut.jpg" in line and "truncated or damaged" in line
    bad_video = media["dir"] / "bad.mp4"
    bad_video.write_bytes(b"not a video at all" * 10)
    line = refused(capsys, str(artifact), "--video", str(bad_video), "--prompt", "x")
    assert "bad.mp4" in line and "not a readable video" in line


def test_empty_prompt_without_media(artifact, capsys, no_model_load):
    assert "empty prompt and no image or video" in refused(capsys, str(artifact), "--prompt", "  ")
    assert "empty prompt" in refused(capsys, str(artifact))


def test_directory_that_is_not_qwen3_vl(tmp_path, capsys, no_model_load):
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text('{"model_type": "llama"}')
    line = refused(capsys, str(llama), "--prompt", "hi")
    assert "model_type is 'llama', not 'qwen3_vl'" in line and "Qwen3-VL" in line
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "neither a qvl artifact nor a Hugging Face model directory" in refused(capsys, str(empty), "--prompt", "x")


def test_artifacts_compiled_for_another_batch_size(tiny, tmp_path, capsys, no_model_load):
    code, _, err = run_main(
        [
            "compile",
            "--preset",
            "cpu-tiny",
            "-o",
            str(tmp_path / "b1"),
            "--no-cache",
            "--set",
            "rbln_config.batch_size=1",
            "--set",
            "rbln_config.decoder_batch_sizes=[1]",
        ],
        capsys,
    )
    assert code == 0, err
    line = refused(capsys, str(tmp_path / "b1"), "--preset", "cpu-tiny", "--prompt", "hi")
    assert "compiled for batch_size 1" in line and "preset cpu-tiny says batch_size 2" in line
    assert "--force" in line
    # the fix names the exact --set, and dropping --preset (the artifact's own values) works
    assert "drop --preset cpu-tiny" in line and "--set batch_size=1 --set decoder_batch_sizes=[1]" in line
    line = refused(capsys, str(tmp_path / "b1"), "--set", "batch_size=2", "--prompt", "hi")
    assert "preset cpu-tiny with your --set says batch_size 2" in line
    assert "`qvl compile --preset cpu-tiny --set batch_size=2 -o " in line


def test_flag_errors(artifact, media, capsys, no_model_load):
    assert "--max-new-tokens 0" in refused(capsys, str(artifact), "--prompt", "x", "--max-new-tokens", "0")
    assert "--top-p 1.5" in refused(capsys, str(artifact), "--prompt", "x", "--top-p", "1.5")
    assert "--on-oversize 'shrink'" in refused(capsys, str(artifact), "--prompt", "x", "--on-oversize", "shrink")
    line = refused(capsys, str(artifact), "--prompt", "x", "--batch-file", str(media["dir"] / "r.jsonl"))
    assert "cannot be combined with --prompt" in line
    assert "looks like a video" in refused(capsys, str(artifact), "--image", str(media["video"]))


def test_video_errors_name_the_batch_line_and_an_image_given_as_a_video(
    artifact, media, tmp_path, capsys, no_model_load
):
    """Every video refusal of a batch file names its `file:line`; an image passed as a video is called one."""
    import numpy as np

    one = tmp_path / "one.mp4"  # a single frame: too short for a temporal patch
    with av.open(str(one), "w") as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for packet in stream.encode(av.VideoFrame.from_ndarray(np.zeros((64, 64, 3), np.uint8), format="rgb24")):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    batch = tmp_path / "c2.jsonl"
    batch.write_text(
        json.dumps({"prompt": "a", "images": [str(DEMO)]})
        + "\n"
        + json.dumps({"prompt": "b", "video": "one.mp4"})
        + "\n"
    )
    line = refused(capsys, str(artifact), "--batch-file", str(batch))
    assert line.startswith(f"qvl: error: {batch}:2: {one}: video gives 1 sampled frame(s)"), line
    assert line.count(f"{batch}:2") == 1
    # an image given as a video: said so (by extension, or by its header when the name has none)
    shutil.copy2(DEMO, tmp_path / "photo")
    for name in (str(DEMO), "photo"):
        batch.write_text(json.dumps({"prompt": "a", "video": name}) + "\n")
        line = refused(capsys, str(artifact), "--batch-file", str(batch))
        shown = DEMO if name == str(DEMO) else tmp_path / name
        assert f"{batch}:1: {shown} looks like an image but was given as a video" in line, line
        assert 'fix: list it under "images"' in line and "sampled frame" not in line
    line = refused(capsys, str(artifact), "--video", str(DEMO), "--prompt", "x")
    assert f"qvl: error: {DEMO} looks like an image but was given as a video; fix: pass it with --image" == line
    batch.write_text(json.dumps({"prompt": "a", "image": str(media["video"])}) + "\n")
    line = refused(capsys, str(artifact), "--batch-file", str(batch))
    assert "looks like a video but was given as an image" in line and 'list it under "videos"' in line


def test_prompt_tokens_counted_before_the_load_equal_the_processors(artifact, media):
    """inputs.prompt_tokens (no pixels decoded) == build_inputs' count: text, images, videos with their timestamps."""
    from qwenvl_rbln.inference.inputs import build_inputs, load_processor, prompt_tokens
    from qwenvl_rbln.inference.target import resolve_target
    from qwenvl_rbln.inference.vision_report import plan_vision

    target = resolve_target(artifact, None, [])
    vis = target.plan.geometry.vision
    processor = load_processor(target.directory, target.plan.processor)
    cases = [
        ("Describe.", [media["image"]], [media["video"]], None),
        ("hi " * 40, [], [], "Be brief."),
        ("", [media["image"], media["image"]], [media["video"], media["video"]], None),
    ]
    for prompt, images, videos, system in cases:
        reqs = rq.validate_requests(rq.from_flags(prompt, [str(p) for p in images], [str(v) for v in videos], system))
        plan = plan_vision(
            reqs,
            target.plan.processor,
            target.resolved.vit_buckets,
            patch_size=vis.patch_size,
            merge_size=vis.spatial_merge_size,
            temporal_patch_size=vis.temporal_patch_size,
        )
        reqs[0].caps = plan.request_caps["1"]
        _, info = build_inputs(processor, reqs, plan.caps)
        assert prompt_tokens(processor, reqs[0], plan.items["1"], plan.caps) == info["prompt_tokens"][0]


# ------------------------------------------------------------------------------------------- batch files


def test_batch_file_errors_name_file_and_line(tmp_path, media):
    f = tmp_path / "r.jsonl"
    f.write_text('{"prompt": "ok"}\n{"prompt": "x", "imgs": ["a.jpg"]}\n')
    with pytest.raises(InputError) as e:
        rq.parse_batch_file(f)
    assert f"{f}:2: unknown key 'imgs'" in e.value.message and "images" in e.value.hint
    f.write_text('{"prompt": "ok"}\n\n{"prompt": "x",\n')
    with pytest.raises(InputError) as e:
        rq.parse_batch_file(f)
    assert e.value.message.startswith(f"{f}:3: not valid JSON")
    f.write_text('{"id": 1, "prompt": "a"}\n{"id": "1", "prompt": "b"}\n')
    with pytest.raises(InputError) as e:
        rq.parse_batch_file(f)
    assert f"{f}:2: id '1' was already used at {f}:1" == e.value.message
    f.write_text('["not", "an", "object"]\n')
    with pytest.raises(InputError, match="expected a JSON object, got array"):
        rq.parse_batch_file(f)
    f.write_text("# nothing\n\n")
    with pytest.raises(InputError, match="has no requests"):
        rq.parse_batch_file(f)
    f.write_text('{"prompt": "x", "image": "a.jpg", "images": ["b.jpg"]}\n')
    with pytest.raises(InputError, match="both 'image' and 'images'"):
        rq.parse_batch_file(f)
    f.write_text('{"prompt": "x", "images": [1]}\n')
    with pytest.raises(InputError, match="must be a path or a list of paths"):
        rq.parse_batch_file(f)
    # media are probed up front and the error names the line
    f.write_text('{"prompt": "x"}\n{"prompt": "y", "images": ["missing.png"]}\n')
    reqs = rq.parse_batch_file(f, default_system="sys")
    assert reqs[0].system == "sys" and reqs[1].images == [tmp_path / "missing.png"]
    with pytest.raises(InputError) as e:
        rq.validate_requests(reqs)
    assert e.value.message == f"{f}:2: {tmp_path / 'missing.png'}: no such file"


def test_request_messages_layout():
    r = rq.Request(
        id="1", prompt="What?", system="Be brief.", images=[Path("a.jpg"), Path("b.jpg")], videos=[Path("c.mp4")]
    )
    msgs = r.messages()
    assert msgs[0] == {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}
    assert [c["type"] for c in msgs[1]["content"]] == ["image", "image", "video", "text"]
    assert rq.Request(id="2", prompt="", images=[Path("a.jpg")]).messages()[0]["content"] == [{"type": "image"}]


def test_import_and_help_stay_light():
    import subprocess

    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom qwenvl_rbln.cli import app\n"
        "r = CliRunner().invoke(app, ['infer', '--help'])\nassert r.exit_code == 0, r.output\n"
        "r2 = CliRunner().invoke(app, ['compare', '--help'])\nassert r2.exit_code == 0, r2.output\n"
        "assert '--batch-file' in r.output and '--on-oversize' in r.output\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'optimum'}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_streamer_writes_exactly_the_decoded_text(tiny):
    """Token by token (multi-byte characters split across byte-level tokens included) the stream equals decode()."""
    import io

    import torch
    from transformers import AutoTokenizer

    from qwenvl_rbln.inference.generation import TimingStreamer

    tok = AutoTokenizer.from_pretrained(tiny)
    text = "Hello, wörld! 日本 😀 <|im_end|>"
    ids = tok(text).input_ids
    sink = io.StringIO()
    s = TimingStreamer(tok, sink=sink, prefix="[1] ")
    s.put(torch.tensor([[1, 2, 3]]))  # the prompt is not streamed
    partial = []
    for i in ids:
        s.put(torch.tensor([i]))
        partial.append(sink.getvalue())
    s.end()
    assert sink.getvalue() == "[1] " + tok.decode(ids, skip_special_tokens=True) + "\n"
    assert not any("\ufffd" in p for p in partial)  # incomplete characters are held back, never shown
    assert s.steps == len(ids) and s.t_first is not None and s.t_last >= s.t_first

    # a run of invalid bytes (what a random model emits) is flushed as it comes, never held back unboundedly
    bad = [tok.convert_tokens_to_ids("Ã")] * 8 + tok("日本").input_ids  # "Ã" = byte 0xC3, an orphan lead byte
    sink = io.StringIO()
    s = TimingStreamer(tok, sink=sink)
    s.put(torch.tensor([[1]]))
    for n, i in enumerate(bad, start=1):
        s.put(torch.tensor([i]))
        assert len(s._tokens) - s._printed <= 3 or n <= 3
    s.end()
    assert sink.getvalue() == tok.decode(bad) + "\n"


# ------------------------------------------------------------------------------------ vision report (pure)


def _caps(**kw: Any) -> Any:
    from qwenvl_rbln.planning.plan import ProcessorCaps

    base = {"min_pixels": 65536, "max_pixels": 16777216, "video_min_pixels": 4096, "video_max_pixels": 25165824}
    return ProcessorCaps(**{**base, **kw})


def _req(rid: str, images: list[tuple[int, int]] = (), videos: list[tuple[int, int, int, float]] = ()) -> Any:
    from qwenvl_rbln.vision.media import ImageInfo, VideoInfo

    r = rq.Request(id=rid, prompt="x")
    r.image_info = [ImageInfo(Path(f"{rid}-{n}.jpg"), w, h, "JPEG", 1) for n, (w, h) in enumerate(images)]
    r.video_info = [
        VideoInfo(Path(f"{rid}-{n}.mp4"), w, h, frames, fps, frames / fps, "h264")
        for n, (w, h, frames, fps) in enumerate(videos)
    ]
    return r


def test_vision_report_buckets_padding_and_video_calls():
    from qwenvl_rbln.inference.vision_report import plan_vision

    reqs = [_req("a", images=[(1280, 720), (224, 224)], videos=[(1280, 720, 32, 2.0)])]
    vp = plan_vision(reqs, _caps(), [1024, 4096, 16384])
    img, small, vid = vp.items["a"]
    assert (img.resized_width, img.resized_height, img.patches, img.bucket) == (1280, 704, 3520, 4096)
    assert img.padding_pct == round(100 * (4096 - 3520) / 4096, 2)  # as bucket-plan rounds it
    assert (small.patches, small.bucket, small.lm_tokens) == (256, 1024, 64)
    # 32 frames at 2 fps, sampled at 2 fps: 32 frames -> 16 ViT calls of one temporal patch each
    assert (vid.frames, vid.calls, vid.kind) == (32, 16, "video")
    # the video budget covers all frames: 25165824 / 32 per frame -> 1152x640 = 2880 patches per call
    assert (vid.resized_width, vid.resized_height, vid.patches, vid.bucket) == (1152, 640, 2880, 4096)
    assert vp.capped == [] and vp.notes == [] and vp.request_caps == {"a": vp.caps}


def test_vision_report_oversize_resize_caps_images_and_videos():
    from qwenvl_rbln.inference.vision_report import plan_vision

    reqs = [_req("a", images=[(4000, 3000)]), _req("b", images=[(640, 480)], videos=[(3840, 2160, 4, 2.0)])]
    vp = plan_vision(reqs, _caps(), [1024, 4096])
    (big,) = vp.items["a"]
    small, vid = vp.items["b"]
    assert big.capped and big.patches_before_cap == 47000 and big.patches <= 4096 and big.bucket == 4096
    assert not small.capped and small.patches == 1200  # below the cap: unchanged
    assert vid.capped and vid.patches_before_cap > 4096 and vid.patches <= 4096
    assert vp.request_caps["a"].max_pixels == 4096 * 256 and vp.request_caps["a"].video_max_pixels == 25165824
    # videos are capped per frame, whatever their frame count; their budget over all frames is kept for long ones
    assert vp.request_caps["b"].video_max_frame_pixels == 4096 * 256
    assert vp.request_caps["b"].video_max_pixels == 25165824
    assert vp.caps == _caps()  # the plan's caps are untouched: each request got its own
    assert [c["input"] for c in vp.capped] == ["a-0.jpg", "b-0.mp4"]
    assert len(vp.notes) == 2 and "max_pixels capped 16777216 -> 1048576 for request a" in vp.notes[0]
    assert "video_max_frame_pixels capped None -> 1048576 for request b" in vp.notes[1]


def test_vision_report_oversize_error_names_the_input_and_both_fixes():
    from qwenvl_rbln.inference.vision_report import plan_vision

    with pytest.raises(InputError) as e:
        plan_vision([_req("a", images=[(640, 480), (4000, 3000)])], _caps(), [1024, 4096], on_oversize="error")
    assert e.value.message.startswith("a-1.jpg: 47000 patches exceed the largest ViT bucket 4096")
    assert "--set visual.max_seq_len=[1024,4096,47000]" in e.value.hint
    assert "--set processor.max_pixels=1048576" in e.value.hint
    # compiled buckets: the bucket fix is the recompile command it is given
    with pytest.raises(InputError) as e:
        plan_vision(
            [_req("a", images=[(4000, 3000)])],
            _caps(),
            [1024, 4096],
            on_oversize="error",
            recompile=lambda extra: f"qvl compile --preset P --set {extra} -o DIR --force",
        )
    assert "`qvl compile --preset P --set visual.max_seq_len=[1024,4096,47000] -o DIR --force`" in e.value.hint
    assert "--on-oversize resize" in e.value.hint and "--set processor.max_pixels=1048576" in e.value.hint
    with pytest.raises(InputError) as e:
        plan_vision([_req("v", videos=[(3840, 2160, 4, 2.0)])], _caps(), [4096], on_oversize="error")
    assert "v-0.mp4" in e.value.message and "processor.video_max_frame_pixels=1048576" in e.value.hint


def test_compile_then_infer_and_load_check_without_dir_or_preset(tmp_path, monkeypatch):
    """`qvl compile --preset P` followed by `qvl infer --image x.jpg` just works, whatever P is."""
    from tests.helpers_cli import REPO, run_qvl

    home = tmp_path / "home"
    env = {"QVL_HOME": str(home)}
    out = tmp_path / "art"
    r = run_qvl("compile", "--preset", "cpu-tiny", "-o", str(out), cwd=tmp_path, env=env)
    assert r.exit_code == 0, r.stderr
    r = run_qvl(
        "infer",
        "--image",
        str(REPO / "assets" / "demo.jpg"),
        "--prompt",
        "hi",
        "--max-new-tokens",
        "3",
        "--json",
        cwd=tmp_path,
        env=env,
    )
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert Path(data["artifact_dir"]) == out.absolute()
    assert data["preset"] == "cpu-tiny"
    r = run_qvl("load-check", "--no-runtime", "--json", cwd=tmp_path, env=env)
    assert r.exit_code == 0, r.stderr
    assert Path(json.loads(r.stdout)["artifact_dir"]) == out.absolute()


def test_vision_report_video_cap_is_per_request():
    """A video's cap comes from its own request: a 2-frame video elsewhere in the run does not shrink it."""
    from qwenvl_rbln.inference.vision_report import plan_vision

    big = _req("big", videos=[(1920, 1080, 20, 10.0)])  # 4 sampled frames: over bucket 4096 at the shipped caps
    short = _req("short", videos=[(1920, 1080, 2, 10.0)])  # 2 sampled frames: a smaller total budget
    alone = plan_vision([big], _caps(), [256, 1024, 4096])
    both = plan_vision([big, short], _caps(), [256, 1024, 4096])
    assert both.items["big"] == alone.items["big"] and both.request_caps["big"] == alone.request_caps["big"]
    (v,) = alone.items["big"]
    assert v.capped and v.patches == 4032 and v.bucket == 4096
    # the cap is per frame: a 2-frame video and a 4-frame one get the same, and both fit
    assert both.request_caps["short"].video_max_frame_pixels == both.request_caps["big"].video_max_frame_pixels
    assert both.request_caps["big"].video_max_frame_pixels == 4096 * 256 and both.items["short"][0].bucket == 4096


def test_video_result_does_not_depend_on_the_other_requests(artifact, media, capsys):
    """End to end: the same request alone and next to a short video gets the same patches and tokens."""
    import numpy as np

    def video(path: Path, frames: int) -> Path:
        with av.open(str(path), "w") as container:
            stream = container.add_stream("mpeg4", rate=10)
            stream.width, stream.height, stream.pix_fmt = 1920, 1080, "yuv420p"
            for i in range(frames):
                frame = np.full((1080, 1920, 3), 12 * i, dtype=np.uint8)
                for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        return path

    big, short = video(media["dir"] / "big.mp4", 20), video(media["dir"] / "short.mp4", 2)
    batch = media["dir"] / "two-videos.jsonl"
    batch.write_text(
        json.dumps({"id": "big", "prompt": "a", "video": str(big)})
        + "\n"
        + json.dumps({"id": "short", "prompt": "b", "video": str(short)})
        + "\n"
    )
    code, alone, _, err = infer(capsys, str(artifact), "--video", str(big), "--prompt", "a", "--max-new-tokens", "3")
    assert code == 0, err
    code, both, _, err = infer(capsys, str(artifact), "--batch-file", str(batch), "--max-new-tokens", "3")
    assert code == 0, err
    a, b = alone["requests"][0], both["requests"][0]
    assert b["vision"] == a["vision"] and a["vision"][0]["patches"] == 4032
    assert b["token_ids"] == a["token_ids"] and b["processor"] == a["processor"]
    assert not [w for w in both["warnings"] if "qvl predicted" in w]  # the processor did what the report says


def test_infer_help_says_where_dir_defaults_to():
    from typer.testing import CliRunner

    from qwenvl_rbln.cli import app

    r = CliRunner().invoke(app, ["infer", "--help"], env={"COLUMNS": "300"})
    text = " ".join(r.output.replace("│", " ").split())
    assert "the last `qvl compile` wrote" in text and "with --preset P: P's output_dir" in text
    assert "cpu, cuda or cuda:N" in text


def test_compile_with_sets_then_infer_without_repeating_them(tmp_path):
    """`qvl compile --preset P --set batch_size=1 ...` then `qvl infer --image x.jpg` (and `infer DIR`) just work;
    with the directory deleted, infer looks for the recorded preset's output_dir, not rebel100-1npu's."""
    import shutil

    from tests.helpers_cli import REPO, run_qvl

    env = {"QVL_HOME": str(tmp_path / "home")}
    out = tmp_path / "art_b1"
    sets = ["--set", "batch_size=1", "--set", "decoder_batch_sizes=[1]"]
    r = run_qvl("compile", "--preset", "cpu-tiny", *sets, "-o", str(out), cwd=tmp_path, env=env)
    assert r.exit_code == 0, r.stderr
    args = ["--image", str(REPO / "assets" / "demo.jpg"), "--prompt", "hi", "--max-new-tokens", "2", "--json"]
    for where in ([], [str(out)]):
        r = run_qvl("infer", *where, *args, cwd=tmp_path, env=env)
        assert r.exit_code == 0, r.stderr
        data = json.loads(r.stdout)
        assert (data["batch_size"], data["decoder_batch_sizes"], data["preset"]) == (1, [1], "cpu-tiny")
        assert Path(data["artifact_dir"]) == out.absolute()
    shutil.rmtree(out)
    r = run_qvl("infer", *args, cwd=tmp_path, env=env)
    assert r.exit_code == 2 and json.loads(r.stdout)["error"]["exit_code"] == 2
    assert f"the last `qvl compile` wrote {out.absolute()} (preset cpu-tiny), which no longer exists" in r.stderr
    assert "qvl-out/cpu-tiny" in r.stderr and "rebel100-1npu" not in r.stderr
