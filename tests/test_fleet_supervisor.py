"""serving/fleet_run.py, qvl's supervisor of a fleet, with stand-in engines (a /health server with a child of its
own, as vLLM has its engine core) and a stand-in router: restart after a death, a dead engine behind a live API
server, the router's end, an engine that never comes up, and Ctrl-C. The real engines: tests/test_engine_fleet.py."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from qwenvl_rbln.errors import EXIT_INTERRUPTED
from qwenvl_rbln.serving import fleet_run
from tests.engine_server import free_port
from tests.test_serve_supervise import gone

ENGINE = """
import subprocess, sys, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
sick = sys.argv[2]
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(503 if os.path.exists(sick) else 200); self.end_headers()
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(fleet_run, "BACKOFF_S", (0.2, 0.4))
    monkeypatch.setattr(fleet_run, "HEALTH_EVERY_S", 0.2)


def engine(name: str, port: int, sick: Path) -> fleet_run.Member:
    argv = [sys.executable, "-c", ENGINE, str(port), str(sick)]
    return fleet_run.Member(name, argv, dict(os.environ), f"{name} | ", health_url=f"http://127.0.0.1:{port}/health")


def router() -> fleet_run.Member:
    return fleet_run.Member(
        "router", [sys.executable, "-c", "import time; time.sleep(600)"], {}, "router | ", restart=False
    )


def until(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def everything(members) -> list[int]:
    pids = []
    for m in members:
        if m.proc is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                pids += [m.proc.pid, *(p.pid for p in psutil.Process(m.proc.pid).children(recursive=True))]
    return pids


def run_with(members, script, sig: int = signal.SIGINT, **kw) -> tuple[int, list[str], list[int]]:
    """Run the fleet in this (main) thread while ``script(fleet, seen)`` acts from another; ``sig`` (Ctrl-C by
    default) ends it."""
    said: list[str] = []
    fleet = fleet_run.Fleet(members, said.append, **kw)
    seen: list[int] = []

    def act() -> None:
        try:
            script(fleet, seen, said)
        finally:
            seen.extend(everything(members))
            os.kill(os.getpid(), sig)

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    code = fleet.run()
    thread.join(timeout=30)
    return code, said, seen


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["ctrl-c", "sigterm", "sighup"])
def test_a_dead_engine_is_restarted_and_rejoins_and_a_signal_ends_every_process(sig, tmp_path):
    port = free_port()
    members = [engine("engine-0", port, tmp_path / "sick"), router()]

    def script(fleet, seen, said):
        until(lambda: any("engine-0 is up" in s for s in said), "first start")
        first = members[0].proc.pid
        seen.extend(everything(members))
        os.kill(first, signal.SIGKILL)  # its API server dies; its "engine core" is left to the group
        until(lambda: any("back in rotation" in s for s in said), "the restart")
        assert members[0].proc.pid != first

    code, said, seen = run_with(members, script, sig)
    assert code == EXIT_INTERRUPTED
    assert any("engine-0 exited with code 137; restarting it in 0.2 s" in s for s in said), said  # BACKOFF_S[0]
    assert members[0].restarts == 1
    until(lambda: all(gone(pid) for pid in seen), f"left behind: {[p for p in seen if not gone(p)]}", 10)


def test_an_engine_whose_health_fails_behind_a_live_server_is_ended_and_restarted(tmp_path):
    """vLLM's API server may outlive its engine core, answering /health with an error: three misses in a row after
    it had answered count as its death."""
    sick = tmp_path / "sick"
    members = [engine("engine-0", free_port(), sick), router()]

    def script(fleet, seen, said):
        until(lambda: any("engine-0 is up" in s for s in said), "first start")
        sick.write_text("1")
        until(lambda: any("/health failed 3 times" in s for s in said), "the misses")
        sick.unlink()
        until(lambda: any("back in rotation" in s for s in said), "the restart")

    code, said, seen = run_with(members, script)
    assert code == EXIT_INTERRUPTED and members[0].restarts == 1
    until(lambda: all(gone(pid) for pid in seen), "left behind", 10)


def test_the_router_ending_ends_the_fleet_with_its_code(tmp_path):
    members = [
        engine("engine-0", free_port(), tmp_path / "sick"),
        fleet_run.Member("router", [sys.executable, "-c", "import sys; sys.exit(4)"], {}, "router | ", restart=False),
    ]
    said: list[str] = []
    with pytest.raises(fleet_run.FleetFailed, match=r"^router exited with code 4$"):
        fleet_run.Fleet(members, said.append).run()
    assert all(m.proc is None for m in members)
    assert not any("restarting" in s for s in said) and members[1].starts == 1, said  # never started again


def test_an_engine_that_never_comes_up_is_given_up_after_a_few_starts(monkeypatch):
    monkeypatch.setattr(fleet_run, "GIVE_UP", 3)
    crash = fleet_run.Member(
        "engine-0", [sys.executable, "-c", "raise SystemExit(1)"], {}, "e | ", health_url="http://127.0.0.1:9/health"
    )
    with pytest.raises(fleet_run.FleetFailed, match="3 starts in a row without /health 200"):
        fleet_run.Fleet([crash, router()], lambda s: None).run()


def test_the_router_starts_once_every_engine_answers_health_and_the_fleet_says_when_it_is_ready(tmp_path):
    """vllm-router 0.1.17 listens once ONE engine is healthy: qvl starts it (and the front door) only once every
    engine has answered /health, then says the fleet is ready when the public /health answers."""
    sick = tmp_path / "sick"
    sick.write_text("1")  # engine-1 starts unhealthy, as an engine still loading its graphs
    ports = [free_port(), free_port(), free_port()]
    members = [engine("engine-0", ports[0], tmp_path / "never"), engine("engine-1", ports[1], sick)]
    argv = [sys.executable, "-c", ENGINE, str(ports[2]), str(tmp_path / "never")]  # a router: /health on its port
    members.append(fleet_run.Member("router", argv, dict(os.environ), "router | ", restart=False, after_engines=True))

    def script(fleet, seen, said):
        until(lambda: any("engine-0 is up" in s for s in said), "engine-0 up")
        time.sleep(3 * fleet_run.HEALTH_EVERY_S)  # engine-1 still answers 503: the router must not start
        assert members[2].proc is None and not any("ready" in s for s in said), said
        sick.unlink()
        until(lambda: members[2].proc is not None, "the router's start")
        until(lambda: any("the fleet is ready" in s for s in said), "the ready line")

    code, said, _ = run_with(members, script, ready_url=f"http://127.0.0.1:{ports[2]}/health")
    assert code == EXIT_INTERRUPTED
    order = [s for s in said if "engine-1 is up" in s or "every engine answers /health" in s or "ready" in s]
    assert order[0].startswith("engine-1 is up") and "every engine answers /health (2)" in order[1], said
    assert "the fleet is ready" in order[2] and members[1].restarts == 0  # a slow start is not a death


def test_the_backoff_doubles_while_an_engine_keeps_dying_and_starts_afresh_once_it_served_a_while(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(fleet_run, "BACKOFF_S", (1.0, 2.0))
    monkeypatch.setattr(fleet_run, "TICK_S", 0.05)
    members = [engine("engine-0", free_port(), tmp_path / "sick"), router()]
    starts: list[float] = []
    real = fleet_run.Fleet._start
    monkeypatch.setattr(fleet_run.Fleet, "_start", lambda self, m: starts.append(time.monotonic()) or real(self, m))

    def kill_when_up(said, n: int) -> float:
        until(lambda: sum("is up" in s for s in said) >= n, f"start {n}")
        killed = time.monotonic()
        os.kill(members[0].proc.pid, signal.SIGKILL)
        return killed

    def script(fleet, seen, said):
        first = kill_when_up(said, 1)
        until(lambda: len(starts) >= 3, "the first restart")
        assert starts[2] - first >= 1.0  # BACKOFF_S[0], honoured
        kill_when_up(said, 2)  # died again before STABLE_S: the next wait doubles
        until(lambda: sum("restarting it in" in s for s in said) >= 2, "the second death")
        monkeypatch.setattr(fleet_run, "STABLE_S", 0.0)  # now any run counts as having served a while
        kill_when_up(said, 3)
        until(lambda: sum("restarting it in" in s for s in said) >= 3, "the third death")

    code, said, _ = run_with(members, script)
    waits = [s.split("restarting it in ")[1].split(" s")[0] for s in said if "restarting it in" in s]
    assert code == EXIT_INTERRUPTED and waits == ["1", "2", "1"], said


class _Proc:
    pid = 424242


@pytest.mark.parametrize(
    ("answers", "killed_at"),
    [
        ([False] * 6 + [True], None),  # still starting: misses before the first 200 are no death
        ([True, False, False, True, False, False, True], None),  # a 200 between misses starts the count again
        ([True, False, False, False, True], 4),  # HEALTH_MISSES misses in a row after a 200: ended at the third
    ],
    ids=["starting", "intermittent", "dead"],
)
def test_an_engine_is_ended_after_exactly_health_misses_failed_checks_in_a_row(answers, killed_at, monkeypatch):
    said: list[str] = []
    kills: list[int] = []
    m = fleet_run.Member("engine-0", [], {}, "", health_url="http://127.0.0.1:9/health", proc=_Proc())
    fleet = fleet_run.Fleet([m], said.append)
    replies = iter(answers)
    monkeypatch.setattr(fleet_run, "healthy", lambda url: next(replies))
    signals: list[int] = []
    monkeypatch.setattr(fleet_run.supervise, "kill_group", lambda pid, sig: signals.append(sig))
    for i in range(len(answers)):
        before = len(signals)
        fleet._check(m, float(i) * 10)
        if len(signals) > before:
            kills.append(i + 1)
    assert (kills[0] if kills else None) == killed_at, (kills, said)
    if killed_at:
        assert said[-1] == f"engine-0: /health failed {fleet_run.HEALTH_MISSES} times in a row; ending its processes"
