"""The fleet's front door: the API key checked on every route but the public ones, then the router or an engine.

vllm-router 0.1.17 checks no client key, and its own routes answer anyone, ``POST /add_worker?url=...`` (send a share
of every request to any server) and ``/remove_worker`` among them (tested over HTTP: ``tests/test_fleet.py``). It
also passes the client's ``Authorization`` on only for the routes it balances (``ROUTED``): every other route
(``/tokenize``, ``/detokenize``, ``/invocations``, ``/v1/responses``, ...) goes to an engine without the client's
headers or query string, so a keyed engine answers it 401 whatever key the client sent. So with a key (or off
loopback) qvl puts this guard on ``--host``/``--port`` and moves the router to loopback behind it:

* ``ROUTED`` (the OpenAI routes the router balances, and its probes): to the router;
* every other route: straight to an engine (the next one in turn; one that refuses the connection is skipped), with
  the client's headers and query string, so it answers as one engine does;
* ``/metrics``: the router's own Prometheus metrics (its count of requests per engine, the engines' health), not a
  random engine's; each engine's own is on its loopback port (``qvl serve --dry-run`` lists them);
* ``/load``: this door's count of requests in flight but the public ones (vLLM's is 0 unless
  ``--enable-server-load-tracking``);
* the router's membership routes (``CLOSED``) are refused to everyone: qvl owns the fleet's membership.

Public (no key): ``/health``, ``/readiness``, ``/liveness`` (the router's probes), ``/ping``, ``/version``,
``/metrics`` and ``/load``, and CORS preflights (``OPTIONS``). Everything else needs ``Authorization: Bearer KEY``,
read as every qvl guard reads it (``key_guard.key_matches``: vLLM's reading, compared as SHA-256 digests).

Run as ``python -m qwenvl_rbln.serving.front_door HOST PORT ROUTER METRICS ENGINE...`` with the key in
``QVL_FRONT_DOOR_KEY`` (or ``QVL_FRONT_DOOR_OPEN=1``: ``--no-auth``, no key, the membership routes still closed).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from qwenvl_rbln.serving.key_guard import digest_of, key_matches
from qwenvl_rbln.serving.public_routes import KEYLESS_METHODS, PUBLIC_ROUTES

KEY_ENV = "QVL_FRONT_DOOR_KEY"
OPEN_ENV = "QVL_FRONT_DOOR_OPEN"
ROUTER_PROBES = ("/readiness", "/liveness")  # vllm-router's own health probes, public like vLLM's /health
PUBLIC = frozenset({*PUBLIC_ROUTES, *ROUTER_PROBES})  # the one public list of every qvl front door, plus those
# the router's routes that read or change its membership: qvl owns it (a prefix: /workers/ID too)
CLOSED = ("/add_worker", "/remove_worker", "/workers", "/flush_cache", "/list_workers", "/get_loads")
# what vllm-router 0.1.17 forwards with the client's Authorization (tests/test_fleet.py asks the real router)
ROUTED = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/health"} | set(ROUTER_PROBES)
)
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}


def allowed(method: str, path: str, authorization: str | None, key: str | None) -> int | None:
    """None when the request may pass; else the HTTP status to answer (401 no or wrong key, 403 a closed route).
    ``key`` None: no key (``--no-auth``), only the closed routes are refused."""
    keyless = method.upper() in KEYLESS_METHODS
    if path.startswith(CLOSED) and not keyless:
        return 403
    if key is None or keyless or path in PUBLIC:
        return None
    return None if key_matches(authorization, digest_of(key)) else 401


def where(path: str) -> str:
    """Who answers a request that passed: ``router``, ``metrics`` (the router's own), ``load`` (this door) or
    ``engine`` (one engine, straight: the router would drop the client's key and query string)."""
    if path == "/metrics":
        return "metrics"
    if path == "/load":
        return "load"
    return "router" if path in ROUTED else "engine"


def app(router: str, metrics: str, engines: list[str], key: str | None) -> Any:
    import aiohttp
    from aiohttp import web

    state = {"next": 0, "in_flight": 0}

    async def session_ctx(application: web.Application):  # one pooled client for the server's life
        application["client"] = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False
        )
        yield
        await application["client"].close()

    def upstreams(request: web.Request) -> list[str]:
        """Where to send it, in the order to try: the router (or its metrics), else every engine from the next."""
        target = where(request.path)
        if target == "metrics":
            return [metrics + "/metrics"]
        if target == "router":
            return [router + request.path_qs]
        first = state["next"] % len(engines)
        state["next"] += 1
        return [url + request.path_qs for url in engines[first:] + engines[:first]]

    async def handle(request: web.Request) -> web.StreamResponse:
        refused = allowed(request.method, request.path, request.headers.get("Authorization"), key)
        if refused is not None:
            what = "a route that reads or changes the fleet" if refused == 403 else "a missing or wrong API key"
            return web.json_response({"error": {"message": f"refused by qvl's front door: {what}"}}, status=refused)
        if where(request.path) == "load":
            return web.json_response({"server_load": state["in_flight"]})
        counted = request.path not in PUBLIC  # the probes and scrapes are no load
        state["in_flight"] += counted
        try:
            return await forward(request, upstreams(request))
        finally:
            state["in_flight"] -= counted

    async def forward(request: web.Request, urls: list[str]) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        body = await request.read()
        out = None
        try:
            for i, url in enumerate(urls):
                try:
                    answer = await request.app["client"].request(
                        request.method, url, headers=headers, data=body or None
                    )
                except aiohttp.ClientConnectorError:
                    if i + 1 < len(urls):
                        continue  # an engine that is down (qvl restarts it): the next one
                    raise
                break
            async with answer:
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
            if out is not None and out.prepared:
                raise  # headers are sent: drop the connection, so the client sees an incomplete answer
            return web.json_response({"error": {"message": f"qvl's front door: the fleet failed: {exc}"}}, status=502)

    application = web.Application(client_max_size=512 * 1024 * 1024)
    application.cleanup_ctx.append(session_ctx)
    application.router.add_route("*", "/{tail:.*}", handle)
    return application


def put_in_front(fleet: Any, opts: Any, key: str | None, source: str) -> None:
    """Move the router to loopback behind the guard, which takes ``--host``/``--port``."""
    from qwenvl_rbln.serving.options import API_KEY_ENV, REDACTED, Launch, host_port
    from qwenvl_rbln.serving.preflight import ok

    argv = fleet.router.argv
    inner = fleet.router_port = opts.port + len(fleet.engines) + 2
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = str(inner)
    engines = [f"http://127.0.0.1:{p}" for p in fleet.ports]
    guard = Launch(
        argv=[
            sys.executable,
            "-m",
            "qwenvl_rbln.serving.front_door",
            opts.host,
            str(opts.port),
            f"http://127.0.0.1:{inner}",
            f"http://127.0.0.1:{fleet.metrics_port}",
            *engines,
        ],
        env={KEY_ENV: key} if key is not None else {OPEN_ENV: "1"},
        checks=[],
        secret=frozenset({KEY_ENV}) if key is not None else frozenset(),
    )
    fleet.front = guard
    who = (
        f"API key from {source} ({REDACTED}): qvl's front door on {host_port(opts.host, opts.port)} requires "
        f"'Authorization: Bearer KEY' on every route but {', '.join(sorted(PUBLIC))}"
        if key is not None
        else f"--no-auth: qvl's front door on {host_port(opts.host, opts.port)} asks no key"
    )
    ok(
        fleet.checks,
        "front-door",
        f"{who}; it refuses the router's own {', '.join(CLOSED)} to everyone (vllm-router checks no client key and "
        f"answers those to anyone), sends {', '.join(sorted(ROUTED))} to the router on 127.0.0.1:{inner}, every "
        "other route straight to an engine (the router would drop the client's key and query string), /metrics to "
        f"the router's own metrics; every engine listens on loopback"
        + (f" and requires the key too (${API_KEY_ENV})" if key is not None else ""),
    )


def main(argv: list[str]) -> None:  # pragma: no cover - the fleet's child process
    from aiohttp import web

    host, port, router, metrics, *engines = argv
    key = os.environ.pop(KEY_ENV, "") or None
    if key is None and os.environ.get(OPEN_ENV) != "1":
        sys.exit(f"qvl front door: ${KEY_ENV} is not set (or ${OPEN_ENV}=1 for no key)")
    if not engines:
        sys.exit("qvl front door: no engine URL given")
    strip = [url.rstrip("/") for url in engines]
    web.run_app(
        app(router.rstrip("/"), metrics.rstrip("/"), strip, key),
        host=host,
        port=int(port),
        print=None,
        handle_signals=True,
    )


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
