"""Run a fleet (``fleet.py``): every engine and the router as qvl's children, each in its own process group.

One loop in qvl's main thread keeps the fleet serving:

* **start**: every engine at once; the router (and the front door) only once every engine has answered ``/health``:
  vllm-router 0.1.17 listens as soon as ONE engine is healthy, so started with the engines it would serve (and say
  ready) while the others still load. qvl says the fleet is ready once the public ``/health`` answers 200;
* **an engine that dies** (its ``vllm serve`` exits, or its ``/health`` fails ``HEALTH_MISSES`` times in a row
  after it had answered: an engine core killed under a live API server) has what is left of its group killed and
  is started again after a backoff (``BACKOFF_S``, doubling, reset once it has served ``STABLE_S``); the router
  stops sending it work when its own health check fails and takes it back when ``/health`` answers again;
* **an engine that never comes up** (``GIVE_UP`` starts in a row without one ``/health`` 200), or **the router
  exiting**, ends the fleet with an error: a front door that cannot serve must not look like one;
* **Ctrl-C, SIGTERM, SIGHUP**: SIGINT to every group, ``supervise.GRACE_S`` to shut down, then SIGKILL to each;
  qvl returns 130 only once no process of the fleet is left (a second signal kills at once).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from qwenvl_rbln.errors import EXIT_INTERRUPTED
from qwenvl_rbln.serving import supervise

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # before the 1st, 2nd, ... restart in a row
STABLE_S = 60.0  # healthy this long: the next death starts the backoff afresh
GIVE_UP = 5  # starts in a row without one /health 200: the engine cannot come up
HEALTH_EVERY_S = 2.0
HEALTH_MISSES = 3  # failed checks in a row, after the engine answered once, that count as its death
TICK_S = 0.2


@dataclass
class Member:
    """One process of the fleet: an engine (restarted when it dies) or the router (its end is the fleet's)."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    label: str
    health_url: str | None = None  # engines: their loopback /health
    restart: bool = True
    after_engines: bool = False  # the router and the front door: started once every engine has answered /health
    listen: Any = None  # engines: the port qvl holds for them (serving/port.HeldPort), handed to every start
    proc: subprocess.Popen | None = None
    pumps: list[threading.Thread] = field(default_factory=list)
    starts: int = 0  # starts in a row without one /health 200: GIVE_UP of them end the fleet
    backoff: int = 0  # restarts in a row: the next one waits BACKOFF_S[backoff]; reset once it served STABLE_S
    up_since: float | None = None  # first /health 200 of this run
    misses: int = 0
    next_start: float = 0.0
    next_check: float = 0.0
    restarts: int = 0  # every restart, for the summary and the tests

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


def healthy(url: str, timeout: float = 1.5) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class FleetFailed(Exception):
    """The fleet cannot serve: an engine never came up, or the router ended."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Fleet:
    def __init__(self, members: list[Member], say: Callable[[str], None], ready_url: str | None = None) -> None:
        self.members = members
        self.say = say
        self.interrupted: list[float] = []
        self.ready_url = ready_url  # the fleet's public /health: 200 once the router serves every engine
        self.engines_up = False  # every engine has answered /health once: the rest may start
        self.next_ready = 0.0

    def _waiting(self, m: Member) -> bool:
        """``m`` waits for every engine's first /health 200 (the router would otherwise serve with one)."""
        if not m.after_engines or self.engines_up:
            return False
        engines = [e for e in self.members if e.health_url is not None]
        if any(e.up_since is None for e in engines):
            return True
        self.engines_up = True
        self.say(
            f"every engine answers /health ({len(engines)}); starting the rest: "
            + ", ".join(x.name for x in self.members if x.after_engines)
        )
        return False

    def _ready(self, now: float) -> None:
        """Once, after the start: say the fleet is ready when its public /health answers 200 (the router's: 200 only
        while every engine is healthy)."""
        if self.ready_url is None or now < self.next_ready:
            return
        self.next_ready = now + TICK_S * 5
        if healthy(self.ready_url):
            self.say(f"the fleet is ready: {self.ready_url} answers 200 (every engine healthy)")
            self.ready_url = None

    # ------------------------------------------------------------------------------------------ one member

    def _start(self, m: Member) -> None:
        m.proc, m.pumps = supervise.spawn(m.argv, m.env, m.label, m.listen)
        m.starts += 1
        m.up_since, m.misses = None, 0
        m.next_check = time.monotonic() + HEALTH_EVERY_S

    def _ended(self, m: Member, now: float) -> None:
        """``m``'s main process is gone: kill the rest of its group; restart it, or end the fleet."""
        assert m.proc is not None
        code = supervise.exit_code(m.proc.returncode)
        supervise.end_group(m.proc.pid)
        for pump in m.pumps:
            pump.join(timeout=2.0)
        m.proc = None
        if self.interrupted:
            return
        if not m.restart:
            raise FleetFailed(f"{m.name} exited with code {code}", code)
        if m.up_since is not None and now - m.up_since >= STABLE_S:
            m.backoff = 0  # it served a while: this death starts the backoff afresh
        if m.starts >= GIVE_UP and m.up_since is None:
            raise FleetFailed(f"{m.name} exited with code {code}, {m.starts} starts in a row without /health 200", 5)
        wait = BACKOFF_S[min(m.backoff, len(BACKOFF_S) - 1)]
        m.backoff += 1
        m.next_start = now + wait
        m.restarts += 1
        why = " unasked (vLLM's API server exits 0 when its engine core dies)" if code == 0 else ""
        self.say(
            f"{m.name} exited with code {code}{why}; restarting it in {wait:g} s (the router sends its work elsewhere)"
        )

    def _check(self, m: Member, now: float) -> None:
        """An engine's /health: its first 200 puts it (back) in rotation; misses after that count as its death."""
        if m.health_url is None or m.proc is None or now < m.next_check:
            return
        m.next_check = now + HEALTH_EVERY_S
        if healthy(m.health_url):
            if m.up_since is None:
                m.up_since, m.starts = now, 0
                self.say(f"{m.name} is up (/health 200){' again: back in rotation' if m.restarts else ''}")
            m.misses = 0
            return
        if m.up_since is None:
            return  # still starting
        m.misses += 1
        if m.misses >= HEALTH_MISSES:
            self.say(f"{m.name}: /health failed {m.misses} times in a row; ending its processes")
            supervise.kill_group(m.proc.pid, signal.SIGKILL)

    # ------------------------------------------------------------------------------------------ the fleet

    def _on_signal(self) -> None:
        if not self.interrupted:
            self.interrupted.append(time.monotonic())
            for m in self.members:
                if m.proc is not None:
                    supervise.kill_group(m.proc.pid, signal.SIGINT)
        else:
            self._kill_all()

    def _kill_all(self) -> None:
        for m in self.members:
            if m.proc is not None:
                supervise.kill_group(m.proc.pid, signal.SIGKILL)

    def run(self) -> int:
        """Serve until interrupted (130) or failed (``FleetFailed``); nothing of the fleet is left either way."""
        try:
            with supervise.forwarded(self._on_signal):
                for m in self.members:
                    if not m.after_engines:
                        self._start(m)
                while True:
                    now = time.monotonic()
                    if self.interrupted and now - self.interrupted[0] > supervise.GRACE_S:
                        self._kill_all()
                    for m in self.members:
                        if m.proc is not None and m.proc.poll() is not None:
                            self._ended(m, now)
                        elif m.proc is None and not self.interrupted and now >= m.next_start:
                            if not self._waiting(m):
                                self._start(m)
                        else:
                            self._check(m, now)
                    self._ready(now)
                    if self.interrupted and all(m.proc is None for m in self.members):
                        return EXIT_INTERRUPTED
                    time.sleep(TICK_S)
        finally:
            self._end_all()

    def _end_all(self) -> None:
        for m in self.members:
            if m.proc is not None:
                supervise.end_group(m.proc.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    m.proc.wait(timeout=supervise.GONE_S)
                m.proc = None
