"""The fleet's front door off loopback: the API key checked on every route but the public ones, then the router.

vllm-router 0.1.17 checks no client key: ``--api-key`` is only what it sends to the engines (on its ``/metrics``
call), a client's ``Authorization`` is passed on as it came, and its own routes answer anyone, ``POST
/add_worker?url=...`` (send a share of every request to any server) and ``/remove_worker`` among them (tested over
HTTP: ``tests/test_fleet.py``). So off loopback qvl puts this guard on ``--host``/``--port`` and moves the router
to loopback behind it. It is not a balancer: one upstream, every request and answer streamed through as they come.

Public (no key): ``/health``, ``/readiness``, ``/liveness`` (the router's probes), ``/ping``, ``/version``,
``/metrics`` and ``/load``, and CORS preflights (``OPTIONS``); everything else needs ``Authorization: Bearer KEY``
(compared in constant time). The router's routes that change it (``/add_worker``, ``/remove_worker``,
``/workers``, ``/flush_cache``) are refused to everyone: qvl owns the fleet's membership.

Run as ``python -m qwenvl_rbln.serving.front_door HOST PORT UPSTREAM`` with the key in ``QVL_FRONT_DOOR_KEY``.
"""

from __future__ import annotations

import hmac
import os
import sys
from typing import Any

from qwenvl_rbln.serving.public_routes import KEYLESS_METHODS, PUBLIC_ROUTES

KEY_ENV = "QVL_FRONT_DOOR_KEY"
ROUTER_PROBES = ("/readiness", "/liveness")  # vllm-router's own health probes, public like vLLM's /health
PUBLIC = frozenset({*PUBLIC_ROUTES, *ROUTER_PROBES})  # the one public list of every qvl front door, plus those
CLOSED = ("/add_worker", "/remove_worker", "/workers", "/flush_cache")
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}


def allowed(method: str, path: str, authorization: str | None, key: str) -> int | None:
    """None when the request may pass; else the HTTP status to answer (401 no or wrong key, 403 a closed route)."""
    keyless = method.upper() in KEYLESS_METHODS
    if path.startswith(CLOSED) and not keyless:
        return 403
    if keyless or path in PUBLIC:
        return None
    given = (authorization or "").removeprefix("Bearer ").strip()
    return None if given and hmac.compare_digest(given.encode(), key.encode()) else 401


def app(upstream: str, key: str) -> Any:
    import aiohttp
    from aiohttp import web

    async def session_ctx(application: web.Application):  # one pooled client for the server's life
        application["client"] = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False
        )
        yield
        await application["client"].close()

    async def handle(request: web.Request) -> web.StreamResponse:
        refused = allowed(request.method, request.path, request.headers.get("Authorization"), key)
        if refused is not None:
            what = "a route that changes the fleet" if refused == 403 else "a missing or wrong API key"
            return web.json_response({"error": {"message": f"refused by qvl's front door: {what}"}}, status=refused)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        body = await request.read()
        try:
            async with request.app["client"].request(
                request.method, upstream + request.path_qs, headers=headers, data=body or None
            ) as answer:
                out = web.StreamResponse(status=answer.status, reason=answer.reason)
                for k, v in answer.headers.items():
                    if k.lower() not in HOP:
                        out.headers.add(k, v)
                await out.prepare(request)
                async for chunk in answer.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
        except aiohttp.ClientError as exc:  # the router is gone or cut the answer: say so, never a silent end
            if "out" in locals() and out.prepared:
                raise  # headers are sent: drop the connection, so the client sees an incomplete answer
            return web.json_response({"error": {"message": f"qvl's front door: the router failed: {exc}"}}, status=502)

    application = web.Application(client_max_size=512 * 1024 * 1024)
    application.cleanup_ctx.append(session_ctx)
    application.router.add_route("*", "/{tail:.*}", handle)
    return application


def put_in_front(fleet: Any, opts: Any, key: str, source: str) -> None:
    """Move the router to loopback behind the guard, which takes ``--host``/``--port``."""
    from qwenvl_rbln.serving.options import API_KEY_ENV, REDACTED, Launch, host_port
    from qwenvl_rbln.serving.preflight import ok

    argv = fleet.router.argv
    inner = opts.port + len(fleet.engines) + 2
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = str(inner)
    guard = Launch(
        argv=[
            sys.executable,
            "-m",
            "qwenvl_rbln.serving.front_door",
            opts.host,
            str(opts.port),
            f"http://127.0.0.1:{inner}",
        ],
        env={KEY_ENV: key},
        checks=[],
        secret=frozenset({KEY_ENV}),
    )
    fleet.front = guard
    ok(
        fleet.checks,
        "auth",
        f"API key from {source} ({REDACTED}): qvl's front door on {host_port(opts.host, opts.port)} requires "
        f"'Authorization: Bearer KEY' on every route but {', '.join(sorted(PUBLIC))}, and refuses the router's own "
        f"{', '.join(CLOSED)} to everyone (vllm-router checks no client key and answers those to anyone); the "
        f"router listens on 127.0.0.1:{inner} behind it, every engine on loopback and requires the key too "
        f"(${API_KEY_ENV})",
    )


def main(argv: list[str]) -> None:  # pragma: no cover - the fleet's child process
    from aiohttp import web

    host, port, upstream = argv
    key = os.environ.pop(KEY_ENV, "")
    if not key:
        sys.exit(f"qvl front door: ${KEY_ENV} is not set")
    web.run_app(app(upstream.rstrip("/"), key), host=host, port=int(port), print=None, handle_signals=True)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
