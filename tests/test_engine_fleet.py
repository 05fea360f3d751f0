"""The fleet: `qvl serve --emulate --workers 2` (two real vLLM + vllm-rbln engines over the emulated NPU, vllm-router
in front, qvl supervising), spoken to over HTTP with the `openai` client. One fleet for the module; the kill test
restarts one engine; the last test is Ctrl-C. Emulated: no NPU ran.

Counts of the kill test (printed, and in /work/notes): non-streamed requests failed must be 0; a streamed answer the
kill cut must reach its client as an error, never as a clean end without a finish_reason.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tests import engine_server as eng

REPLICAS = 2
BATCH = 2  # the tiny artifact's compiled batch_size
BACK_S = 480.0  # a restarted engine's start while the other one serves, on 2 busy cores: a bound, not a wait
KEY = "fleet-front-door-key"


@pytest.fixture(scope="module")
def fleet(engine_artifact, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet")
    with eng.serving(engine_artifact, tmp, "--workers", str(REPLICAS), ports=REPLICAS + 2) as srv:
        yield srv


def engine_port(fleet, i: int) -> int:
    return fleet.port + 1 + i


def engine_processes(fleet, i: int) -> tuple[psutil.Process, list[psutil.Process]]:
    """Engine ``i``'s `vllm serve` process and its descendants (the engine core among them)."""
    for proc in psutil.Process(fleet.proc.pid).children():
        cmd = proc.cmdline()
        if "serve" in cmd and "--port" in cmd and cmd[cmd.index("--port") + 1] == str(engine_port(fleet, i)):
            return proc, proc.children(recursive=True)
    raise AssertionError(f"no engine on port {engine_port(fleet, i)}")


def healthy(port: int, path: str = "/health") -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.5)


def client(fleet, key: str | None = None, port: int | None = None):
    import openai

    url = f"http://127.0.0.1:{port or fleet.port}/v1"
    return openai.OpenAI(base_url=url, api_key=key or "none", max_retries=0, timeout=600)


def served_by(fleet, i: int) -> int:
    """Chat completions engine ``i`` answered so far (its access log lines, labelled with its name)."""
    tag = f"engine-{i} | "
    return sum(1 for line in fleet.output().splitlines() if tag in line and "POST /v1/chat/completions" in line)


# ------------------------------------------------------------------------------------------------- the fleet


def test_the_fleet_serves_through_the_router_from_both_engines_on_loopback(fleet):
    assert healthy(fleet.port) and healthy(fleet.port, "/readiness")  # the router: every engine is up
    for i in range(REPLICAS):
        engine, _ = engine_processes(fleet, i)
        cmd = engine.cmdline()
        assert cmd[cmd.index("--host") + 1] == "127.0.0.1"  # engines on loopback only
        assert engine.environ()["RBLN_DEVICES"] == str(i)  # each on its own (emulated) NPU
    print(f"fleet of {REPLICAS} ready (router /health 200) in {fleet.startup_s:.0f} s")
    router = [p for p in psutil.Process(fleet.proc.pid).children() if "router" in " ".join(p.cmdline())]
    assert len(router) == 1  # its title is vllm::router (setproctitle); its policy: tests/test_fleet.py
    api = client(fleet)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(REPLICAS * BATCH) as pool:
        answers = list(pool.map(lambda n: chat(api, f"Say {n}.", 8), range(4 * REPLICAS * BATCH)))
    assert all(a.choices[0].finish_reason in ("stop", "length") for a in answers)
    assert all(served_by(fleet, i) > 0 for i in range(REPLICAS)), fleet.output()[-3000:]
    assert all("emulated" in line for line in fleet.output().splitlines() if line.strip())
    # power_of_two: the router asks each engine GET /get_load every second; it and /health stay out of their logs
    engines = [line for line in fleet.output().splitlines() if re.search(r"engine-\d \| ", line)]
    assert not [line for line in engines if re.search(r'"GET /(get_load|health)\b', line)]
    assert "every engine answers /health (2); starting the rest: router" in fleet.output()


def chat(api, text: str, max_tokens: int, stream: bool = False):
    return api.chat.completions.create(
        model="engine",
        messages=[{"role": "user", "content": text}],
        max_tokens=max_tokens,
        temperature=0,
        stream=stream,
    )


def test_the_front_door_requires_the_key_and_closes_the_routers_own_routes(fleet, tmp_path):
    """vllm-router checks no client key and answers /add_worker to anyone: off loopback qvl's guard stands in front
    (here in front of the fleet's router on loopback, as qvl serve --host 0.0.0.0 runs it)."""
    import urllib.error
    import urllib.request

    # the router alone: a wrong key passes (the engines have none here), and its worker list is anyone's to read
    assert chat(client(fleet, key="anything"), "hi", 2).choices
    port = eng.free_port()
    env = {**fleet.env, "QVL_FRONT_DOOR_KEY": KEY}
    ups = [fleet.url, f"http://127.0.0.1:{fleet.port + REPLICAS + 1}"]  # the router, its metrics, the engines
    ups += [f"http://127.0.0.1:{engine_port(fleet, i)}" for i in range(REPLICAS)]
    cmd = [sys.executable, "-m", "qwenvl_rbln.serving.front_door", "127.0.0.1", str(port), *ups]
    door = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: healthy(port), 60, "the front door's /health")

        def status(path: str, key: str | None, method: str = "GET") -> int:
            head = {"Authorization": f"Bearer {key}"} if key else {}
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=head, method=method)
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    return resp.status
            except urllib.error.HTTPError as exc:
                return exc.code

        assert status("/health", None) == 200 and status("/readiness", None) == 200
        for path in ("/v1/models", "/get_server_info"):
            assert status(path, None) == 401 and status(path, "wrong") == 401, path
        assert status("/v1/models", KEY) == 200
        assert status("/list_workers", KEY) == 403  # the router's membership: qvl's
        assert status("/add_worker?url=http://127.0.0.1:9", KEY, "POST") == 403
        assert status("/remove_worker?url=http://127.0.0.1:9", KEY, "POST") == 403
        import openai

        with pytest.raises(openai.AuthenticationError):
            chat(client(fleet, key="wrong", port=port), "hi", 2)
        streamed = chat(client(fleet, key=KEY, port=port), "Count.", 6, stream=True)
        chunks = list(streamed)
        assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")  # streamed through
    finally:
        door.send_signal(signal.SIGINT)
        door.wait(timeout=30)


# ------------------------------------------------------------------------------------ an engine's death


class Load:
    """``2 x`` the fleet's compiled batch of clients, each sending requests until told to stop: odd clients stream.
    Counts what each request ended as."""

    def __init__(self, api, clients: int) -> None:
        self.api = api
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts = {"ok": 0, "failed": 0, "stream_ok": 0, "stream_error": 0, "stream_silent_cut": 0}
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(clients)]

    def _add(self, what: str, error: str | None = None) -> None:
        with self.lock:
            self.counts[what] += 1
            if error:
                self.errors.append(error[:300])

    def _client(self, n: int) -> None:
        while not self.stop.is_set():
            text = f"Client {n}: describe the number {n} in a few words." * (1 + n % 3)
            if n % 2:
                try:
                    last = None
                    for chunk in chat(self.api, text, 24, stream=True):
                        last = chunk.choices[0].finish_reason if chunk.choices else last
                    self._add("stream_ok" if last in ("stop", "length") else "stream_silent_cut")
                except Exception as exc:  # an error the client sees: the honest end of a cut stream
                    self._add("stream_error", f"{type(exc).__name__}: {exc}")
            else:
                try:
                    answer = chat(self.api, text, 24)
                    ok = answer.choices[0].finish_reason in ("stop", "length")
                    self._add("ok" if ok else "failed", None if ok else str(answer))
                except Exception as exc:
                    self._add("failed", f"{type(exc).__name__}: {exc}")

    def done(self) -> int:
        with self.lock:
            return sum(self.counts.values())

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=600)
        assert not any(t.is_alive() for t in self.threads), "a client did not finish within 600 s"


def test_an_engine_core_killed_under_load_costs_no_retriable_request_and_the_engine_rejoins(fleet):
    api = client(fleet)
    vllm, children = engine_processes(fleet, 0)
    cores = [p for p in children if "EngineCore" in " ".join([p.name(), *p.cmdline()])]
    assert cores, [(p.name(), p.cmdline()) for p in children]
    with Load(api, 2 * REPLICAS * BATCH) as load:
        wait_for(lambda: load.done() >= REPLICAS * BATCH, 300, "the first requests under load")
        before = load.done()
        for core in cores:
            os.kill(core.pid, signal.SIGKILL)
        wait_for(lambda: not vllm.is_running() or vllm.status() == psutil.STATUS_ZOMBIE, 120, "engine-0's end")
        wait_for(lambda: load.done() >= before + 2 * REPLICAS * BATCH, 300, "requests after the kill")
    counts = dict(load.counts)
    print(f"kill test counts: {counts}; errors: {load.errors[:5]}")
    assert counts["failed"] == 0, (counts, load.errors)
    assert counts["stream_silent_cut"] == 0, counts  # a cut stream is an error its client sees
    assert counts["ok"] > 0 and counts["stream_ok"] > 0
    wait_for(lambda: healthy(engine_port(fleet, 0)), BACK_S, "engine-0 back (/health 200)")
    wait_for(lambda: healthy(fleet.port), 60, "the router's /health 200 (every engine in rotation)")
    assert "engine-0 exited with code" in fleet.output()
    # qvl's own health check (every 2 s, apart from the router's and this test's) says it once it sees the 200
    wait_for(lambda: "back in rotation" in fleet.output(), 120, "qvl's 'back in rotation' line for engine-0")
    served = served_by(fleet, 0)
    from concurrent.futures import ThreadPoolExecutor

    def more_work() -> bool:  # a round of the fleet's batch at once; the restarted engine takes a share
        with ThreadPoolExecutor(REPLICAS * BATCH) as pool:
            list(pool.map(lambda n: chat(api, f"Again {n}.", 4), range(REPLICAS * BATCH)))
        return served_by(fleet, 0) > served

    wait_for(more_work, 120, "engine-0 answering requests again")  # its circuit breaker reopens within 5 s


def test_ctrl_c_ends_every_process_of_the_fleet(fleet):
    """The last test of the module: it stops the shared fleet the way a user does."""
    fleet.remember_processes()
    assert len(fleet.started) >= 2 * REPLICAS + 1  # two engines with their cores, and the router
    assert fleet.interrupt() == 130
    assert not eng.alive(fleet.started), eng.alive(fleet.started)
    assert "no process of the fleet is left" in fleet.output()
