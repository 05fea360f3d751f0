"""`qvl serve --emulate` / `qvl bench-serve --emulate` below the engine (issue 36 item 1): the command and its
environment as data, the refusals, the emulator's rebel additions and shim, the answer header, the supervised child.

The real engine runs in tests/test_engine_serve*.py; these need no vLLM: a fake emulated artifact (the emulator's
graph marker in every graph file), the emulator's own functions, and a stand-in `vllm` that prints, starts a child of
its own and waits for Ctrl-C.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwenvl_rbln.artifacts.emulated import FORMAT
from qwenvl_rbln.artifacts.manifest import write_manifest
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import run_main, write_artifact
from tests.helpers_cli import REPO, free_port, readline_within

SHIM = REPO / "qwenvl_rbln" / "backends" / "emulator" / "shim"


def emulated_artifact(root: Path, emulated: bool = True) -> Path:
    plan = build_plan("cpu-tiny-rbln")
    write_artifact(root, plan)
    manifest = {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "qvl/tiny"}}
    if emulated:
        header = json.dumps({"__metadata__": {"format": FORMAT}}).encode()
        for graph in [*root.glob("*.rbln"), root / "visual" / "compiled_model.rbln"]:
            graph.write_bytes(len(header).to_bytes(8, "little") + header)
    write_manifest(root, {**manifest, "emulated": emulated})
    return root


@pytest.fixture
def art(tmp_path):
    return emulated_artifact(tmp_path / "emu")


@pytest.fixture
def no_exec(monkeypatch):
    monkeypatch.setattr("os.execvpe", lambda *a, **k: pytest.fail("exec attempted"))


def dry(capsys, *argv: str) -> dict:
    code, out, err = run_main([*argv, "--dry-run", "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


# ---------------------------------------------------------------------------------------- the command as data


def test_the_emulated_line_is_serves_line_plus_the_emulators_environment(art, capsys, no_exec, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    data = dry(capsys, "serve", str(art), "--emulate")
    argv, env = data["argv"], data["env"]
    assert argv[:2] == ["vllm", "serve"] and argv[-2:] == [
        "--middleware",
        "qwenvl_rbln.serving.emulated_http.EmulatedHeader",
    ]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert env["PYTHONPATH"] == os.pathsep.join([str(SHIM), "/somewhere/else"])  # the shim first, the rest kept
    assert (SHIM / "rebel" / "__init__.py").is_file()
    assert env["QVL_EMULATE_NPU"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1"
    assert env["QVL_SORT_DECODE"] == "1"  # the tiny preset: flash attention for RBLN-CR13 at batch 2
    checks = {c["check"]: c for c in data["checks"]}
    assert "every graph" in checks["emulated"]["detail"] or "emulated" in checks["emulated"]["detail"]
    assert all(c["ok"] for c in data["checks"] if c["check"] == "emulated")
    bench = dry(capsys, "bench-serve", str(art), "--emulate")
    assert bench["env"]["PYTHONPATH"].startswith(str(SHIM)) and "--middleware" not in bench["argv"]


def test_qvl_emulate_npu_in_the_environment_means_emulate(art, capsys, no_exec, monkeypatch):
    monkeypatch.setenv("QVL_EMULATE_NPU", "1")
    assert dry(capsys, "serve", str(art))["env"]["QVL_EMULATE_NPU"] == "1"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "box.local"])
def test_the_emulated_server_listens_on_loopback_only(host, art, capsys, no_exec):
    for command in ("serve", "bench-serve"):
        code, out, err = run_main([command, str(art), "--emulate", "--host", host, "--dry-run"], capsys)
        assert code == 2 and out == "" and "loopback only" in err and "127.0.0.1" in err, err


def test_emulate_refuses_an_npu_compile_and_serve_refuses_an_emulated_one_naming_emulate(tmp_path, capsys, no_exec):
    real = emulated_artifact(tmp_path / "real", emulated=False)
    code, _, err = run_main(["serve", str(real), "--emulate", "--dry-run"], capsys)
    assert code == 2 and "not a graph of qvl's CPU emulator" in err and "without --emulate" in err
    code, _, err = run_main(["serve", str(emulated_artifact(tmp_path / "emu")), "--dry-run"], capsys)
    assert code == 2 and "emulated: true" in err and "qvl serve --emulate" in err


def test_emulate_on_a_host_with_a_real_rebel_is_refused(art, capsys, no_exec, monkeypatch):
    from qwenvl_rbln.backends import emulator

    monkeypatch.setattr(emulator, "real_rebel_importable", lambda: True)
    code, _, err = run_main(["serve", str(art), "--emulate", "--dry-run"], capsys)
    assert code == 2 and "real rebel-compiler is installed" in err


# ------------------------------------------------------------------------------ the emulator's rebel additions


def test_the_shim_is_the_emulator_in_a_fresh_process_with_what_vllm_rbln_imports(tmp_path):
    script = (
        "import torch, rebel\n"
        "from rebel.core.torch_compile import rbln_backend\n"
        "assert rebel.EMULATED and callable(rebel.manual_seed) and rebel.CompileContext\n"
        "rebel.manual_seed(3)\n"
        "fn = torch.compile(lambda x: torch.ops.rbln.argmax(x), backend=rbln_backend, fullgraph=True, dynamic=False)\n"
        "print(fn(torch.tensor([[0.1, 2.0, 0.3], [5.0, 0.0, 1.0]])).tolist())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SHIM), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[1, 0]"
    other = tmp_path / "site" / "rebel"  # a real rebel-compiler elsewhere on the path
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM), str(REPO), str(tmp_path / "site")])
    done = subprocess.run([sys.executable, "-c", "import rebel"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "a real rebel-compiler is installed" in done.stderr


def test_the_sampler_ops_sample_as_vllm_rblns_sampler_expects():
    import torch

    from qwenvl_rbln.backends.emulator import engine, ops

    ops.register()
    probs = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]])
    assert torch.ops.rbln.argmax(probs).tolist() == [1, 0]
    assert torch.ops.rbln.top_k_top_p(probs, torch.tensor([1, 1]), None).tolist() == [1, 0]  # top-1: greedy
    assert torch.ops.rbln.top_k_top_p(probs, None, torch.tensor([0.5, 0.4])).tolist() == [1, 0]  # nucleus of one
    engine.manual_seed(0)
    drawn = {tuple(torch.ops.rbln.top_k_top_p(probs, torch.tensor([2, 2]), None).tolist()) for _ in range(200)}
    assert drawn <= {(1, 0), (1, 2), (2, 0), (2, 2)} and len(drawn) > 1  # top-2 of each row, nothing else
    engine.manual_seed(7)
    first = torch.ops.rbln.top_k_top_p(probs, None, None).tolist()
    engine.manual_seed(7)
    assert torch.ops.rbln.top_k_top_p(probs, None, None).tolist() == first  # manual_seed reproduces
    warm = torch.full((2, 3), float("nan"))  # the engine's warm-up samples uninitialised logits
    assert torch.ops.rbln.top_k_top_p(warm, None, None).shape == (2,)


# ---------------------------------------------------------------------------------------- every answer says it


def test_every_http_answer_carries_the_emulated_header_streamed_or_not():
    from qwenvl_rbln.serving.emulated_http import HEADER, EmulatedHeader

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
        for chunk in (b"a", b"b"):
            await send({"type": "http.response.body", "body": chunk, "more_body": chunk == b"a"})

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def run(scope):
        await EmulatedHeader(app)(scope, None, send)

    asyncio.run(run({"type": "http", "path": "/v1/models"}))
    start = sent[0]
    assert (
        start["status"] == 401
        and (HEADER, b"emulated NPU: qvl's CPU emulator of rebel, no NPU ran") in start["headers"]
    )
    assert [m["body"] for m in sent[1:]] == [b"a", b"b"]  # the body passes through chunk by chunk
    sent.clear()
    asyncio.run(run({"type": "lifespan"}))
    assert all(HEADER not in dict(m.get("headers", [])) for m in sent)


# --------------------------------------------------------------------------------- the supervised child, Ctrl-C

STAND_IN = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"ready grandchild={{child.pid}}", flush=True)
print("to stderr", file=sys.stderr, flush=True)
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))  # vLLM shuts down on SIGINT; its child is left to the group
time.sleep(600)
"""


def stand_in_vllm(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "vllm"
    path.write_text(f"#!{sys.executable}\n" + STAND_IN.format())
    path.chmod(0o755)


def _state(pid: int) -> str:
    import psutil

    try:
        p = psutil.Process(pid)
        return f"pid {pid} {p.status()} ppid {p.ppid()} pgid {os.getpgid(pid)} cmd {p.cmdline()}"
    except (psutil.Error, OSError) as exc:
        return f"pid {pid}: {exc!r}"


def test_ctrl_c_of_qvl_serve_emulate_ends_vllms_whole_group_and_labels_every_line(art, tmp_path):
    import psutil

    stand_in_vllm(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "qwenvl_rbln", "serve", str(art), "--emulate", "--port", str(free_port())]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = readline_within(proc.stdout)  # the stand-in prints at once
        assert first.startswith("qvl emulated | ready grandchild="), first
        grandchild = int(first.rsplit("=", 1)[1])
        vllm = [p for p in psutil.Process(proc.pid).children() if p.pid != grandchild]
        assert vllm and os.getpgid(vllm[0].pid) == vllm[0].pid != os.getpgid(proc.pid)  # its own group
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    deadline = time.monotonic() + 60
    while psutil.pid_exists(grandchild) and psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"vLLM's child outlived Ctrl-C: {_state(grandchild)}"
        time.sleep(0.05)
    assert "qvl emulated | to stderr" in err and "emulated NPU: stopped" in err and "interrupted" in err
    lines = [line for line in (first + out + err).splitlines() if line.strip()]
    assert lines[-1].startswith("qvl: interrupted")  # the CLI's own last word on any Ctrl-C
    assert all("emulated" in line for line in lines[:-1]), lines


def test_a_failed_emulated_start_is_one_line_naming_the_labelled_output(art, tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "vllm").write_text(
        f"#!{sys.executable}\nimport sys\nprint('bad flag', file=sys.stderr)\nsys.exit(2)\n"
    )
    (tmp_path / "bin" / "vllm").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "qwenvl_rbln", "serve", str(art), "--emulate"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 5 and "qvl emulated | bad flag" in done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("qvl: error:")]
    assert "exited with code 2" in line and "fix:" in line


def test_a_vllm_that_cannot_start_is_one_line_and_a_closed_terminal_is_forwarded(tmp_path):
    """supervise.run: a `vllm` found but not runnable is DependencyMissing (as the exec path says it), never a
    traceback; SIGHUP (the terminal closed) reaches vLLM's group like Ctrl-C, since vLLM runs in its own session."""
    import signal

    from qwenvl_rbln.errors import DependencyMissing
    from qwenvl_rbln.serving import supervise

    broken = tmp_path / "vllm"
    broken.write_text("not a program\n")  # no exec bit
    with pytest.raises(DependencyMissing, match=f"cannot start {broken}"):
        supervise.run([str(broken), "serve"], {}, "qvl emulated | ")
    seen: list[str] = []
    with supervise._forwarded(lambda: seen.append("forwarded")):
        signal.raise_signal(signal.SIGHUP)
    assert seen == ["forwarded"]
