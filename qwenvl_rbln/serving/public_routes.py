"""The routes of a qvl-served vLLM that answer without the API key; every other route requires it.

One list for every front door qvl builds (``qvl serve``'s key guard, ``serving/key_guard.py``; a fleet router in
front of several engines may reuse it), so no two of them disagree on what is public. It imports nothing: the
guard runs inside vLLM's API server, and a router must not need vLLM to read it.

Why these, from vLLM 0.22's source: they are the routes vLLM's own Prometheus instrumentator treats as the
server's infrastructure rather than its API (``vllm/entrypoints/serve/instrumentator/metrics.py``,
``excluded_handlers``) and that probes and scrapers call without credentials: ``/health`` (Kubernetes probes,
``qvl deploy``), ``/ping`` (SageMaker's health check, GET and POST), ``/version``, ``/metrics`` (Prometheus) and
``/load`` (for load balancers: vLLM counts requests in flight only with ``--enable-server-load-tracking``, which qvl
does not pass, so an engine's is 0; the fleet's front door answers its own count). The sixth of that list,
``/server_info``, is not public: it exists only in vLLM's development mode and dumps the whole engine configuration.
None of the public routes runs the model or the tokenizer, or changes the server.

vLLM itself guards only paths under ``/v1``, ``/v2`` and ``/inference`` (``openai/server_utils.py``,
``GUARDED_PREFIX``), so without qvl's guard ``POST /invocations`` (a full chat completion), ``/tokenize``,
``/detokenize`` and ``/scale_elastic_ep`` answer anyone (vllm-project/vllm issue #58144). The rule here is the
reverse: a path is public only when it is exactly one of these, so a route a later vLLM adds is guarded by default.
"""

from __future__ import annotations

PUBLIC_ROUTES: tuple[str, ...] = ("/health", "/ping", "/version", "/metrics", "/load")
# CORS preflight requests carry no credentials by design; vLLM lets OPTIONS through too (it reaches no handler:
# Starlette's CORS middleware answers the preflight, any other OPTIONS gets 405)
KEYLESS_METHODS: tuple[str, ...] = ("OPTIONS",)
# routes the messages name as what a key protects (tests/test_serve_routes.py checks each is one of vLLM's routes)
GUARDED_EXAMPLES: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions", "/invocations", "/tokenize")


def is_public(path: str) -> bool:
    """Whether ``path`` (without the server's root path) answers without the key: exact matches only."""
    return path in PUBLIC_ROUTES


def needs_key(method: str, path: str) -> bool:
    """Whether a request ``method path`` must carry the API key (when the server has one)."""
    return method.upper() not in KEYLESS_METHODS and not is_public(path)


def describe() -> str:
    """The rule in words, for checks, warnings and docs."""
    return f"every route except {', '.join(PUBLIC_ROUTES)} ({', '.join(GUARDED_EXAMPLES)} and the rest)"
