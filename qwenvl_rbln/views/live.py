"""Live progress on stderr for long work: compile stages, ``infer --batch-file`` requests, long video decoding.

Only on a terminal, and never with ``--json``, ``NO_COLOR`` or ``TERM=dumb`` (``allowed``): everywhere else the
plain stderr lines of before are printed and nothing here runs. stdout is never touched. Each display is a rich
``Live`` that has stopped (its last frame left on screen, or erased for the transient ones) before a command's
error line is printed, so it cannot hide that line; Ctrl-C stops it the same way.

The displays read state, they do not compute it: the compile board reads the job's ``qwenvl_rbln.progress.Progress``
(stages with their times, graphs done out of planned, counted by the hook on optimum-rbln's
``RBLNBaseModel.compile``); the work bars read the work events of ``qwenvl_rbln.progress`` (requests done, tokens,
frames decoded). Both come from that root module, so no view imports a backend or the inference code.

While the board is up, whatever else the process writes to stderr (a plain progress line, a library's progress
bar, a bare newline) goes through the board's console, above the board: a line written past it would move the
cursor under rich's feet and leave a stale copy of the board's rows on screen.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from qwenvl_rbln import progress as progress_events
from qwenvl_rbln.progress import fmt_elapsed as _fmt
from qwenvl_rbln.views import render

REFRESH_PER_SECOND = 4
VIDEO_AFTER_S = 1.0  # a video's decoding gets a bar only once it has taken this long


def allowed(as_json: bool, console: Any = None) -> bool:
    """A live display fits here: stderr is a terminal, not --json, no NO_COLOR, TERM is not dumb."""
    if as_json or os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return bool((console or render.err()).is_terminal)


class StageBoard:
    """The compile's stages as a table: done ones with their time, the current one with a spinner and its
    running time, then the total and graphs done out of planned."""

    def __init__(self, progress: Any):
        from rich.spinner import Spinner

        self.progress = progress
        self.spinner = Spinner("dots", style="cyan")

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        p = self.progress
        stages, details = list(p.stages), list(p.details)
        names = [st["stage"] for st in stages] + ([p.current] if p.current else [])
        table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 1), expand=True)
        table.add_column(width=2, no_wrap=True)
        table.add_column(style="bold", no_wrap=True, min_width=max(map(len, names), default=8))
        table.add_column(overflow="ellipsis", no_wrap=True, ratio=1)
        table.add_column(justify="right", no_wrap=True, min_width=8)
        for i, st in enumerate(stages):
            detail = details[i] if i < len(details) else ""
            ended = st.get("ended")  # interrupted / failed: cut short, not done
            mark = Text("✗", style="red") if ended else Text("✓", style="green")
            shown = Text.assemble((ended, "bold red"), (f" · {detail}" if detail else "", "dim")) if ended else None
            table.add_row(mark, st["stage"], shown or Text(detail, style="dim"), _fmt(st["seconds"]))
        if p.current is not None:
            detail = details[-1] if len(details) > len(stages) else ""
            table.add_row(self.spinner, p.current, Text(detail, style="dim"), _fmt(p.stage_elapsed()))
        foot = f"total {_fmt(p.elapsed())}"
        if p.graphs_planned:
            foot += f" · graphs {p.graphs_done}/{p.graphs_planned}"
        return Group(table, Text(foot, style="bold"))


class _AboveTheBoard:
    """Stands in for ``sys.stderr`` (and ``sys.stdout`` when that is the same terminal) while a board is live.

    Each finished line is printed through the board's console, so it lands above the board: as a terminal would
    have left it (what follows the last carriage return, e.g. a progress bar's final state), a blank line dropped.
    Once the board is gone (``release``), writes go straight through: a handler or progress bar that kept this
    object as its stream still works. ``rich_proxied_file`` tells rich which file its console really writes to.
    """

    def __init__(self, console: Any, original: Any):
        self.rich_proxied_file = original
        self._console: Any = console
        self._pending = ""

    def write(self, text: str) -> int:
        if self._console is None:
            return self.rich_proxied_file.write(text)
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            self._print(line)
        return len(text)

    def _print(self, line: str) -> None:
        from rich.text import Text

        shown = line.rstrip("\r").rsplit("\r", 1)[-1]  # what is left on the line after carriage returns
        if shown.strip():
            self._console.print(Text.from_ansi(shown), soft_wrap=True)

    def flush(self) -> None:
        """Nothing to do: lines are printed whole, a partial one when the board stops."""

    def release(self) -> None:
        if self._console is not None and self._pending:
            self._print(self._pending)
        self._pending = ""
        self._console = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rich_proxied_file, name)


@contextlib.contextmanager
def _lines_above(console: Any) -> Iterator[None]:
    """Route stderr (and a terminal stdout) through ``console`` while the board is up; restore them after."""
    import sys

    names = ["stderr"] + (["stdout"] if console.is_terminal and sys.stdout.isatty() else [])
    saved = {name: getattr(sys, name) for name in names}
    proxies = {name: _AboveTheBoard(console, stream) for name, stream in saved.items()}
    for name, proxy in proxies.items():
        setattr(sys, name, proxy)
    try:
        yield
    finally:
        for name, stream in saved.items():
            if getattr(sys, name) is proxies[name]:
                setattr(sys, name, stream)
            proxies[name].release()


@contextlib.contextmanager
def compile_watch(progress: Any, console: Any = None) -> Iterator[None]:
    """The compile's live board for the duration of the work; stage lines go to the board instead of stderr,
    every other stderr line above it."""
    from rich.live import Live

    console = console or render.err()
    progress.quiet_stages = True
    live = Live(
        StageBoard(progress),
        console=console,
        refresh_per_second=REFRESH_PER_SECOND,
        transient=False,
        redirect_stdout=False,
        redirect_stderr=False,
    )
    try:
        with live, _lines_above(console):
            yield
    finally:
        progress.quiet_stages = False


def _rate_eta(done: int, total: int, tokens: int, elapsed: float) -> str:
    """``35.2 tokens/s · ETA 4m10s`` from what has been done so far."""
    rate = tokens / elapsed if elapsed > 0 else 0.0
    text = f"{rate:.1f} tokens/s"
    if 0 < done < total and elapsed > 0:
        text += f" · ETA {_fmt((total - done) * elapsed / done)}"
    return text


class WorkDisplay:
    """Bars for the work events (``qwenvl_rbln.progress``): requests done out of total with tokens/s and an ETA,
    and a transient bar per video whose decoding has taken over ``VIDEO_AFTER_S``.

    ``lines``: stdout is this same terminal, where the results stream between batches and a live region would
    overwrite them; requests then get one stderr line per batch instead of a bar (a video bar is still drawn: no
    result is written while a video decodes, and the bar is erased when it ends).
    """

    def __init__(self, console: Any, *, lines: bool = False, clock: Callable[[], float] = time.monotonic):
        self.console = console
        self.lines = lines
        self.clock = clock
        self._bars: Any = None
        self._requests: Any = None  # (task id, total, start)
        self._videos: dict[str, dict[str, Any]] = {}

    def _ensure_bars(self) -> Any:
        if self._bars is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bars = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                console=self.console,
                transient=True,
                refresh_per_second=REFRESH_PER_SECOND,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._bars.start()
        return self._bars

    def _stop_if_idle(self) -> None:
        if (
            self._bars is not None
            and (self._requests is None or self._requests["task"] is None)
            and not any(v.get("task") is not None for v in self._videos.values())
        ):
            self._bars.stop()
            self._bars = None

    def handle(self, event: str, fields: dict[str, Any]) -> None:
        """The work-event sink (``qwenvl_rbln.progress.watching``)."""
        getattr(self, "_on_" + event.replace(".", "_"), lambda f: None)(fields)

    def _on_requests_start(self, f: dict[str, Any]) -> None:
        total = int(f["total"])
        if total < 2:
            return
        task = None if self.lines else self._ensure_bars().add_task("requests", total=total, info="")
        self._requests = {"task": task, "total": total, "t0": self.clock()}

    def _on_requests_batch(self, f: dict[str, Any]) -> None:
        r = self._requests
        if r is None:
            return
        done, tokens = int(f["done"]), int(f["tokens"])
        info = _rate_eta(done, r["total"], tokens, self.clock() - r["t0"])
        if r["task"] is None:
            self.console.print(f"requests {done}/{r['total']} · {info}", markup=False, highlight=False, style="dim")
        else:
            self._bars.update(r["task"], completed=done, info=info)

    def _on_video_start(self, f: dict[str, Any]) -> None:
        self._videos[f["key"]] = {"total": int(f["total"]), "t0": self.clock(), "task": None}

    def _on_video_frames(self, f: dict[str, Any]) -> None:
        v = self._videos.get(f["key"])
        if v is None:
            return
        if v["task"] is None and self.clock() - v["t0"] > VIDEO_AFTER_S:
            from pathlib import Path

            v["task"] = self._ensure_bars().add_task(f"decoding {Path(f['key']).name}", total=v["total"], info="frames")
        if v["task"] is not None:
            self._bars.update(v["task"], completed=int(f["done"]))

    def _on_video_end(self, f: dict[str, Any]) -> None:
        v = self._videos.pop(f["key"], None)
        if v is not None and v["task"] is not None:
            self._bars.remove_task(v["task"])
        self._stop_if_idle()

    def close(self) -> None:
        """Stop any bar (also on an error or Ctrl-C: before the command's error line is printed)."""
        self._requests = None
        self._videos.clear()
        if self._bars is not None:
            self._bars.stop()
            self._bars = None


@contextlib.contextmanager
def work_watch(as_json: bool) -> Iterator[None]:
    """Install a ``WorkDisplay`` as the work-event sink when a live display is allowed; else nothing."""
    import sys

    if not allowed(as_json):
        yield
        return
    display = WorkDisplay(render.err(), lines=sys.stdout.isatty())
    try:
        with progress_events.watching(display.handle):
            yield
    finally:
        display.close()
