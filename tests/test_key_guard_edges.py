"""qvl serve's key guard (serving/key_guard.py, serving/public_routes.py) on the edges the route tests leave open
(audit 2026-12-06, mutants K03, P02, P05 and the refusal's body): an empty bearer token, every method but OPTIONS,
the five public routes by name, and the refusal as vLLM's own AuthenticationMiddleware sends it, checked against
that middleware (the installed vLLM's) on the same requests."""

from __future__ import annotations

import asyncio

import pytest

from qwenvl_rbln.serving.key_guard import KeyGuard
from tests.test_serve_routes import KEY, _ok_app


def exchange(app, path: str, *, method: str = "GET", auth: str | None = None) -> list[dict]:
    """Every message the app sends for one HTTP request."""
    headers = [(b"authorization", auth.encode())] if auth is not None else []
    scope = {"type": "http", "path": path, "root_path": "", "method": method, "headers": headers,
             "query_string": b"", "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 8000)}  # fmt: skip
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


@pytest.fixture
def guard(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    return KeyGuard(_ok_app)


def _status(guard, path, **kw) -> int:
    return exchange(guard, path, **kw)[0]["status"]


@pytest.mark.parametrize("auth", ["Bearer ", "Bearer", "bearer  ", " ", ""])
def test_an_empty_bearer_token_is_refused(guard, auth):
    """K03: 'Bearer ' with nothing after it is no key."""
    assert _status(guard, "/invocations", method="POST", auth=auth) == 401
    assert _status(guard, "/invocations", method="POST", auth=f"Bearer {KEY}") == 200


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "head"])
def test_every_method_but_options_needs_the_key(guard, method):
    """P02: Starlette answers HEAD on every GET route, so a keyless HEAD would reach /v1/models' handler."""
    assert _status(guard, "/v1/models", method=method) == 401
    assert _status(guard, "/v1/models", method=method, auth=f"Bearer {KEY}") == 200
    assert _status(guard, "/v1/models", method="OPTIONS") == 200  # CORS preflight, as vLLM


@pytest.mark.parametrize("path", ["/health", "/ping", "/version", "/metrics", "/load"])
def test_the_five_public_routes_answer_without_the_key(guard, path):
    """P05: named here, not read from the list under test (a route dropped from it would pass a loop over it):
    probes, scrapers and load balancers call these without credentials (public_routes.py says why each)."""
    assert _status(guard, path) == 200
    assert _status(guard, path, method="POST") == 200  # /ping is SageMaker's, GET and POST


@pytest.mark.parametrize("auth", [None, "Bearer ", "Bearer wrong", f"Basic {KEY}"])
@pytest.mark.parametrize("method", ["GET", "HEAD", "POST"])
def test_a_refusal_is_byte_for_byte_vllms_own(guard, auth, method, emulated):
    """The 401 and its body are what vLLM's own middleware sends on the same request under /v1 (where vLLM checks),
    so a client cannot tell which refused; and both refuse the same requests. (``emulated``: vllm-rbln's platform
    plugin imports rebel with vLLM.)"""
    from vllm.entrypoints.openai.server_utils import AuthenticationMiddleware

    vllm = AuthenticationMiddleware(_ok_app, tokens=[KEY])
    ours, theirs = (
        exchange(guard, "/v1/models", method=method, auth=auth),
        exchange(vllm, "/v1/models", method=method, auth=auth),
    )
    assert ours[0]["status"] == theirs[0]["status"] == 401
    assert sorted(ours[0]["headers"]) == sorted(theirs[0]["headers"])
    assert [m["body"] for m in ours[1:]] == [m["body"] for m in theirs[1:]] == [b'{"error":"Unauthorized"}']


def test_a_key_with_a_space_is_read_as_vllm_reads_it(monkeypatch):
    """The token is everything after the first space (vLLM's ``partition(" ")``), so a key with a space works."""
    monkeypatch.setenv("VLLM_API_KEY", "two words")
    guard = KeyGuard(_ok_app)
    assert _status(guard, "/v1/models", auth="Bearer two words") == 200
    assert _status(guard, "/v1/models", auth="Bearer words") == 401
