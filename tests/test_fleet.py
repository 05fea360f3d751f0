"""`qvl serve --workers/--devices` below the engine: the fleet as data (one preflight, one line per replica, the
router's line, who may call), and vllm-router's own behaviour with keys over real HTTP (the real router, stand-in
engines). The real engines run in tests/test_engine_fleet.py."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.fakes_rbln import run_main
from tests.test_serve_emulate import emulated_artifact


@pytest.fixture
def art(tmp_path):
    return emulated_artifact(tmp_path / "emu")


@pytest.fixture
def npu_art(tmp_path):
    return emulated_artifact(tmp_path / "npu", emulated=False)


@pytest.fixture(autouse=True)
def no_exec(monkeypatch):
    monkeypatch.setattr("os.execvpe", lambda *a, **k: pytest.fail("exec attempted"))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)


def dry(capsys, *argv: str) -> dict:
    code, out, err = run_main([*argv, "--dry-run", "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


def refused(capsys, *argv: str) -> str:
    code, out, err = run_main([*argv, "--dry-run"], capsys)
    assert code == 2 and out == "", (code, out, err)
    assert err.count("qvl: error:") == 1 and "Traceback" not in err
    return err


def test_a_fleet_is_one_engine_per_npu_on_loopback_behind_the_router(art, capsys, monkeypatch):
    from qwenvl_rbln.serving import command

    calls = []
    real = command.preflight
    monkeypatch.setattr(command, "preflight", lambda *a, **k: calls.append(a) or real(*a, **k))
    data = dry(capsys, "serve", str(art), "--emulate", "--devices", "1,3", "--port", "9000")
    assert len(calls) == 1  # the artifact is checked once for every replica
    names = [p["name"] for p in data["processes"]]
    assert names == ["engine-0", "engine-1", "router"]
    engines = data["processes"][:2]
    for proc, npu, port in zip(engines, ("1", "3"), (9001, 9002), strict=True):
        argv = proc["argv"]
        assert argv[:3] == ["vllm", "serve", str(art)]
        assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == str(port)
        assert proc["env"]["RBLN_DEVICES"] == npu  # the generation's device variable: this replica's NPU
        assert json.loads(argv[argv.index("--additional-config") + 1]) == {
            "rbln_config": {"device": 0, "visual": {"device": 0}}  # positions inside its own list
        }
        assert proc["env"]["QVL_EMULATE_NPU"] == "1" and "--middleware" in argv
    a, b = (p["argv"] for p in engines)
    assert [w for w in a if w != "9001"] == [w for w in b if w != "9002"]  # the same line but the port
    router = data["processes"][2]["argv"]
    assert router[:5] == ["vllm-router", "--host", "127.0.0.1", "--port", "9000"]
    assert router[router.index("--worker-urls") + 1 : router.index("--worker-urls") + 3] == [
        "http://127.0.0.1:9001",
        "http://127.0.0.1:9002",
    ]
    assert router[router.index("--policy") + 1] == "power_of_two"
    assert data["capacity"] == 4 and [e["npus"] for e in data["engines"]] == [[1], [3]]
    workers = dry(capsys, "serve", str(art), "--emulate", "--workers", "2", "--port", "9000")
    assert [e["npus"] for e in workers["engines"]] == [[0], [1]]
    one = dry(capsys, "serve", str(art), "--emulate", "--workers", "1")
    assert one["argv"][:2] == ["vllm", "serve"] and "processes" not in one  # one replica: today's engine


def test_the_human_dry_run_is_one_script_of_every_process(art, capsys):
    code, out, err = run_main(["serve", str(art), "--emulate", "--workers", "2", "--dry-run"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert sum(1 for ln in lines if ln.startswith("env ") and " vllm serve " in ln and ln.endswith(" &")) == 2
    assert lines[-1].startswith("env vllm-router --host 127.0.0.1")
    assert any(ln.startswith("# ok   fleet: 2 engines") for ln in lines)


def test_router_flags_pass_through_and_the_ones_qvl_sets_are_refused(art, capsys):
    data = dry(capsys, "serve", str(art), "--emulate", "--workers", "2", "--router-args", "--policy round_robin")
    router = data["processes"][-1]["argv"]
    assert router.count("--policy") == 1 and router[router.index("--policy") + 1] == "round_robin"
    for flag in ("--port 1", "--worker-urls http://x", "--api-key k", "--host 0.0.0.0"):
        err = refused(capsys, "serve", str(art), "--emulate", "--workers", "2", "--router-args", flag)
        assert "is set by qvl" in err and "fix:" in err
    err = refused(capsys, "serve", str(art), "--emulate", "--router-args", "--policy random")
    assert "needs a fleet" in err


def test_devices_and_workers_must_agree_and_device_places_one_engine(art, capsys):
    assert "disagree" in refused(capsys, "serve", str(art), "--emulate", "--workers", "3", "--devices", "0,1")
    assert "place one engine" in refused(capsys, "serve", str(art), "--emulate", "--workers", "2", "--device", "1")
    assert "twice" in refused(capsys, "serve", str(art), "--emulate", "--devices", "0,0")


def test_off_loopback_the_key_is_required_and_checked_at_qvls_front_door(npu_art, capsys, tmp_path, monkeypatch):
    err = refused(capsys, "serve", str(npu_art), "--host", "0.0.0.0", "--workers", "2")
    assert "no API key is set" in err
    key = tmp_path / "key"
    key.write_text("s3cret-key\n")
    code, out, err = run_main(
        [
            "serve",
            str(npu_art),
            "--host",
            "0.0.0.0",
            "--workers",
            "2",
            "--api-key-file",
            str(key),
            "--dry-run",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    assert "s3cret-key" not in out + err  # never shown
    data = json.loads(out)
    procs = {p["name"]: p for p in data["processes"]}
    door, router = procs["front-door"]["argv"], procs["router"]["argv"]
    assert door[-3:-1] == ["0.0.0.0", "8000"] and router[router.index("--host") + 1] == "127.0.0.1"
    assert door[-1] == f"http://127.0.0.1:{router[router.index('--port') + 1]}"
    assert procs["engine-0"]["env"]["VLLM_API_KEY"] == "<redacted>"  # the engines require it too
    auth = [c for c in data["checks"] if c["check"] == "auth"][0]["detail"]
    assert "/add_worker" in auth and "front door" in auth
    code, out, err = run_main(
        ["serve", str(npu_art), "--host", "0.0.0.0", "--workers", "2", "--no-auth", "--dry-run"], capsys
    )
    assert code == 0 and "# warn auth: --no-auth" in out and "/add_worker" in out


# -------------------------------------------------------------------- vllm-router and keys, over real HTTP


class _Engine(BaseHTTPRequestHandler):
    """A stand-in engine: answers everything with the path and the Authorization it received."""

    def log_message(self, *args) -> None:
        pass

    def _answer(self) -> None:
        if self.command == "POST":
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"path": self.path, "auth": self.headers.get("Authorization")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer


def call(url: str, key: str | None = None, method: str = "GET", body: dict | None = None) -> tuple[int, str]:
    head = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=head, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:  # not listening yet
        return 0, ""


def test_vllm_router_checks_no_client_key_and_qvls_front_door_does(tmp_path):
    """The facts front_door.py rests on, with the real vllm-router 0.1.17: given --api-key, it still passes a
    request without a key or with a wrong one to an engine (the client's header as it came), and answers its own
    routes to anyone. qvl's guard in front refuses both."""
    from tests import engine_server as eng

    engine = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    port, door_port, metrics = eng.free_port(), eng.free_port(), eng.free_port()
    router_bin = Path(sys.executable).parent / "vllm-router"
    assert router_bin.is_file(), "vllm-router is part of make install: the fleet tests never skip"
    cmd = [str(router_bin), "--host", "127.0.0.1", "--port", str(port), "--worker-urls"]
    cmd += [f"http://127.0.0.1:{engine.server_port}", "--api-key", "router-key", "--policy", "round_robin"]
    cmd += ["--prometheus-port", str(metrics), "--worker-startup-check-interval", "1"]
    cmd += ["--health-check-interval-secs", "1", "--health-failure-threshold", "1"]
    router = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    door_env = {"QVL_FRONT_DOOR_KEY": "door-key", "PATH": str(Path(sys.executable).parent)}
    door_cmd = [sys.executable, "-m", "qwenvl_rbln.serving.front_door", "127.0.0.1", str(door_port)]
    door = subprocess.Popen(
        [*door_cmd, f"http://127.0.0.1:{port}"],
        env={**door_env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        from tests.test_engine_fleet import wait_for

        wait_for(lambda: call(f"http://127.0.0.1:{port}/health")[0] == 200, 60, "the router")
        wait_for(lambda: call(f"http://127.0.0.1:{door_port}/health")[0] == 200, 60, "the front door")
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        base = f"http://127.0.0.1:{port}"
        for key in (None, "wrong"):
            status, text = call(base + "/v1/chat/completions", key, "POST", chat)
            assert status == 200 and json.loads(text)["auth"] == (f"Bearer {key}" if key else None)
        assert call(base + "/list_workers")[0] == 200  # its own routes: anyone's
        front = f"http://127.0.0.1:{door_port}"
        assert call(front + "/v1/chat/completions", None, "POST", chat)[0] == 401
        assert call(front + "/v1/chat/completions", "wrong", "POST", chat)[0] == 401
        status, text = call(front + "/v1/chat/completions", "door-key", "POST", chat)
        assert status == 200 and json.loads(text)["path"] == "/v1/chat/completions"
        assert json.loads(text)["auth"] == "Bearer door-key"  # passed on: engines with the key accept it
        assert call(front + "/list_workers")[0] == 401 and call(front + "/health")[0] == 200
        assert call(front + "/add_worker?url=http://127.0.0.1:9", "door-key", "POST")[0] == 403
        engine.shutdown()  # every engine down: the router answers 503 at once, and so does the front door
        engine.server_close()
        wait_for(lambda: call(base + "/health")[0] == 503, 60, "the router's health check")
        status, text = call(front + "/v1/chat/completions", "door-key", "POST", chat)
        assert status == 503 and "No available workers" in text, (status, text)
        assert call(front + "/readiness")[0] == 503
    finally:
        for proc in (router, door):
            proc.terminate()
            proc.wait(timeout=30)
        engine.shutdown()


def test_a_port_the_fleet_needs_in_use_is_one_line_before_anything_starts(art, capsys):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        busy = sock.getsockname()[1]
        code, out, err = run_main(["serve", str(art), "--emulate", "--workers", "2", "--port", str(busy - 1)], capsys)
    assert code == 2 and f"port {busy} on 127.0.0.1 is in use" in err and "nothing was started" in err, err
