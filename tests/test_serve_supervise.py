"""serving/supervise.py, the parent of `qvl serve --emulate`'s vLLM and of every process of a fleet: exit codes and
what is left when vLLM ends (mutants SU01, SU04, SU06 of audit 2026-12-04b). Stand-ins, no vLLM."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil

from qwenvl_rbln.errors import EXIT_INTERRUPTED
from qwenvl_rbln.serving import supervise

LABEL = "qvl emulated | "


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_file(path: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not (path.is_file() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} not written within {timeout} s"
        time.sleep(0.05)
    return path.read_text().strip()


def test_a_vllm_killed_by_a_signal_reports_128_plus_the_signal():
    """SU01: the OOM killer's SIGKILL is 137, as a shell reports it."""
    code = supervise.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], {}, LABEL)
    assert code == 128 + signal.SIGKILL == 137
    assert supervise.exit_code(-signal.SIGTERM) == 143 and supervise.exit_code(3) == 3


def test_when_vllm_exits_by_itself_the_rest_of_its_group_is_killed(tmp_path):
    """SU04: vLLM's main process crashes while its engine core (same group) still runs: no orphan is left."""
    pid_file = tmp_path / "core.pid"
    script = (
        "import subprocess, sys\n"
        "core = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(core.pid))\n"
        "sys.exit(3)\n"
    )
    t0 = time.monotonic()
    code = supervise.run([sys.executable, "-c", script], dict(os.environ), LABEL)
    core = int(wait_file(pid_file, 1))
    assert code == 3
    assert gone(core), "the engine core outlived vLLM's main process"
    assert time.monotonic() - t0 < supervise.GONE_S  # killed, not waited out


def test_an_interrupted_run_returns_130_whatever_vllm_exits_with(tmp_path):
    """SU06: vLLM handles Ctrl-C and exits 0: qvl still says it was interrupted (130)."""
    ready = tmp_path / "ready"
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *_: sys.exit(0))\n"
        f"open({str(ready)!r}, 'w').write('1')\n"
        "time.sleep(600)\n"
    )

    def interrupt() -> None:
        wait_file(ready)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C of qvl; the handler forwards it to vLLM's group

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    assert supervise.run([sys.executable, "-c", script], dict(os.environ), LABEL) == EXIT_INTERRUPTED
    thread.join(timeout=10)
