"""The ASGI middleware ``qvl serve --emulate`` hands vLLM (``--middleware``): every answer says it is emulated.

vLLM adds a middleware class given by import path around its whole app (``vllm/entrypoints/openai/api_server.py``,
``args.middleware``), outermost, so the header reaches every answer: chat completions (streamed or not), errors,
the 401 of a missing API key, ``/health``, ``/metrics``. A plain ASGI class, not Starlette's BaseHTTPMiddleware,
so a streamed answer is passed through chunk by chunk. Imports nothing heavy: vLLM's API server imports it.
"""

from __future__ import annotations

from typing import Any

HEADER = b"x-qvl-emulated"
VALUE = b"emulated NPU: qvl's CPU emulator of rebel, no NPU ran"


class EmulatedHeader:
    """Adds ``X-QVL-Emulated`` to every HTTP answer of the app it wraps."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return

        async def marked(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (HEADER, VALUE)]}
            await send(message)

        await self.app(scope, receive, marked)
