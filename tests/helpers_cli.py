"""Run qvl exactly as a user does: through cli.main, capturing stdout, stderr and the exit code."""

from __future__ import annotations

import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A loopback port nobody listens on now: tests that start a server (or `qvl serve`, which refuses a port in use)
    never share a fixed one with a neighbour running at the same time."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def readline_within(stream, seconds: float = 120.0) -> str | bytes:
    """The next line a child writes to ``stream`` (its first: nothing buffered yet), failing the test when none
    comes within ``seconds``: a bound on a loaded machine, so a child that hangs silent never hangs the test."""
    import select

    ready, _, _ = select.select([stream], [], [], seconds)
    assert ready, f"the child wrote no line within {seconds} s"
    return stream.readline()


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


def run_qvl(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300) -> Result:
    """A subprocess, so the error handler in cli.main (one line, exit code) is what gets tested."""
    import os

    full_env = {**os.environ, **(env or {}), "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "qwenvl_rbln", *args],
        cwd=cwd or REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)
