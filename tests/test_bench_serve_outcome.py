"""New-user audit 2026-12-06 M3: `qvl bench-serve` exited 0 when every request failed (`vllm bench serve`'s own exit
code ignores failures), and a timed run in which nothing completed was labelled valid. Now its summary decides: one
line, exit 5; a timed run with a failed request is INVALID. The real `vllm bench serve` against a port where nothing
listens (it loads only the tokenizer: no engine)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qwenvl_rbln.serving.bench import Outcome
from qwenvl_rbln.serving.timed_bench import run_valid
from qwenvl_rbln.views.timed_bench import why_invalid
from tests import engine_server as eng
from tests.test_serve_emulate import emulated_artifact


def outcome(*lines: str) -> Outcome:
    seen = Outcome()
    for line in lines:
        seen.see(f"{line}\n".encode())
    return seen


@pytest.mark.parametrize(
    ("ok", "failed", "problem"),
    [(0, 2, "2 of 2 requests failed"), (3, 1, "1 of 4 requests failed"), (0, 0, "no request was sent"), (4, 0, None)],
)
def test_the_summary_decides(ok, failed, problem):
    seen = outcome(f"{'Successful requests:':<40} {ok:<10}", f"{'Failed requests:':<40} {failed:<10}")
    assert seen.problem() == problem
    assert outcome("Successful requests: 0").problem() is None  # no summary (e.g. --help): the exit code decides


def test_a_timed_run_with_a_failed_request_is_invalid():
    assert run_valid({"completed": 5, "failed": 0}, True)
    assert not run_valid({"completed": 0, "failed": 2}, True)
    assert not run_valid({"completed": 4, "failed": 1}, True)
    assert not run_valid({"completed": 5, "failed": 0}, False)
    calls = {"overruns": 0, "calls": 9}
    assert why_invalid({"calls": calls, "completed": 0, "failed": 2}, None) == "2 of 2 requests failed"
    assert why_invalid({"calls": calls, "completed": 5, "failed": 0}, "device") == (
        "the emulator's own work took over 5 % of the run"
    )


def test_every_request_failing_is_exit_5_in_one_line(tmp_path, tiny_model):
    art = emulated_artifact(tmp_path / "art")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):  # a real tokenizer for vLLM
        shutil.copy(Path(tiny_model) / name, art / name)
    cmd = [sys.executable, "-m", "qwenvl_rbln", "bench-serve", str(art), "--emulate", "--port", str(eng.free_port())]
    cmd += ["--num-prompts", "2", "--input-len", "16", "--output-len", "2"]
    done = subprocess.run(cmd, env=eng.engine_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert "Failed requests:                         2" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("qvl: error:")]
    assert done.returncode == 5 and len(errors) == 1, done.stderr[-3000:]
    assert "2 of 2 requests failed" in errors[0] and "fix:" in errors[0]
