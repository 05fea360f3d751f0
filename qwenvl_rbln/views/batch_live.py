"""Progress of a batch job (``qvl infer --batch-file F --output R``) and its closing summary.

On a terminal (``live.allowed``): a live board with requests done and left, requests/s, tokens/s, an ETA and a
row per worker (its NPU, state, requests, tokens/s). Off a terminal, ``NO_COLOR`` or ``TERM=dumb``: plain lines
on stderr, one every ``LINE_EVERY_N`` requests or ``LINE_EVERY_S`` seconds (whichever comes first), so a log of a
million-request job stays readable. With ``--json`` the same plain lines go to stderr and stdout is the summary.
The board reads ``batch.tally.Tally``; it computes nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from qwenvl_rbln.progress import fmt_elapsed
from qwenvl_rbln.views import live, render

LINE_EVERY_N = 1000
LINE_EVERY_S = 10.0


def headline(snap: dict[str, Any]) -> str:
    """``1200/100000 requests · 3 failed · 12 skipped · 4.1 requests/s · 180.3 tokens/s · ETA 6h44m``."""
    finished = snap["done"] + snap["skipped"]
    parts = [f"{finished}/{snap['total']} requests"]
    if snap["failed"]:
        parts.append(f"{snap['failed']} failed")
    if snap["skipped"]:
        parts.append(f"{snap['skipped']} skipped (--resume)")
    parts.append(f"{snap['left']} left")
    parts.append(f"{snap['requests_per_s']:.2f} requests/s")
    parts.append(f"{snap['tokens_per_s']:.1f} tokens/s")
    if snap["eta_s"] is not None:
        parts.append(f"ETA {fmt_elapsed(snap['eta_s'])}")
    return " · ".join(parts)


class BatchBoard:
    """The live board: the headline, then one row per worker."""

    def __init__(self, tally: Any):
        self.tally = tally

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        snap = self.tally.snapshot()
        table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="dim")
        for col, just in (("worker", "left"), ("NPU", "left"), ("state", "left"), ("requests", "right")):
            table.add_column(col, justify=just, no_wrap=True)
        table.add_column("failed", justify="right", no_wrap=True)
        table.add_column("tokens/s", justify="right", no_wrap=True)
        elapsed = snap["elapsed_s"]
        for name, w in sorted(snap["workers"].items()):
            style = {"busy": "green", "dead": "red", "loading": "yellow"}.get(w["state"], "dim")
            npu = "-" if w["npu"] is None else str(w["npu"])
            rate = f"{w['tokens'] / elapsed:.1f}" if elapsed > 0 else "-"
            table.add_row(name, npu, Text(w["state"], style=style), str(w["requests"]), str(w["failed"]), rate)
        foot = Text(f"elapsed {fmt_elapsed(elapsed)}", style="dim")
        return Group(Text(headline(snap), style="bold"), table, foot)


def _new_notes(tally: Any, shown: int, emit: Callable[[str], None]) -> int:
    """Emit the tally's notes after the first ``shown`` (each note once, as it arrives); the count now shown."""
    while shown < len(tally.notes):
        emit(f"qvl infer: {tally.notes[shown]}")
        shown += 1
    return shown


class PlainLines:
    """The watch off a terminal: a start line, a line every N requests or S seconds, an end line (stderr)."""

    def __init__(
        self,
        emit: Callable[[str], None],
        *,
        every_n: int = LINE_EVERY_N,
        every_s: float = LINE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.emit = emit
        self.every_n, self.every_s, self.clock = every_n, every_s, clock
        self._last_done = self._noted = 0
        self._last_t = clock()

    def __call__(self, tally: Any, what: str) -> None:
        self._noted = _new_notes(tally, self._noted, self.emit)
        if what == "start":
            left = tally.total - tally.skipped
            skipped = f" ({tally.skipped} already in the output: skipped)" if tally.skipped else ""
            self.emit(f"qvl infer: {left} of {tally.total} requests to run{skipped}")
            return
        if what == "record":
            now = self.clock()
            if tally.done - self._last_done < self.every_n and now - self._last_t < self.every_s:
                return
            self._last_done, self._last_t = tally.done, now
        elif what != "end":
            return
        self.emit("qvl infer: " + headline(tally.snapshot()))


@contextlib.contextmanager
def batch_watch(as_json: bool) -> Iterator[Callable[[Any, str], None]]:
    """The job's watch: the live board on a terminal (not with --json), else plain stderr lines."""
    console = render.err()

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False)

    if not live.allowed(as_json, console):
        yield PlainLines(say)
        return
    from rich.live import Live

    holder: dict[str, Any] = {}

    def watch(tally: Any, what: str) -> None:
        holder["noted"] = _new_notes(tally, holder.get("noted", 0), say)  # above the board (Live prints them there)
        if what == "start":
            board = Live(BatchBoard(tally), console=console, refresh_per_second=live.REFRESH_PER_SECOND)
            board.start()
            holder["live"] = board
        elif what == "end" and "live" in holder:
            holder.pop("live").stop()

    try:
        yield watch
    finally:
        if "live" in holder:
            holder.pop("live").stop()


def human(console: Any, d: dict[str, Any]) -> None:
    """The summary after the job: counts, failures by cause, each worker's throughput, the output file."""
    c = d["counts"]
    console.print(
        render.markup(
            "[bold]qvl infer[/bold] batch job: {} ok, {} failed, {} skipped (already done) of {} requests -> {}",
            c["ok"],
            c["failed"],
            c["skipped_by_resume"],
            c["total"],
            d["output"],
        )
    )
    if d["failures_by_cause"]:
        causes = ", ".join(f"{cause} {n}" for cause, n in d["failures_by_cause"].items())
        console.print(f"failures by cause: {causes} (each failed line has an error object)", markup=False)
    t = d["throughput"]
    console.print(
        f"{t['requests_per_s']:.2f} requests/s, {t['tokens_per_s']:.1f} tokens/s over {fmt_elapsed(t['seconds'])}",
        markup=False,
    )
    for w in d["workers"]:
        npu = "" if w["npu"] is None else f" (NPU {w['npu']})"
        console.print(
            f"  {w['worker']}{npu}: {w['requests']} requests, {w['failed']} failed, "
            f"{w['requests_per_s']:.2f} requests/s, {w['tokens_per_s']:.1f} tokens/s",
            markup=False,
        )
