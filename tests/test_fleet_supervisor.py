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


def run_with(members, script, sig: int = signal.SIGINT) -> tuple[int, list[str], list[int]]:
    """Run the fleet in this (main) thread while ``script(fleet, seen)`` acts from another; ``sig`` (Ctrl-C by
    default) ends it."""
    said: list[str] = []
    fleet = fleet_run.Fleet(members, said.append)
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
    assert any("engine-0 exited with code 137; restarting it" in s for s in said), said
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
    with pytest.raises(fleet_run.FleetFailed, match="router exited with code 4"):
        fleet_run.Fleet(members, lambda s: None).run()
    assert all(m.proc is None for m in members)


def test_an_engine_that_never_comes_up_is_given_up_after_a_few_starts(monkeypatch):
    monkeypatch.setattr(fleet_run, "GIVE_UP", 3)
    crash = fleet_run.Member(
        "engine-0", [sys.executable, "-c", "raise SystemExit(1)"], {}, "e | ", health_url="http://127.0.0.1:9/health"
    )
    with pytest.raises(fleet_run.FleetFailed, match="3 starts in a row without /health 200"):
        fleet_run.Fleet([crash, router()], lambda s: None).run()
