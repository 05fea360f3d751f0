"""Live progress on a terminal (compile stages and graphs, batch requests, long video decodes); off a terminal,
with --json, NO_COLOR or TERM=dumb today's plain lines; stdout the same byte for byte either way; the final error
line is never hidden by a display."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from qwenvl_rbln.inference import work
from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.progress import Progress
from qwenvl_rbln.views import live
from tests.fake_media import write_sweep_video
from tests.fakes_rbln import install, make_auto, run_main, write_hf_model

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")
DEMO = Path(__file__).resolve().parents[1] / "assets" / "demo.jpg"


def _terminal(buf: io.StringIO | None = None) -> Console:
    return Console(file=buf or io.StringIO(), force_terminal=True, width=120)


@pytest.fixture
def tty_stderr(monkeypatch):
    """The CLI's stderr console is a colour terminal (in-process); stdout stays what it is (a capture)."""
    from qwenvl_rbln.views import render

    console = Console(stderr=True, force_terminal=True, highlight=False, soft_wrap=True, width=120)
    monkeypatch.setattr(render, "err", lambda: console)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)


def test_allowed_only_on_a_terminal_without_json_no_color_or_dumb(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    tty, pipe = _terminal(), Console(file=io.StringIO())
    assert live.allowed(False, tty) and not live.allowed(True, tty) and not live.allowed(False, pipe)
    monkeypatch.setenv("NO_COLOR", "1")
    assert not live.allowed(False, tty)
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not live.allowed(False, tty)


def test_stage_board_shows_each_stage_its_time_the_total_and_graphs():
    lines: list[str] = []
    p = Progress(lines.append, heartbeat_s=0)
    buf = io.StringIO()
    with live.compile_watch(p, _terminal(buf)):
        p.stage("resolving model", "qvl:tiny")
        p.graphs_planned = 3
        p.stage("prefill graph", "prefill.rbln")
        p.graph_done()
        p.say("compile cache off: --no-cache")  # not a stage: still a line
        p.stage("decoder graph decoder_batch_1", "decoder_batch_1.rbln (1/1)")
        p.graph_done()
        p.stop()
    assert lines == ["compile cache off: --no-cache"]  # stage lines went to the board only; this one unstamped
    assert p.lines[2].startswith("[") and p.lines[2].endswith("] compile cache off: --no-cache")  # recorded stamped
    assert len(p.lines) == 4 and p.quiet_stages is False  # all recorded; plain lines again afterwards
    final = ANSI.sub("", buf.getvalue()).splitlines()
    text = "\n".join(final[-5:])
    for name in ("resolving model", "prefill graph", "decoder graph decoder_batch_1"):
        assert re.search(rf"✓ +{re.escape(name)} .*\d+\.\ds", text), text
    assert final[-1].startswith("total ") and final[-1].endswith("graphs 2/3")


def _compile_argv(model, out, *extra):
    return ["compile", "--preset", "rebel100-1npu", "--model", str(model), "-o", str(out), "--no-cache", *extra]


def _mask(text: str) -> str:
    """Timings vary from run to run; everything else must be the same bytes."""
    return re.sub(r"\d+(\.\d+)? ?(ms|s|tok/s|m\d+s|MiB|GiB)\b", "T", text)


def test_compile_live_board_on_a_terminal_plain_lines_otherwise(tmp_path, monkeypatch, capsys, tty_stderr):
    # fakes: optimum-rbln's per-graph RBLNBaseModel.compile calls on the 2B preset, which only a real host runs
    model = write_hf_model(tmp_path / "Qwen3-VL-2B-Instruct")
    plan = build_plan("rebel100-1npu", model=str(model))
    install(monkeypatch, make_auto(plan))
    code, out, err = run_main(_compile_argv(model, tmp_path / "a"), capsys)
    assert code == 0, err
    screen = ANSI.sub("", err)
    planned = len(plan.resolved.graph_names) + 1
    assert f"graphs {planned}/{planned}" in screen and re.search(r"✓ +renaming into place", screen)
    assert not re.search(r"qvl compile \[[^]]*\] resolving model", screen)  # stage lines went to the board
    assert "compile cache off: --no-cache" in screen  # other lines still printed (above the board)

    monkeypatch.setenv("TERM", "dumb")  # the same compile, plain: today's lines
    code, out_plain, err_plain = run_main(_compile_argv(model, tmp_path / "b"), capsys)
    assert code == 0
    assert "graphs " not in err_plain and re.search(r"qvl compile \[[^]]*\] renaming into place", err_plain)
    assert _mask(out.replace(str(tmp_path / "a"), "D")) == _mask(out_plain.replace(str(tmp_path / "b"), "D"))

    monkeypatch.setenv("TERM", "xterm")  # --json: no board, stdout one document
    code, out_json, err_json = run_main(_compile_argv(model, tmp_path / "c", "--json"), capsys)
    assert code == 0 and json.loads(out_json)["result"]["output_dir"] == str(tmp_path / "c")
    assert "graphs " not in err_json and "qvl compile [" in err_json


@pytest.mark.parametrize(
    ("behavior", "exit_code", "said"),
    [({"save_error": "disk full"}, 5, "disk full"), ({"save_interrupt": True}, 130, "compile interrupted")],
)
def test_a_failing_compile_ends_with_its_error_line_after_the_board(
    tmp_path, monkeypatch, capsys, tty_stderr, behavior, exit_code, said
):
    # fakes: a full disk, or Ctrl-C, half-way through optimum-rbln's save_pretrained
    model = write_hf_model(tmp_path / "Qwen3-VL-2B-Instruct")
    plan = build_plan("rebel100-1npu", model=str(model))
    install(monkeypatch, make_auto(plan, **behavior))
    code, out, err = run_main(_compile_argv(model, tmp_path / "out"), capsys)
    assert code == exit_code and out == ""
    screen = [ln for ln in ANSI.sub("", err).splitlines() if ln.strip()]
    assert screen[-1].startswith("qvl: error:") and said in screen[-1]
    assert any(ln.startswith("total ") for ln in screen[:-1])  # the board stopped above it
    assert [p.name for p in tmp_path.iterdir()] == ["Qwen3-VL-2B-Instruct"]  # nothing half-written


def test_work_display_requests_bar_lines_and_video_after_a_second():
    now = [0.0]
    buf = io.StringIO()
    d = live.WorkDisplay(_terminal(buf), lines=True, clock=lambda: now[0])
    d.handle("requests.start", {"total": 4})
    now[0] = 2.0
    d.handle("requests.batch", {"done": 2, "tokens": 20})
    assert ANSI.sub("", buf.getvalue()).strip() == "requests 2/4 · 10.0 tokens/s · ETA 2.0s"

    d.handle("video.start", {"key": "/v/long.mp4", "total": 900})
    d.handle("video.frames", {"key": "/v/long.mp4", "done": 8})
    assert d._bars is None  # under a second: no bar
    now[0] = 3.5
    d.handle("video.frames", {"key": "/v/long.mp4", "done": 400})
    (task,) = d._bars.tasks
    assert (task.description, task.completed, task.total) == ("decoding long.mp4", 400, 900)
    d.handle("video.end", {"key": "/v/long.mp4"})
    assert d._bars is None  # erased and stopped when the video is done
    d.close()

    bars = live.WorkDisplay(_terminal(), lines=False, clock=lambda: now[0])
    bars.handle("requests.start", {"total": 3})
    bars.handle("requests.batch", {"done": 1, "tokens": 5})
    (task,) = bars._bars.tasks
    assert (task.completed, task.total) == (1, 3) and "tokens/s" in task.fields["info"]
    bars.close()
    assert bars._bars is None


def test_video_decoding_reports_its_frames(tmp_path):
    from types import SimpleNamespace

    from qwenvl_rbln.inference.inputs import decode_video

    video = write_sweep_video(tmp_path / "clip.mp4", frames=20, fps=8)
    events: list[tuple[str, dict]] = []
    sampling = SimpleNamespace(fps=2.0, min_frames=4, max_frames=768, num_frames=None)
    with work.watching(lambda e, f: events.append((e, f))):
        v = decode_video(video, sampling, keep=False)
    names = [e for e, _ in events]
    assert names[0] == "video.start" and names[-1] == "video.end" and "video.frames" in names
    assert events[0][1] == {"key": str(video), "total": v.indices[-1] + 1}
    assert all(f["done"] <= v.indices[-1] for e, f in events if e == "video.frames")
    events.clear()
    decode_video(video, sampling, keep=False)  # nobody watching: no events, no cost
    assert events == []


def test_batch_file_stdout_identical_with_the_live_bar(tmp_path, monkeypatch, capsys, tiny_model, tty_stderr):
    from qwenvl_rbln.jobs.compile_job import run_compile
    from qwenvl_rbln.memory.planner import estimate_plan

    plan = build_plan("cpu-tiny", output_dir=str(tmp_path / "art"))
    run_compile(plan, estimate_plan(plan), use_cache=False, heartbeat_s=0)
    batch = tmp_path / "r.jsonl"
    batch.write_text("".join(json.dumps({"prompt": f"Say {w}.", "images": [str(DEMO)]}) + "\n" for w in "abc"))
    argv = ["infer", str(tmp_path / "art"), "--batch-file", str(batch), "--max-new-tokens", "4"]
    monkeypatch.setenv("COLUMNS", "400")  # a timing one digit longer must not move a line break (it is masked)
    monkeypatch.setenv("TERM", "dumb")
    code, plain, plain_err = run_main(argv, capsys)
    assert code == 0, plain_err
    monkeypatch.setenv("TERM", "xterm")
    events: list[str] = []
    real = live.WorkDisplay.handle
    monkeypatch.setattr(live.WorkDisplay, "handle", lambda self, e, f: (events.append(e), real(self, e, f)))
    code, shown, err = run_main(argv, capsys)
    assert code == 0, err
    assert events[0] == "requests.start" and events.count("requests.batch") == 2  # batch_size 2: 2 batches
    assert _mask(shown).splitlines() == _mask(plain).splitlines()  # the results, as today, whatever stderr shows
    assert "requests" in ANSI.sub("", err)  # the bar was drawn on stderr


# ------------------------------------------------------------------------------ the board on a real terminal (D18)

CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


def _screen(stream: str) -> list[str]:
    """What a terminal shows after ``stream``: text, \\r, \\n, erase line (ESC[2K) and cursor up (ESC[nA); colours
    and cursor visibility ignored. Enough to see a stale row that a redraw failed to erase."""
    rows: list[list[str]] = [[]]
    x = y = 0
    i = 0
    while i < len(stream):
        m = CSI.match(stream, i)
        if m:
            if m.group(2) == "A":
                y = max(0, y - int(m.group(1) or 1))
            elif m.group(2) == "K" and m.group(1) == "2":
                rows[y] = []
            i = m.end()
            continue
        ch = stream[i]
        if ch == "\r":
            x = 0
        elif ch == "\n":
            x, y = 0, y + 1
            rows.extend([] for _ in range(y + 1 - len(rows)))
        else:
            rows[y].extend(" " for _ in range(x + 1 - len(rows[y])))
            rows[y][x] = ch
            x += 1
        i += 1
    return ["".join(row).rstrip() for row in rows]


class _Clock:
    """A fake monotonic clock: the board's times are what the test says, not how long the test took."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def manual_live(monkeypatch):
    """rich's Live without its refresh thread; the test redraws the board itself (``frames[-1].refresh()``)."""
    import rich.live

    frames: list = []

    class ManualLive(rich.live.Live):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "auto_refresh": False})
            frames.append(self)

    monkeypatch.setattr(rich.live, "Live", ManualLive)
    return frames


@pytest.mark.parametrize("width", [60, 120])
def test_lines_written_to_stderr_during_the_board_leave_no_stale_rows(monkeypatch, manual_live, width):
    """D18 (a): a plain progress line and a library's progress bar (tqdm ends its bar with a bare newline) written
    to stderr while the board is up used to leave a stale copy of the first row ("✓ resolving model" twice)."""
    import sys

    term = io.StringIO()  # one terminal: the board's console and sys.stderr write to it, as on a tty
    monkeypatch.setattr(sys, "stderr", term)
    clock = _Clock()
    p = Progress(lambda line: print(line, file=sys.stderr, flush=True), heartbeat_s=0, clock=clock)
    with live.compile_watch(p, Console(file=term, force_terminal=True, width=width)):
        (board,) = manual_live
        p.stage("resolving model", "qvl:tiny")
        clock.now += 0.5
        board.refresh()
        p.stage("hashing model files", "/models/tiny")
        p.say("compile cache off: --no-cache")  # not a stage: printed, above the board
        board.refresh()
        p.stage("loading model", "RBLNAutoModelForImageTextToText.from_pretrained(...)")
        p.graphs_planned = 4
        board.refresh()
        for text in ("\rLoading weights:   0%| 0/98", "\rLoading weights: 100%| 98/98", "\n"):  # tqdm's writes
            sys.stderr.write(text)
        clock.now += 2.0
        board.refresh()
        p.stage("ViT buckets", "visual/compiled_model.rbln")
        board.refresh()
        p.stop()
    assert sys.stderr is term  # restored
    screen = [row for row in _screen(term.getvalue()) if row]
    for name in ("resolving model", "hashing model files", "loading model", "ViT buckets"):
        assert sum(name in row for row in screen) == 1, "\n".join(screen)
    assert sum("compile cache off: --no-cache" in row for row in screen) == 1
    assert [row for row in screen if "Loading weights" in row] == ["Loading weights: 100%| 98/98"]  # as tqdm left it
    assert re.search(r"✓ +resolving model +qvl:tiny +0\.5s$", screen[-5]), "\n".join(screen)
    assert screen[-1] == "total 2.5s · graphs 0/4"
    assert screen.index("Loading weights: 100%| 98/98") < screen.index(screen[-5])  # above the board


def test_a_line_above_the_board_carries_no_frozen_time_beside_the_running_total(monkeypatch, manual_live):
    """N5: the cache note printed above the board kept "qvl compile [3.8s]" while the footer said "total 8.4s" (and
    "[0.0s]" after Ctrl-C): read as the board's header, its time never moved. The footer alone tells the time."""
    import sys

    term = io.StringIO()  # one terminal: the board's console and sys.stderr write to it, as on a tty
    monkeypatch.setattr(sys, "stderr", term)
    clock = _Clock()
    lines: list[str] = []

    def emit(line: str) -> None:  # what the CLI's info() does: the line, to stderr
        lines.append(line)
        print(line, file=sys.stderr, flush=True)

    p = Progress(emit, heartbeat_s=0, prefix="qvl compile ", clock=clock)
    with live.compile_watch(p, Console(file=term, force_terminal=True, width=100)):
        (board,) = manual_live
        p.stage("resolving model", "qvl:tiny")
        clock.now += 3.8
        p.stage("hashing model files", "/models/tiny")
        p.say("compile cache off: --no-cache")
        board.refresh()
        p.stage("ViT buckets", "visual/compiled_model.rbln")
        clock.now += 4.6
        board.refresh()
        p.stop()
    screen = [row for row in _screen(term.getvalue()) if row]
    assert lines == ["qvl compile: compile cache off: --no-cache"]
    assert not [row for row in screen if "qvl compile [" in row], screen  # no time but the footer's
    assert screen[-1] == "total 8.4s"
    assert [row for row in screen if "compile cache off" in row] == ["qvl compile: compile cache off: --no-cache"]
    p.say("compile cache off: --no-cache")  # no board any more: the plain, stamped line of before
    assert lines[-1] == "qvl compile [8.4s] compile cache off: --no-cache"


def test_an_interrupted_stage_is_shown_interrupted_not_done(manual_live):
    """D18 (b): after Ctrl-C the stage that was running is marked as cut short, with its time, never ✓."""
    term = io.StringIO()
    clock = _Clock()
    p = Progress(heartbeat_s=0, clock=clock)
    board = live.compile_watch(p, Console(file=term, force_terminal=True, width=80))
    with pytest.raises(KeyboardInterrupt), board, p:  # as the compile job nests them
        p.stage("loading model")
        clock.now += 1.0
        p.graphs_planned = 4
        p.stage("ViT buckets", "visual/compiled_model.rbln")
        clock.now += 3.5
        raise KeyboardInterrupt
    assert p.stages[-1] == {"stage": "ViT buckets", "started_s": 1.0, "seconds": 3.5, "ended": "interrupted"}
    assert "ended" not in p.stages[0]
    screen = [row for row in _screen(term.getvalue()) if row]
    assert re.search(r"✓ +loading model +1\.0s$", screen[-3]), screen
    assert re.search(r"✗ +ViT buckets +interrupted · visual/compiled_model\.rbln +3\.5s$", screen[-2]), screen
    assert screen[-1] == "total 4.5s · graphs 0/4"

    failed = Progress(heartbeat_s=0, clock=clock)
    with pytest.raises(OSError), failed:
        failed.stage("saving")
        raise OSError("disk full")
    assert failed.stages[-1]["ended"] == "failed"


def test_importing_optimum_rbln_is_its_own_stage(tmp_path, monkeypatch):
    """D18 (c): the seconds spent importing optimum-rbln were counted in the stage before ("locking 3.0s")."""
    import sys

    from qwenvl_rbln.backends.rbln import optimum

    model = write_hf_model(tmp_path / "Qwen3-VL-2B-Instruct")
    plan = build_plan("rebel100-1npu", model=str(model))
    auto = make_auto(plan)
    install(monkeypatch, auto)
    base = sys.modules["optimum.rbln.modeling_base"]
    monkeypatch.delitem(sys.modules, "optimum.rbln.modeling_base")  # not imported yet in this process
    p = Progress(heartbeat_s=0)
    p.stage("locking", "out.lock")
    during: list[str | None] = []

    def importing(model_cls=None):  # what model_class does: import optimum.rbln and its model classes
        during.append(p.current)
        monkeypatch.setitem(sys.modules, "optimum.rbln.modeling_base", base)
        return auto

    monkeypatch.setattr(optimum, "model_class", importing)
    staging = tmp_path / ".out.qvl-tmp-1-abcd"
    staging.mkdir()
    optimum.compile_model(plan, staging, p)
    p.stop()
    assert during == ["importing optimum-rbln"]
    assert [s["stage"] for s in p.stages][:3] == ["locking", "importing optimum-rbln", "loading model"]

    again = Progress(heartbeat_s=0)  # imported already (a second compile in the process): no empty stage
    (tmp_path / "second").mkdir()
    optimum.compile_model(plan, tmp_path / "second", again)
    again.stop()
    assert "importing optimum-rbln" not in [s["stage"] for s in again.stages]
