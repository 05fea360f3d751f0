"""Who may call the server: off loopback `qvl serve` needs an API key (or an explicit --no-auth that says what it
exposes). The key reaches vLLM as $VLLM_API_KEY in its environment, never in argv (a process list shows argv), and
--dry-run / --json never print it; `qvl bench-serve` sends it ($OPENAI_API_KEY, vLLM's benchmark's Bearer token)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qwenvl_rbln.artifacts.manifest import write_manifest
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import run_main, write_artifact
from tests.helpers_cli import free_port, run_qvl
from tests.stand_in_vllm import RECORD_ENV, install_stand_in, read_record

KEY = "sk-qvl-test-7f3a9c"


@pytest.fixture
def art(tmp_path) -> Path:
    plan = build_plan("rebel100-1npu")
    root = write_artifact(tmp_path / "art", plan)
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "m/m"}})
    return root


@pytest.fixture
def no_exec(monkeypatch):
    monkeypatch.setattr("os.execvpe", lambda *a, **k: pytest.fail("exec attempted"))


@pytest.fixture
def key_file(tmp_path) -> Path:
    path = tmp_path / "key.txt"
    path.write_text(KEY + "\n")
    return path


def stand_in_env(tmp_path: Path, **extra: str) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    install_stand_in(bin_dir)
    record = tmp_path / "record.json"
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    env.update({"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", RECORD_ENV: str(record), **extra})
    return env, record


def test_every_interface_without_a_key_is_refused(art, capsys, monkeypatch, no_exec):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    for args in (["--host", "0.0.0.0"], ["--host", "0.0.0.0", "--dry-run", "--json"], ["--host", "10.1.2.3"]):
        code, out, err = run_main(["serve", str(art), *args], capsys)
        assert code == 2, err
        line = err.strip().splitlines()[-1]
        assert line.startswith("qvl: error: --host") and "no API key" in line and "Traceback" not in err
        assert "VLLM_API_KEY" in line and "--api-key-file" in line and "--no-auth" in line


def test_loopback_needs_no_key(art, capsys, monkeypatch, no_exec):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    for host in ("127.0.0.1", "localhost", "::1"):
        code, out, err = run_main(["serve", str(art), "--host", host, "--dry-run", "--json"], capsys)
        assert code == 0, err
        (auth,) = [c for c in json.loads(out)["checks"] if c["check"] == "auth"]
        assert auth["ok"] and "loopback" in auth["detail"]


def test_no_auth_serves_every_interface_and_says_what_it_exposes(art, capsys, monkeypatch, no_exec):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    code, out, err = run_main(["serve", str(art), "--host", "0.0.0.0", "--no-auth", "--dry-run", "--json"], capsys)
    assert code == 0, err
    (auth,) = [c for c in json.loads(out)["checks"] if c["check"] == "auth"]
    assert auth["warning"] and not auth["ok"] and "0.0.0.0:8000" in auth["detail"] and "without a key" in auth["detail"]
    assert "warning: --no-auth" in err and "/v1/chat/completions" in err


@pytest.mark.parametrize("source", ["file", "environment"])
def test_the_key_reaches_vllm_in_its_environment_never_in_argv(source, art, key_file, tmp_path):
    extra = {"VLLM_API_KEY": KEY} if source == "environment" else {}
    env, record = stand_in_env(tmp_path, **extra)
    flags = ["--api-key-file", str(key_file)] if source == "file" else []
    args = ["serve", str(art), "--host", "0.0.0.0", "--port", str(free_port()), *flags]
    for shown in (run_qvl(*args, "--dry-run", "--json", env=env), run_qvl(*args, "--dry-run", env=env)):
        assert shown.exit_code == 0, shown.stderr
        assert KEY not in shown.stdout + shown.stderr  # --dry-run and --json never print it
    data = json.loads(run_qvl(*args, "--dry-run", "--json", env=env).stdout)
    assert data["env"]["VLLM_API_KEY"] == "<redacted>"
    (auth,) = [c for c in data["checks"] if c["check"] == "auth"]
    assert auth["ok"] and ("--api-key-file" if source == "file" else "$VLLM_API_KEY") in auth["detail"]
    ran = run_qvl(*args, env=env)
    assert ran.exit_code == 0, ran.stderr
    assert KEY not in ran.stdout + ran.stderr  # nor the "exec" line
    rec = read_record(record)
    assert rec["env"]["VLLM_API_KEY"] == KEY
    assert not any(KEY in word for word in rec["argv"]) and "--api-key" not in rec["argv"]


def test_a_key_in_vllms_argv_is_refused(art, capsys, no_exec):
    code, _, err = run_main(["serve", str(art), "--dry-run", "--", "--api-key", KEY], capsys)
    assert code == 2 and "process list" in err and KEY not in err


@pytest.mark.parametrize(("content", "needle"), [("", "empty"), ("two words\n", "not one word")])
def test_a_bad_key_file_is_one_line(content, needle, art, tmp_path, capsys, no_exec):
    path = tmp_path / "bad.txt"
    path.write_text(content)
    code, _, err = run_main(["serve", str(art), "--api-key-file", str(path), "--dry-run"], capsys)
    assert code == 2 and needle in err and str(path) in err
    code, _, err = run_main(["serve", str(art), "--api-key-file", str(tmp_path / "none.txt"), "--dry-run"], capsys)
    assert code == 2 and "cannot read it" in err


def test_bench_serve_sends_the_key(art, key_file, tmp_path):
    env, record = stand_in_env(tmp_path)
    shown = run_qvl("bench-serve", str(art), "--api-key-file", str(key_file), "--dry-run", "--json", env=env)
    assert shown.exit_code == 0, shown.stderr
    assert KEY not in shown.stdout + shown.stderr
    assert json.loads(shown.stdout)["env"] == {"OPENAI_API_KEY": "<redacted>"}
    for extra, flags in (({}, ["--api-key-file", str(key_file)]), ({"VLLM_API_KEY": KEY}, [])):
        env, record = stand_in_env(tmp_path, **extra)
        ran = run_qvl("bench-serve", str(art), *flags, env=env)
        assert ran.exit_code == 0, ran.stderr
        rec = read_record(record)
        assert rec["env"]["OPENAI_API_KEY"] == KEY and not any(KEY in word for word in rec["argv"])
