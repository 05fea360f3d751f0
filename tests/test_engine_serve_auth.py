"""The real engine, second server: ViT packing off and an API key (`qvl serve --emulate`, real HTTP), then Ctrl-C.

Same artifact as tests/test_engine_serve.py, served with `--no-vit-packing` and `VLLM_API_KEY`: /v1 refuses a request
without the key while /health answers (deploy's probes rely on that); three images run three ViT calls instead of
one, with the tokens `qvl infer --emulate` gives; Ctrl-C of `qvl serve` leaves no process behind. Emulated: no NPU.
"""

from __future__ import annotations

import socket

import pytest

from tests import engine_server as eng

KEY = "engine-test-key"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def server(engine_artifact, tmp_path_factory):
    with eng.serving(
        engine_artifact, tmp_path_factory.mktemp("serve"), "--no-vit-packing", env={"VLLM_API_KEY": KEY}
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference(engine_artifact, engine_media, tmp_path_factory):
    three = {"three-small": eng.requests_of(engine_media)["three-small"]}
    return eng.infer_tokens(engine_artifact, three, tmp_path_factory.mktemp("infer"), MAX_TOKENS)


def test_v1_refuses_without_the_key_while_health_answers(server):
    chat = {"model": "engine", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    server.key = None  # this test sends its own keys
    try:
        assert server.request("/health")[0] == 200  # deploy's probes carry no key
        for key in (None, "not-the-key"):
            status, headers, answer = server.request("/v1/models", key=key)
            assert status == 401 and "emulated" in headers["x-qvl-emulated"], answer
            assert server.request("/v1/chat/completions", chat, key=key)[0] == 401
        status, _, answer = server.request("/v1/models", key=KEY)
        assert status == 200 and answer["data"][0]["id"] == "engine"
        assert server.request("/v1/chat/completions", chat, key=KEY)[0] == 200
    finally:
        server.key = KEY


def test_packing_off_runs_three_vit_calls_with_the_same_tokens(server, engine_media, reference):
    content, _ = eng.requests_of(engine_media)["three-small"]
    before = server.graph_calls()
    assert server.tokens(content, MAX_TOKENS) == reference["three-small"]
    assert server.graph_calls() - before == 3  # one per image: 320, 288 and 324 patches, each in bucket 1024


def test_ctrl_c_of_qvl_serve_leaves_no_process_behind(server):
    """The last test of the module: it stops the shared server the way a user does."""
    server.remember_processes()
    assert len(server.started) >= 2  # vllm serve and its engine core, at least
    code = server.interrupt()
    assert code == 130  # qvl's "interrupted"
    assert not eng.alive(server.started), eng.alive(server.started)
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=2):
        pass
    assert "interrupted" in server.output().splitlines()[-1]
