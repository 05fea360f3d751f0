"""The ASGI middleware every ``vllm serve`` line qvl builds hands vLLM (``--middleware``): with an API key set, every
route but the public ones requires it.

vLLM 0.22's own ``AuthenticationMiddleware`` checks only paths under ``/v1``, ``/v2`` and ``/inference``, so with a
key set ``POST /invocations`` still answers a full chat completion without it, and ``/tokenize``, ``/detokenize``
and ``/scale_elastic_ep`` answer too (``public_routes.py`` has the sources). This guard turns the rule around:
``public_routes.needs_key`` decides, so a route vLLM mounts, now or in a later release, needs the key unless it
is on the public list. It reads the key where vLLM does, ``$VLLM_API_KEY`` in the API server's environment (qvl
never passes ``--api-key`` in argv); without a key it passes everything through, as vLLM does.

vLLM adds ``--middleware`` classes outside its own middlewares (``openai/api_server.py``, ``args.middleware``), so
this one sees every request before any route or vLLM's own check. The comparison is vLLM's (SHA-256 digests,
``secrets.compare_digest``), the refusal its body (``{"error": "Unauthorized"}``, 401), so a client cannot tell
which of the two refused. A plain ASGI class that imports nothing heavy: vLLM's API server imports it.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from typing import Any

from qwenvl_rbln.serving.options import API_KEY_ENV
from qwenvl_rbln.serving.public_routes import needs_key

UNAUTHORIZED = b'{"error":"Unauthorized"}'


def digest_of(key: str) -> bytes:
    """What a key is compared as: its SHA-256, so the comparison takes the same time whatever the lengths."""
    return hashlib.sha256(key.encode("utf-8")).digest()


def key_matches(authorization: str | None, digest: bytes) -> bool:
    """Whether an ``Authorization`` header carries the key: vLLM's reading (``openai/server_utils.py``), the one of
    every qvl guard (this one and the fleet's front door): the scheme ``Bearer`` in any case, one space, the rest
    is the token as sent; a bare key, another scheme or no header is no key."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return secrets.compare_digest(digest_of(token), digest)


class KeyGuard:
    """Requires ``Authorization: Bearer $VLLM_API_KEY`` on every HTTP and WebSocket request but the public routes."""

    def __init__(self, app: Any) -> None:
        self.app = app
        key = os.environ.get(API_KEY_ENV, "")
        self.digest = digest_of(key) if key else None

    def allowed(self, scope: dict[str, Any]) -> bool:
        """Whether the request in ``scope`` may reach vLLM."""
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        method = scope.get("method", "GET") if scope["type"] == "http" else "GET"
        if self.digest is None or not needs_key(method, path):
            return True
        header = b""
        for name, value in scope.get("headers", []):
            if name.lower() == b"authorization":
                header = value
                break
        return key_matches(header.decode("latin-1"), self.digest)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") not in ("http", "websocket") or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # closed before it is accepted: the server answers the handshake with 403
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(UNAUTHORIZED)).encode())]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": UNAUTHORIZED})
