"""scripts/demo.sh (``make demo``): its step headings are bold only on a terminal, and never with NO_COLOR, so a
log file of the demo holds no raw escape codes. ``qvl`` is a stand-in here: the script's own lines are tested."""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "scripts" / "demo.sh"


@pytest.fixture
def demo(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """The demo script in a scratch checkout, with a ``qvl`` that only says it ran (and prints a ViT: line)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(DEMO, tmp_path / "scripts" / "demo.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "qvl"
    fake.write_text('#!/bin/sh\necho "ViT: qvl $1"\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return ["bash", str(tmp_path / "scripts" / "demo.sh")], env


BOUND_S = 300.0  # the script's run on a loaded machine: a bound, so a hung script fails instead of hanging


def _on_a_terminal(argv: list[str], env: dict[str, str]) -> str:
    """Run with stdout on a pseudo-terminal; everything it printed."""
    import select
    import time

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=slave, stderr=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + BOUND_S
    try:
        while select.select([master], [], [], max(0.0, deadline - time.monotonic()))[0]:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the script has exited and closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    return b"".join(chunks).decode()


def test_demo_headings_are_plain_text_in_a_file_and_bold_on_a_terminal(demo):
    argv, env = demo
    logged = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=BOUND_S).stdout
    assert "== qvl tiny-model" in logged and "\x1b" not in logged

    shown = _on_a_terminal(argv, env)
    assert "\x1b[1m== qvl tiny-model" in shown

    plain = _on_a_terminal(argv, {**env, "NO_COLOR": "1"})
    assert "== qvl tiny-model" in plain and "\x1b" not in plain
