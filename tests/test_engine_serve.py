"""The real engine: `qvl serve --emulate` (vLLM 0.22.0 + vllm-rbln v0.11.1a1 over qvl's emulated NPU) and real HTTP.

One server for the module (ViT packing on, the default), on the tiny Qwen3-VL compiled with `--emulate` for
RBLN-CR13 (flash attention, batch 2, ViT buckets 256/1024/4096, a video budget that fits the 4096 context once).
Every answer is checked against `qvl infer --emulate` on the same greedy request: the same tokens. Everything here is
emulated: no NPU ran. tests/test_engine_serve_auth.py runs the second server (packing off, an API key, Ctrl-C).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests import engine_server as eng

MAX_TOKENS = 8


@pytest.fixture(scope="module")
def server(engine_artifact, tmp_path_factory):
    with eng.serving(engine_artifact, tmp_path_factory.mktemp("serve")) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference(engine_artifact, engine_media, tmp_path_factory):
    """`qvl infer --emulate` on the same requests: the tokens every engine answer must equal."""
    return eng.infer_tokens(
        engine_artifact, eng.requests_of(engine_media), tmp_path_factory.mktemp("infer"), MAX_TOKENS
    )


# --------------------------------------------------------------------------------------- every answer says it


def test_every_answer_and_every_line_says_emulated(server):
    for path in ("/health", "/v1/models"):
        status, headers, _ = server.request(path)
        assert status == 200 and "emulated" in headers.get("x-qvl-emulated", ""), (path, headers)
    status, headers, _ = server.chat([eng.text_part("hi")], max_tokens=2)
    assert status == 200 and "emulated" in headers["x-qvl-emulated"]
    status, headers, _ = server.request("/v1/chat/completions", {"model": "engine", "messages": "not a list"})
    assert status == 400 and "emulated" in headers["x-qvl-emulated"]  # a refusal is an answer too
    lines = [line for line in server.output().splitlines() if line.strip()]
    assert len(lines) > 20
    unlabelled = [line for line in lines if "emulated" not in line]
    assert not unlabelled, unlabelled[:5]
    assert any("vllm_rbln" in line or "vllm-rbln" in line for line in lines)  # the real plugin ran


# ------------------------------------------------------------------------------ answers equal qvl infer's


@pytest.mark.parametrize("rid", ["text", "image", "two-buckets"])
def test_chats_answer_with_the_tokens_qvl_infer_gives(rid, server, engine_media, reference):
    content, _ = eng.requests_of(engine_media)[rid]
    assert server.tokens(content, MAX_TOKENS) == reference[rid]


def test_a_video_gets_qvl_infers_frames_and_timestamps_in_qwens_own_prompt_layout(
    server, engine_artifact, engine_media
):
    """The one explained difference. vLLM 0.22 expands the chat template's ``<|vision_start|><|video_pad|>
    <|vision_end|>`` into the timestamped temporal patches as Qwen3-VL's own processor does (transformers 4.57:
    the whole wrapped placeholder is replaced). transformers 5.15.1, which `qvl infer` calls, replaces only
    ``<|video_pad|>`` (``Qwen3VLProcessor.replace_video_token``) and keeps the outer pair, so infer's prompt has two
    more tokens around the same frames and timestamps, and the answers differ from there. The engine's prompt is
    infer's without that pair: same sampled frames, same grid, same timestamps."""
    from qwenvl_rbln.inference.inputs import build_inputs, shared_processor
    from qwenvl_rbln.inference.requests import Request

    content, _ = eng.requests_of(engine_media)["video"]
    status, _, answer = server.chat(content, MAX_TOKENS)
    assert status == 200, answer
    engine = answer["prompt_token_ids"]
    processor = shared_processor(engine_artifact)
    inputs, info = build_inputs(processor, [Request("video", "What moves?", videos=[engine_media["video"]])])
    infer = [int(t) for t in inputs["input_ids"][0].tolist()]
    start, end = processor.tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>"])
    first, last = infer.index(start), len(infer) - 1 - infer[::-1].index(end)
    assert infer[first + 1] != start and infer[first + 1 : first + 2] != [end]  # a timestamp follows the outer start
    assert engine == infer[:first] + infer[first + 1 : last] + infer[last + 1 :]
    assert info["video_grids"] == [[3, 4, 4]] and engine.count(start) == 3  # three temporal patches, timestamped


def test_vit_packing_makes_one_call_of_three_images_with_the_same_tokens(server, engine_media, reference):
    """Packing on: three images of about 300 patches each share one ViT call of bucket 1024
    (tests/test_engine_serve_auth.py: three calls with packing off, the same tokens)."""
    content, _ = eng.requests_of(engine_media)["three-small"]
    before = server.graph_calls()
    assert server.tokens(content, MAX_TOKENS) == reference["three-small"]
    assert server.graph_calls() - before == 1


def test_the_frame_cap_fits_a_video_above_the_largest_bucket(server, engine_media):
    before = server.graph_calls()
    status, _, answer = server.chat([eng.video_part(engine_media["big_video"]), eng.text_part("Describe it.")], 4)
    assert status == 200, answer
    # capped to 1024x1024 (4096 patches, the largest bucket): 1024 tokens; uncapped it would be 1600 (and fail)
    assert 1024 < answer["usage"]["prompt_tokens"] < 1100
    assert server.graph_calls() - before == 1 and server.healthy()


# ------------------------------------------------------------------------- the compiled batch, at once


def test_the_compiled_batch_of_concurrent_requests_of_different_lengths_all_answer(server):
    """batch_size 2 with decoder_batch_sizes [2, 1], flash attention for RBLN-CR13: optimum-rbln refuses a decode
    batch not sorted by length; the plugin sorts it. Two requests of different lengths at once, three times: every
    answer is 200 and equals the same request alone, and the engine is still up."""
    contents = [
        [eng.text_part("Hi.")],
        [eng.text_part("A much longer prompt, with many more words in it than the first one has, " * 4)],
    ]
    alone = [server.tokens(c, 16) for c in contents]
    with ThreadPoolExecutor(len(contents)) as pool:
        for _ in range(3):
            together = list(pool.map(lambda c: server.tokens(c, 16), contents))
            assert together == alone
    assert server.healthy()


def test_a_prompt_longer_than_the_context_is_refused_fast_and_the_engine_stays_up(server):
    t0 = time.monotonic()
    status, _, answer = server.chat([eng.text_part("word " * 5000)], max_tokens=4)
    assert 400 <= status < 500 and "4096" in json.dumps(answer), answer
    assert time.monotonic() - t0 < 30 and server.healthy()


def test_bench_serve_at_the_compiled_batch_fails_nothing(server, engine_artifact, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "qwenvl_rbln",
        "bench-serve",
        str(engine_artifact),
        "--emulate",
        "--port",
        str(server.port),
    ]
    cmd += ["--served-model-name", "engine", "--num-prompts", "4", "--input-len", "24", "--output-len", "12"]
    cmd += ["--", "--save-result", "--result-dir", str(tmp_path), "--result-filename", "bench.json"]
    done = subprocess.run(cmd, env=server.env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["completed"] == 4 and result["failed"] == 0 and result["max_concurrency"] == 2
    assert all(line.startswith("qvl emulated | ") for line in done.stdout.splitlines() if line.strip())
    assert server.healthy()
