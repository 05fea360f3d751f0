"""Round 5 F1 / N1: who may call a qvl-served vLLM. vLLM 0.22 guards only /v1, /v2 and /inference with the API
key, so ``POST /invocations`` answered a full chat completion without it; qvl's key guard (``serving/key_guard.py``,
``--middleware`` on every serve line) requires the key on every route but ``public_routes.PUBLIC_ROUTES``.

Here: the guard as an ASGI app (no engine), and the list checked against vLLM's own app routes (built, not served).
The same rule over real HTTP on the running engine: tests/test_engine_serve_auth.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from qwenvl_rbln.serving.key_guard import KeyGuard
from qwenvl_rbln.serving.public_routes import GUARDED_EXAMPLES, PUBLIC_ROUTES, needs_key
from tests.fakes_rbln import run_main

KEY = "route-test-key"


async def _ok_app(scope, receive, send) -> None:
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def call(guard: KeyGuard, path: str, *, method: str = "POST", auth: str | None = None, kind: str = "http", root=""):
    """The first message the guarded app sends for one request."""
    headers = [(b"authorization", auth.encode())] if auth is not None else []
    scope = {"type": kind, "path": root + path, "root_path": root, "method": method, "headers": headers}
    sent: list[dict] = []

    async def receive():
        return {"type": "websocket.connect"} if kind == "websocket" else {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    return sent[0]


@pytest.fixture
def guard(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    return KeyGuard(_ok_app)


GUARDED = "/invocations /tokenize /detokenize /v1/models /scale_elastic_ep /docs /openapi.json /server_info /health/"


@pytest.mark.parametrize("path", [*GUARDED.split(), "//health", "/HEALTH", "/"])
def test_with_a_key_every_route_but_the_public_ones_needs_it(guard, path):
    assert call(guard, path)["status"] == 401
    assert call(guard, path, auth="Bearer not-the-key")["status"] == 401
    assert call(guard, path, auth=KEY)["status"] == 401  # no scheme
    assert call(guard, path, auth=f"Basic {KEY}")["status"] == 401
    assert call(guard, path, auth=f"Bearer {KEY}")["status"] == 200
    assert call(guard, path, auth=f"bearer {KEY}")["status"] == 200  # the scheme is case-insensitive, as vLLM's


@pytest.mark.parametrize("path", PUBLIC_ROUTES)
def test_the_public_routes_answer_without_the_key(guard, path):
    assert call(guard, path, method="GET")["status"] == 200
    assert call(guard, path, method="GET", root="/prefix")["status"] == 200  # behind --root-path


def test_a_refusal_is_vllms_own_and_preflight_and_websockets_are_handled(guard):
    start = call(guard, "/invocations")
    assert start["status"] == 401 and (b"content-type", b"application/json") in start["headers"]
    assert call(guard, "/invocations", method="OPTIONS")["status"] == 200  # CORS preflight carries no credentials
    assert call(guard, "/v1/realtime", kind="websocket") == {"type": "websocket.close", "code": 1008}
    assert call(guard, "/v1/realtime", kind="websocket", auth=f"Bearer {KEY}")["type"] == "websocket.accept"
    assert call(guard, "/invocations", root="/prefix")["status"] == 401


def test_without_a_key_the_guard_lets_everything_through(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert call(KeyGuard(_ok_app), "/invocations")["status"] == 200
    monkeypatch.setenv("VLLM_API_KEY", "")
    assert call(KeyGuard(_ok_app), "/invocations")["status"] == 200


def test_the_lists_name_real_vllm_routes_and_vllm_alone_leaves_some_open():
    """Every public route and every route the messages name is one of the installed vLLM's app routes (built by
    vLLM's build_app, not served), and vLLM's own prefix check leaves guarded routes open: why qvl's guard exists."""
    from tests.vllm_routes import vllm_app_routes

    built = vllm_app_routes()
    paths = {path for _, path in built["routes"]}
    assert set(PUBLIC_ROUTES) <= paths and set(GUARDED_EXAMPLES) <= paths, sorted(paths)
    open_in_vllm = sorted(
        path for method, path in built["routes"]
        if needs_key(method, path) and not path.startswith(tuple(built["guarded_prefix"]))
    )  # fmt: skip
    assert "/invocations" in open_in_vllm and "/tokenize" in open_in_vllm, open_in_vllm


def test_the_messages_say_the_same_rule_the_guard_applies(tmp_path, capsys, monkeypatch):
    """--no-auth names what it opens from the same lists (every route, the public ones included); with a key, the
    check says which routes need it; every serve line carries the guard."""
    from qwenvl_rbln.serving.options import KEY_GUARD
    from qwenvl_rbln.serving.public_routes import describe
    from tests.test_serve_emulate import emulated_artifact

    art = emulated_artifact(tmp_path / "art", emulated=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    code, out, err = run_main(["serve", str(art), "--host", "0.0.0.0", "--no-auth", "--dry-run", "--json"], capsys)
    assert code == 0, err
    (warning,) = [line for line in err.splitlines() if "--no-auth" in line]
    assert all(route in warning for route in (*GUARDED_EXAMPLES, *PUBLIC_ROUTES)), warning
    argv = json.loads(out)["argv"]
    assert argv[argv.index("--middleware") + 1] == KEY_GUARD
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    code, out, err = run_main(["serve", str(art), "--host", "0.0.0.0", "--dry-run", "--json"], capsys)
    (auth,) = [c for c in json.loads(out)["checks"] if c["check"] == "auth"]
    assert code == 0 and describe() in auth["detail"]
