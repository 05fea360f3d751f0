"""Stand-in batch workers for the Ray pool's fault tests (tests/test_batch_ray.py): no model, instant to load.

What an item does is in its line (``raw``): ``{"die": "always"}`` kills the worker process that runs it;
``{"die_once": PATH}`` kills the first worker that runs it (it creates PATH first, so the next one succeeds);
``{"raise": "..."}`` raises (a device-level failure); ``{"hold": PATH}`` blocks until PATH exists (at most
HOLD_S). Every call sleeps ``QVL_EMULATE_CALL_MS`` (a busy device) and writes ``<QVL_STANDIN_DIR>/<id>.<pid>`` when
it starts an item, so a test can wait for "this item is running" instead of sleeping.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from qwenvl_rbln.batch import records

HOLD_S = 900.0  # a held item gives up after this (the test's own limit ends first): no actor waits forever


class EchoWorker:
    """Loads nothing; answers each item with its id as text and a fixed token list."""

    max_batch = 2
    warnings = ["stand-in worker: echoes ids"]  # a load note, as BatchWorker's tiny-model and emulated notices

    def __init__(self, spec: Any):
        self.spec = spec
        self.seen = os.environ.get("RBLN_DEVICES")

    def run(self, items: list[Any]) -> list[dict[str, Any]]:
        mark = os.environ.get("QVL_STANDIN_DIR")
        for item in items:
            if mark:
                Path(mark, f"{item.id}.{os.getpid()}").touch()
        hold = float(os.environ.get("QVL_EMULATE_CALL_MS", "0") or 0) / 1000
        for item in items:
            raw = item.raw
            if raw.get("die") == "always":
                os._exit(17)
            if raw.get("die_once"):
                flag = Path(raw["die_once"])
                try:
                    flag.open("x").close()
                    os._exit(18)
                except FileExistsError:
                    pass
            if raw.get("raise"):
                raise RuntimeError(raw["raise"])
            if raw.get("hold"):
                end = time.monotonic() + HOLD_S
                while not Path(raw["hold"]).exists():
                    if time.monotonic() > end:
                        raise RuntimeError(f"{item.id}: {raw['hold']} did not appear within {HOLD_S} s")
                    time.sleep(0.02)
        if hold:
            time.sleep(hold)
        return [
            records.ok_record(
                item,
                text=f"{item.id}@{self.seen}",
                token_ids=[1, 2, 3],
                finish_reason="stop",
                vision=[],
                decoder_graph=None,
                prompt_tokens=1,
                timings={"call_ms": os.environ.get("QVL_EMULATE_CALL_MS")},  # the driver's, via runtime_env
                worker=self.spec.name,
                npu=self.spec.npu,
            )
            for item in items
        ]


class BrokenWorker(EchoWorker):
    """Cannot load (a bad artifact on that node, an NPU that does not open)."""

    def __init__(self, spec: Any):
        from qwenvl_rbln.errors import BackendError

        raise BackendError("cannot open NPU 0: device busy", "free the NPU")
