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

The channel itself (``report``, ``watching``) lives in ``qwenvl_rbln.progress``, below every layer, so the live
display that watches it never imports inference; the names here are the same objects.
"""

from __future__ import annotations

from qwenvl_rbln.progress import Sink, report, watched, watching

__all__ = ["FRAME_EVERY", "Sink", "report", "watched", "watching"]

FRAME_EVERY = 8  # video.frames once per this many decoded frames (and at the end)
