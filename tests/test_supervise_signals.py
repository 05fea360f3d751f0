"""Ctrl-C of `qvl serve --emulate` (serving/supervise.py) as vLLM sees it (audit 2026-12-06, mutants V02, V04, V08):
the first Ctrl-C reaches vLLM's group as SIGINT (vLLM's own shutdown), a vLLM that ignores it is killed after
``GRACE_S``, and a second Ctrl-C kills at once. The stand-in vLLM records each SIGINT it gets in a file, so a
forwarded SIGINT is told apart from the final SIGKILL (which no process can record); each stand-in ends by itself
after ``LIFE_S``, so a supervisor that forgets a signal makes the test slow and red, never hung. No vLLM."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from qwenvl_rbln.errors import EXIT_INTERRUPTED
from qwenvl_rbln.serving import supervise
from tests.test_serve_supervise import LABEL, gone, wait_file

LIFE_S = 30  # the stand-in's own end, far above what each test allows


def _vllm(log, *, exits_on_sigint: bool) -> list[str]:
    """A stand-in vLLM: writes its pid, then appends 'SIGINT' to ``log`` for every SIGINT (and exits 0 on the
    first when ``exits_on_sigint``); otherwise sleeps ``LIFE_S`` and exits 0."""
    on_int = "sys.exit(0)" if exits_on_sigint else "None"
    script = (
        "import os, signal, sys, time\n"
        f"def on_int(*_):\n"
        f"    with open({str(log)!r}, 'a') as f: f.write('SIGINT\\n')\n"
        f"    {on_int}\n"
        "signal.signal(signal.SIGINT, on_int)\n"
        f"open({str(log) + '.pid'!r}, 'w').write(str(os.getpid()))\n"
        f"time.sleep({LIFE_S})\n"
    )
    return [sys.executable, "-c", script]


def _ctrl_c(log, times: int) -> threading.Thread:
    """Ctrl-C of qvl once the stand-in runs, ``times`` times (each after the stand-in recorded the one before)."""

    def press() -> None:
        wait_file(log.with_name(log.name + ".pid"))
        for n in range(times):
            os.kill(os.getpid(), signal.SIGINT)  # qvl's handler forwards it to vLLM's group
            if n + 1 < times:
                deadline = time.monotonic() + 30
                while not (log.is_file() and log.read_text().count("SIGINT") > n) and time.monotonic() < deadline:
                    time.sleep(0.02)

    thread = threading.Thread(target=press, daemon=True)
    thread.start()
    return thread


def test_ctrl_c_reaches_vllm_as_sigint_and_vllms_own_shutdown_ends_the_run(tmp_path):
    """V02: vLLM gets the SIGINT (it records it and exits 0), well before the grace period's SIGKILL."""
    log = tmp_path / "signals"
    t0 = time.monotonic()
    thread = _ctrl_c(log, 1)
    assert supervise.run(_vllm(log, exits_on_sigint=True), dict(os.environ), LABEL) == EXIT_INTERRUPTED
    assert time.monotonic() - t0 < supervise.GRACE_S / 2
    assert log.read_text() == "SIGINT\n"
    thread.join(timeout=10)


def test_a_vllm_that_ignores_sigint_is_killed_after_the_grace_period(tmp_path, monkeypatch):
    """V04: SIGINT recorded and ignored: the SIGKILL after ``GRACE_S`` ends it (130, within seconds, not LIFE_S)."""
    monkeypatch.setattr(supervise, "GRACE_S", 1.0)
    log = tmp_path / "signals"
    t0 = time.monotonic()
    thread = _ctrl_c(log, 1)
    assert supervise.run(_vllm(log, exits_on_sigint=False), dict(os.environ), LABEL) == EXIT_INTERRUPTED
    assert time.monotonic() - t0 < LIFE_S / 2
    assert log.read_text() == "SIGINT\n" and gone(int(wait_file(log.with_name("signals.pid"))))
    thread.join(timeout=10)


def test_a_second_ctrl_c_kills_the_group_at_once(tmp_path, monkeypatch):
    """V08: with a grace period longer than the stand-in's life, only the second Ctrl-C's SIGKILL ends it early;
    the stand-in saw exactly one SIGINT (the second Ctrl-C is not forwarded as another)."""
    monkeypatch.setattr(supervise, "GRACE_S", 600.0)
    log = tmp_path / "signals"
    t0 = time.monotonic()
    thread = _ctrl_c(log, 2)
    assert supervise.run(_vllm(log, exits_on_sigint=False), dict(os.environ), LABEL) == EXIT_INTERRUPTED
    assert time.monotonic() - t0 < LIFE_S / 2
    assert log.read_text() == "SIGINT\n"
    thread.join(timeout=10)
