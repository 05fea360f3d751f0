"""A preempted image request on the real engine (issue 47 item 1; upstream audit 2026-12-06, W4).

vllm-rbln 0.11.1a1 recomputes a preempted request as a cached request and gives it no pixels and no grid: on
Qwen3-VL the recompute raises in transformers' ``get_rope_index``, the EngineCore dies and the request gets 500.
qvl serve sets ``QVL_RESUME_MM=1`` for a pool that can preempt, and the plugin gives the recompute its features again
(``serving/resume_features.py``). Without that hook this test fails (500, the engine down).

The tiny Qwen3-VL with ``kvcache_num_blocks=5``: blocks of 1024, vLLM keeps one as its null block, so 4 usable for a
batch of 2. Each chat is one 512x512 image (256 tokens) and 1901 prompt tokens in all (2 blocks), and decodes 200
tokens greedily (``ignore_eos``), past 2048 (a third block). The two at once hold all 4 blocks once both are
prefilled, so the first to cross 2048 needs a block that is not there: vLLM preempts the other (the later one,
FCFS) and recomputes it once the first finishes. Certain as long as the second arrives within the first's prefill
and 148 decode steps; /metrics' preemption counter says it happened, so the test cannot pass without one.
Everything here is emulated: no NPU ran.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests import engine_server as eng

SHORT_POOL = ("rbln_config.kvcache_num_blocks=5",)
BLOCK = 1024  # the tiny preset's kvcache_partition_len: the flash KV block
WORDS = 1631  # "a " is one token in the tiny tokenizer: with the template and the image, 1901 prompt tokens
MAX_TOKENS = 200  # 1901 + 200 > 2048: each needs a third block while decoding


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.emulated_rbln import compile_emulated

    assert eng.installed() is None, f"{eng.installed()}: the engine tests never skip"
    tmp = tmp_path_factory.mktemp("preempt")
    artifact = compile_emulated(tmp / "tiny-short-pool", SHORT_POOL)
    with eng.serving(artifact, tmp) as srv:
        yield srv


def preemptions(server: eng.Server) -> float:
    status, _, text = server.request("/metrics")
    assert status == 200, text
    found = re.findall(r"^vllm:num_preemptions_total\{[^}]*\} (\S+)$", text, re.MULTILINE)
    assert found, "no vllm:num_preemptions_total in /metrics"
    return sum(float(v) for v in found)


def test_a_preempted_image_request_is_recomputed_with_its_image_and_answers_as_alone(server, tmp_path):
    contents = [
        [eng.image_part(eng.png(tmp_path / f"{k}.png", 512, 512, seed=20 + k)), eng.text_part(word * WORDS)]
        for k, word in enumerate(("a ", "b "))
    ]

    def chat(content: list) -> tuple[int, dict]:
        status, _, answer = server.chat(content, MAX_TOKENS, ignore_eos=True)
        return status, answer

    alone = []
    for content in contents:
        status, answer = chat(content)
        assert status == 200, answer
        prompt = answer["usage"]["prompt_tokens"]
        assert 2 * BLOCK - MAX_TOKENS < prompt <= 2 * BLOCK, prompt  # 2 blocks each, a third while decoding
        alone.append(answer["choices"][0]["token_ids"])
    assert alone[0] != alone[1]
    before, vit_before = preemptions(server), server.graph_calls()
    with ThreadPoolExecutor(len(contents)) as pool:
        together = list(pool.map(chat, contents))
    assert [status for status, _ in together] == [200, 200], [answer for _, answer in together]
    assert [answer["choices"][0]["token_ids"] for _, answer in together] == alone
    preempted = preemptions(server) - before
    assert preempted >= 1, "no preemption happened: the test proves nothing (the pool or lengths changed?)"
    # each recompute ran the ViT again on the request's own pixels (packing on: one call per request)
    assert server.graph_calls() - vit_before == len(contents) + preempted
    assert server.healthy()
    assert "is resumed" in server.output()  # vllm-rbln's own line for the recompute
