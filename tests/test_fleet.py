"""`qvl serve --workers/--devices` below the engine: the fleet as data (one preflight, one line per replica, the
router's line, who may call), and vllm-router's own behaviour with keys over real HTTP (the real router, stand-in
engines). The real engines run in tests/test_engine_fleet.py."""

from __future__ import annotations

import json
import os
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
    # the ports: engines 9001-9002, the router's metrics 9003 (no front door on loopback without a key)
    assert router[router.index("--prometheus-port") + 1] == "9003"
    assert data["router"] == {"url": "http://127.0.0.1:9000", "metrics": "http://127.0.0.1:9003/metrics"}
    assert "--disable-access-log-for-endpoints" in a and a[a.index("--disable-access-log-for-endpoints") + 1] == (
        "/health,/get_load"  # the router's probes, every 1-2 s, out of each engine's access log
    )
    metrics = [c for c in data["checks"] if c["check"] == "metrics"][0]["detail"]
    assert "http://127.0.0.1:9003/metrics" in metrics and "http://127.0.0.1:9002/metrics" in metrics
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
    wait = lines.index("# router") - 1  # as qvl runs it: the router once every engine answers /health
    assert lines[wait].startswith("for u in http://127.0.0.1:") and lines[wait].count("/health") == 2
    assert subprocess.run(["bash", "-n"], input=out, text=True).returncode == 0  # the script parses


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
    assert door[3:5] == ["0.0.0.0", "8000"] and router[router.index("--host") + 1] == "127.0.0.1"
    # the port layout: engines 8001-8002, the router's metrics 8003, the router behind the door 8004, all apart
    assert router[router.index("--port") + 1] == "8004" and router[router.index("--prometheus-port") + 1] == "8003"
    assert [e["port"] for e in data["engines"]] == [8001, 8002]
    assert door[5:] == [
        "http://127.0.0.1:8004",
        "http://127.0.0.1:8003",
        "http://127.0.0.1:8001",
        "http://127.0.0.1:8002",
    ]
    assert procs["engine-0"]["env"]["VLLM_API_KEY"] == "<redacted>"  # the engines require it too
    front = [c for c in data["checks"] if c["check"] == "front-door"][0]["detail"]
    assert "/add_worker" in front and "front door" in front and "/tokenize" not in front
    code, out, err = run_main(
        ["serve", str(npu_art), "--host", "0.0.0.0", "--workers", "2", "--no-auth", "--dry-run"], capsys
    )
    assert code == 0 and "# warn auth: --no-auth" in out and "QVL_FRONT_DOOR_OPEN=1" in out


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


def router_against(engines: list[ThreadingHTTPServer], *flags: str) -> tuple[subprocess.Popen, int, int]:
    """The real vllm-router in front of stand-in engines: (process, its port, its metrics port)."""
    from tests import engine_server as eng

    port, metrics = eng.free_port(), eng.free_port()
    router_bin = Path(sys.executable).parent / "vllm-router"
    assert router_bin.is_file(), "vllm-router is part of make install: the fleet tests never skip"
    cmd = [str(router_bin), "--host", "127.0.0.1", "--port", str(port), "--worker-urls"]
    cmd += [f"http://127.0.0.1:{e.server_port}" for e in engines]
    cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics), *flags]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port, metrics


def stand_in() -> ThreadingHTTPServer:
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    return engine


def test_vllm_router_checks_no_client_key_and_qvls_front_door_does(tmp_path):
    """The facts front_door.py rests on, with the real vllm-router 0.1.17: given --api-key, it still passes a
    request without a key or with a wrong one to an engine (the client's header as it came), answers its own routes
    to anyone, and sends every route but the ones it balances without the client's key or query string. qvl's
    guard in front refuses what needs a key, and sends those routes straight to an engine."""
    from qwenvl_rbln.serving import front_door
    from tests import engine_server as eng
    from tests.test_engine_fleet import wait_for

    engine = stand_in()
    fast = ("--worker-startup-check-interval", "1", "--health-check-interval-secs", "1")
    router, port, metrics = router_against([engine], "--api-key", "router-key", "--policy", "round_robin", *fast)
    door_port = eng.free_port()
    door_env = {"QVL_FRONT_DOOR_KEY": "door-key", "PATH": str(Path(sys.executable).parent)}
    door_cmd = [sys.executable, "-m", "qwenvl_rbln.serving.front_door", "127.0.0.1", str(door_port)]
    ups = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics}", f"http://127.0.0.1:{engine.server_port}"]
    door = subprocess.Popen(
        [*door_cmd, *ups],
        env={**door_env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: call(f"http://127.0.0.1:{port}/health")[0] == 200, 60, "the router")
        wait_for(lambda: call(f"http://127.0.0.1:{door_port}/health")[0] == 200, 60, "the front door")
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi", "input": "hi"}
        base = f"http://127.0.0.1:{port}"
        for key in (None, "wrong"):
            status, text = call(base + "/v1/chat/completions", key, "POST", chat)
            assert status == 200 and json.loads(text)["auth"] == (f"Bearer {key}" if key else None)
        assert call(base + "/list_workers")[0] == 200  # its own routes: anyone's
        # what the router passes the client's key on for (front_door.ROUTED) and what it does not
        for path in sorted(front_door.ROUTED - {"/health", "/readiness", "/liveness"}):
            method = "GET" if path == "/v1/models" else "POST"
            status, text = call(base + path, "client", method, None if method == "GET" else chat)
            assert status == 200 and json.loads(text)["auth"] == "Bearer client", (path, text)
        for path in ("/tokenize", "/detokenize", "/invocations", "/v1/responses"):
            status, text = call(base + path + "?q=1", "client", "POST", chat)
            assert json.loads(text) == {"path": path, "auth": "Bearer router-key"}  # not the client's: M1
        front = f"http://127.0.0.1:{door_port}"
        assert call(front + "/v1/chat/completions", None, "POST", chat)[0] == 401
        assert call(front + "/v1/chat/completions", "wrong", "POST", chat)[0] == 401
        status, text = call(front + "/v1/chat/completions", "door-key", "POST", chat)
        assert status == 200 and json.loads(text)["path"] == "/v1/chat/completions"
        assert json.loads(text)["auth"] == "Bearer door-key"  # passed on: engines with the key accept it
        for path in ("/tokenize?q=1", "/detokenize", "/invocations"):  # straight to an engine, key and query kept
            assert call(front + path, None, "POST", chat)[0] == 401
            status, text = call(front + path, "door-key", "POST", chat)
            assert status == 200 and json.loads(text) == {"path": path, "auth": "Bearer door-key"}, text
        lower = urllib.request.Request(front + "/v1/models", headers={"Authorization": "bearer door-key"})
        with urllib.request.urlopen(lower, timeout=30) as resp:  # the scheme in any case, as vLLM and the engines
            assert resp.status == 200
        bare = urllib.request.Request(front + "/v1/models", headers={"Authorization": "door-key"})
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(bare, timeout=30)
        status, text = call(front + "/metrics")  # the router's own metrics, not a random engine's
        assert status == 200 and "vllm_router_worker_health" in text, text
        assert call(front + "/load") == (200, '{"server_load": 0}')
        assert call(front + "/list_workers", "door-key")[0] == 403 and call(front + "/health")[0] == 200
        assert call(front + "/add_worker?url=http://127.0.0.1:9", "door-key", "POST")[0] == 403
        engine.shutdown()  # every engine down: after its retries the router answers 503, and so does the door
        engine.server_close()
        wait_for(lambda: call(base + "/health")[0] == 503, 60, "the router's health check")
        status, text = call(front + "/v1/chat/completions", "door-key", "POST", chat)
        assert status == 503 and "No available workers" in text, (status, text)
        assert call(front + "/readiness")[0] == 503
        assert call(front + "/tokenize", "door-key", "POST", chat)[0] == 502  # no engine to send it to
    finally:
        for proc in (router, door):
            proc.terminate()
            proc.wait(timeout=30)
        engine.shutdown()


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_replica_count_starts_behind_the_real_router_with_the_policy_qvl_gives_it(n, art, capsys):
    """vllm-router refuses power_of_two with one worker: qvl's own argv for 1..4 replicas (the emulated host's four
    NPUs), run against stand-in engines, must start and serve."""
    from tests.test_engine_fleet import wait_for

    flags = ("--devices", "2") if n == 1 else ("--workers", str(n))
    data = dry(capsys, "serve", str(art), "--emulate", *flags, "--port", "9000")
    argv = data["processes"][-1]["argv"]
    assert [p["name"] for p in data["processes"]] == [*(f"engine-{i}" for i in range(n)), "router"]
    assert argv[argv.index("--policy") + 1] == ("round_robin" if n == 1 else "power_of_two")
    engines = [stand_in() for _ in range(n)]
    router, port, _ = router_against(engines, *argv[argv.index("--policy") :])  # qvl's flags, the ports apart
    ready = f"http://127.0.0.1:{port}/readiness"
    try:
        wait_for(lambda: call(ready)[0] == 200 or router.poll() is not None, 60, f"{n} replica(s)")
        assert router.poll() is None, f"vllm-router refused qvl's line for {n} replica(s)"
        wait_for(lambda: json.loads(call(ready)[1]).get("healthy_workers") == n, 60, f"{n} healthy")
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert call(f"http://127.0.0.1:{port}/v1/chat/completions", None, "POST", chat)[0] == 200
    finally:
        router.terminate()
        router.wait(timeout=30)
        for e in engines:
            e.shutdown()
            e.server_close()


def test_a_port_the_fleet_needs_in_use_is_one_line_before_anything_starts(art, capsys):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        busy = sock.getsockname()[1]
        code, out, err = run_main(["serve", str(art), "--emulate", "--workers", "2", "--port", str(busy - 1)], capsys)
    assert code == 2 and f"port {busy} on 127.0.0.1 is in use" in err and "nothing was started" in err, err


def test_bad_replica_counts_and_npus_the_host_lacks_are_one_line(art, capsys, monkeypatch):
    for n in ("0", "-1"):  # never read as one engine
        assert f"--workers {n} must be at least 1" in refused(capsys, "serve", str(art), "--emulate", "--workers", n)
    err = refused(capsys, "serve", str(art), "--emulate", "--devices", "0,7")  # the emulated host: 4 NPUs
    assert "this host has 4 NPUs (NPUs 0-3); NPU 7 is not one of them" in err
    monkeypatch.setenv("QVL_EMULATOR_DEVICES", "2")
    err = refused(capsys, "serve", str(art), "--emulate", "--workers", "3")
    assert "--workers 3 (3 NPUs from 0 up): this host has 2 NPUs (NPUs 0-1); NPU 2 is not one of them" in err
    assert dry(capsys, "serve", str(art), "--emulate", "--devices", "1")["engines"][0]["npus"] == [1]
    err = refused(capsys, "serve", str(art), "--emulate", "--devices", "1", "--router-args", "--policy power_of_two")
    assert "needs at least two engines" in err


def test_the_port_layout_stays_within_65535_and_a_key_puts_the_front_door_on_loopback_too(art, capsys, monkeypatch):
    # engines 65534-65535 and the metrics port 65536: refused
    assert "up to 65535" in refused(capsys, "serve", str(art), "--emulate", "--workers", "2", "--port", "65533")
    data = dry(capsys, "serve", str(art), "--emulate", "--workers", "2", "--port", "65532")  # metrics on 65535
    assert data["router"]["metrics"] == "http://127.0.0.1:65535/metrics" and "front-door" not in str(data)
    monkeypatch.setenv("VLLM_API_KEY", "k3y")
    err = refused(capsys, "serve", str(art), "--emulate", "--workers", "2", "--port", "65532")
    assert "the router behind the front door" in err  # with a key the router takes 65536
    data = dry(capsys, "serve", str(art), "--emulate", "--devices", "1", "--port", "9000")
    procs = {p["name"]: p for p in data["processes"]}
    assert list(procs) == ["engine-0", "router", "front-door"]  # a key on loopback: qvl's front door, too
    door, router = procs["front-door"]["argv"], procs["router"]["argv"]
    assert door[3:] == ["127.0.0.1", "9000", *(f"http://127.0.0.1:{p}" for p in (9003, 9002, 9001))]
    assert router[router.index("--port") + 1] == "9003" and "k3y" not in json.dumps(data)
    assert procs["front-door"]["env"] == {"QVL_FRONT_DOOR_KEY": "<redacted>"}


def test_the_router_and_front_door_start_after_the_engines_and_only_engines_restart(art, capsys, monkeypatch):
    from qwenvl_rbln.serving import fleet_run
    from tests import engine_server as eng

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    monkeypatch.setenv("VLLM_API_KEY", "k3y")
    seen = {}

    class Fleet:
        def __init__(self, members, say, ready_url=None):
            seen.update(members=members, ready_url=ready_url)

        def run(self):
            return 0

    monkeypatch.setattr(fleet_run, "Fleet", Fleet)
    port = eng.free_block(5)
    code, out, err = run_main(["serve", str(art), "--emulate", "--workers", "2", "--port", str(port)], capsys)
    assert code == 0, err
    members = {m.name: m for m in seen["members"]}
    assert [(n, m.restart, m.after_engines) for n, m in members.items()] == [
        ("engine-0", True, False),
        ("engine-1", True, False),
        ("router", False, True),
        ("front-door", False, True),
    ]
    assert [members[f"engine-{i}"].health_url for i in (0, 1)] == [
        f"http://127.0.0.1:{port + 1}/health",
        f"http://127.0.0.1:{port + 2}/health",
    ]
    assert seen["ready_url"] == f"http://127.0.0.1:{port}/health"
    assert f"the router's http://127.0.0.1:{port + 3}/metrics" in err  # the metrics, said at start


def test_a_busy_metrics_port_or_router_port_is_one_line_naming_it(art, capsys, monkeypatch):
    import socket

    from tests import engine_server as eng

    for keyed, busy_at in ((False, 3), (True, 4)):  # the metrics port; the router behind the front door
        if keyed:
            monkeypatch.setenv("VLLM_API_KEY", "k3y")
        port = eng.free_block(5)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port + busy_at))
            code, out, err = run_main(["serve", str(art), "--emulate", "--workers", "2", "--port", str(port)], capsys)
        assert code == 2 and f"port {port + busy_at} on 127.0.0.1 is in use" in err, err
