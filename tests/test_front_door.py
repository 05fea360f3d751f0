"""The fleet's front door as pure functions (``front_door.allowed``, ``front_door.where``) and the one reading of
``Authorization`` it shares with the engines' key guard (``key_guard.key_matches``). Over HTTP with the real router:
tests/test_fleet.py."""

from __future__ import annotations

import pytest

from qwenvl_rbln.serving import front_door
from qwenvl_rbln.serving.front_door import CLOSED, PUBLIC, allowed, where
from qwenvl_rbln.serving.key_guard import KeyGuard, key_matches
from qwenvl_rbln.serving.public_routes import PUBLIC_ROUTES

KEY = "k1"


@pytest.mark.parametrize(
    ("header", "passes"),
    [
        ("Bearer k1", True),
        ("bearer k1", True),  # the scheme in any case (RFC 7235), as vLLM reads it
        ("BEARER k1", True),
        ("k1", False),  # a bare key is no key
        ("Bearer  k1", False),  # one space: the rest is the token as sent
        ("Bearer k1 ", False),
        ("Basic k1", False),
        ("Bearer ", False),
        ("Bearer k2", False),
        ("Bearer k", False),
        ("", False),
        (None, False),
    ],
)
def test_the_front_door_and_the_key_guard_read_authorization_the_same_way(header, passes, monkeypatch):
    from qwenvl_rbln.serving.key_guard import digest_of

    assert key_matches(header, digest_of(KEY)) is passes
    assert (allowed("POST", "/v1/chat/completions", header, KEY) is None) is passes
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    headers = [] if header is None else [(b"authorization", header.encode("latin-1"))]
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
    assert KeyGuard(None).allowed(scope) is passes


@pytest.mark.parametrize("path", [p + tail for p in CLOSED for tail in ("", "/x", "?url=http://127.0.0.1:9")])
def test_the_routers_membership_routes_are_refused_to_everyone_sub_paths_too(path):
    route = path.split("?")[0]
    for method in ("GET", "POST", "DELETE"):
        assert allowed(method, route, f"Bearer {KEY}", KEY) == 403
        assert allowed(method, route, None, KEY) == 403
        assert allowed(method, route, None, None) == 403  # --no-auth: still closed
    assert {"/add_worker", "/remove_worker", "/workers", "/flush_cache", "/list_workers", "/get_loads"} == set(CLOSED)


def test_public_routes_are_exact_and_everything_else_needs_the_key():
    assert {*PUBLIC_ROUTES, "/readiness", "/liveness"} == PUBLIC
    for path in PUBLIC:
        assert allowed("GET", path, None, KEY) is None
    for near in ("/healthz", "/health/", "/health/x", "/metrics/x", "/metricsX", "/Health", "//health", "/load/"):
        assert allowed("GET", near, None, KEY) == 401, near
    for path in ("/tokenize", "/detokenize", "/invocations", "/v1/models", "/v1/responses"):
        assert allowed("POST", path, None, KEY) == 401 and allowed("POST", path, f"Bearer {KEY}", KEY) is None
    assert allowed("POST", "/tokenize", None, None) is None  # --no-auth: no key asked


def test_cors_preflights_pass_without_the_key():
    assert allowed("OPTIONS", "/v1/chat/completions", None, KEY) is None
    assert allowed("options", "/tokenize", None, KEY) is None
    assert allowed("HEAD", "/v1/models", None, KEY) == 401  # HEAD is a GET without the body: keyed


def test_who_answers_what_passed():
    assert {p: where(p) for p in sorted(front_door.ROUTED)} == {p: "router" for p in sorted(front_door.ROUTED)}
    assert where("/metrics") == "metrics" and where("/load") == "load"
    for path in ("/tokenize", "/detokenize", "/invocations", "/v1/responses", "/ping", "/version", "/pooling"):
        assert where(path) == "engine", path
    assert {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
        "/health",
        "/readiness",
        "/liveness",
    } == front_door.ROUTED
