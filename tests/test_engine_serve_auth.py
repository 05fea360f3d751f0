"""The real engine, second server: ViT packing off and an API key (`qvl serve --emulate`, real HTTP), then Ctrl-C.

Same artifact as tests/test_engine_serve.py, served with `--no-vit-packing` and `VLLM_API_KEY`: /v1 refuses a request
without the key while /health answers (deploy's probes rely on that); three images run three ViT calls instead of
one, with the tokens `qvl infer --emulate` gives; Ctrl-C of `qvl serve` leaves no process behind. Emulated: no NPU.
"""

from __future__ import annotations

import re
import socket
import urllib.error
import urllib.request

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


def call(server, method: str, path: str, key: str | None) -> tuple[int, dict[str, str]]:
    """(status, headers) of one request with a JSON body for every method but GET: enough for a route to get past
    who-may-call (401 or not); a path parameter is filled with a made-up id."""
    url = server.url + re.sub(r"\{[^}]*\}", "qvl-route-test", path)
    data = b"{}" if method != "GET" else None
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def test_every_route_the_engine_serves_but_the_public_ones_needs_the_key(server):
    """Round 5 F1 / N1: vLLM alone answered POST /invocations (a full chat completion) and /tokenize without the key.
    The routes are the running engine's own (/openapi.json) joined with those vLLM's build_app mounts outside the
    schema (docs, the /metrics mount): every one answers 401 without the key (and with a wrong one) unless it is
    public, and is past the guard (not 401) with the key."""
    from qwenvl_rbln.serving.public_routes import GUARDED_EXAMPLES, PUBLIC_ROUTES, is_public
    from tests.vllm_routes import vllm_app_routes

    status, _ = call(server, "GET", "/openapi.json", None)
    assert status == 401  # the schema itself is not public
    status, _, schema = server.request("/openapi.json", key=KEY)
    assert status == 200
    served = {(method.upper(), path) for path, ops in schema["paths"].items() for method in ops}
    built = {(method, path) for method, path in vllm_app_routes()["routes"]}
    assert served <= built, sorted(served - built)  # the build is the served app's
    routes = sorted(served | built)
    assert {path for _, path in routes} >= {*PUBLIC_ROUTES, *GUARDED_EXAMPLES}
    wrong = []
    for method, path in routes:
        without, headers = call(server, method, path, None)
        assert "x-qvl-emulated" in {h.lower() for h in headers}, (method, path)
        bad_key = call(server, method, path, "not-the-key")[0]
        with_key = call(server, method, path, KEY)[0]
        expected = (without != 401 and bad_key != 401) if is_public(path) else (without == bad_key == 401)
        if not expected or with_key == 401:
            wrong.append((method, path, without, bad_key, with_key))
    assert not wrong, wrong
    assert server.healthy()


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
