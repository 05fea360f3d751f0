"""Progress events of long inference work (batch requests, video decoding), for whoever watches.

The core reports what it has done (``report``); a command that wants a display installs a sink for the duration
of the call (``watching``). Without a sink, ``report`` is a no-op: library callers, ``--json`` and every run off a
terminal see exactly what they saw before. A context variable, not a parameter, so the decoders deep inside
request preparation need no new argument on every function between them and the command.

Events (name, fields):

- ``requests.start`` total: requests in the run;
- ``requests.batch`` done (requests finished so far), tokens (generated so far);
- ``video.start`` key (the file), total (frames to decode: up to the last sampled one);
- ``video.frames`` key, done (frames decoded so far);
- ``video.end`` key.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

Sink = Callable[[str, dict[str, Any]], None]
_sink: ContextVar[Sink | None] = ContextVar("qvl_work_sink", default=None)

FRAME_EVERY = 8  # video.frames once per this many decoded frames (and at the end)


def report(event: str, **fields: Any) -> None:
    """Tell the watcher, if any; a watcher's failure never stops the work."""
    sink = _sink.get()
    if sink is None:
        return
    with contextlib.suppress(Exception):
        sink(event, fields)


def watched() -> bool:
    return _sink.get() is not None


@contextlib.contextmanager
def watching(sink: Sink | None) -> Iterator[None]:
    """Send ``report``'s events to ``sink`` inside the block (None: nobody watches)."""
    token = _sink.set(sink)
    try:
        yield
    finally:
        _sink.reset(token)
