"""One keyed replica behind the router: `VLLM_API_KEY=K qvl serve --emulate --devices 1` (one real vLLM + vllm-rbln
engine over the emulated NPU, vllm-router with the policy it accepts for one worker, qvl's front door in front
because of the key), spoken to over HTTP. One start for every check; the last test is Ctrl-C. Emulated: no NPU ran.

vllm-router passes the client's key on only for the routes it balances, so before qvl's front door sent the others
straight to an engine, `/tokenize`, `/detokenize` and `/invocations` answered 401 through a keyed fleet whatever key
the client sent, while the engine alone answered 200.
"""

from __future__ import annotations

import re

import psutil
import pytest

from tests import engine_server as eng
from tests.test_engine_fleet import wait_for

KEY = "one-replica-fleet-key"
PORTS = 4  # the front door, the engine, the router's metrics, the router behind the door


@pytest.fixture(scope="module")
def fleet(engine_artifact, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet-keyed")
    with eng.serving(engine_artifact, tmp, "--devices", "1", env={"VLLM_API_KEY": KEY}, ports=PORTS) as srv:
        yield srv


def engine_lines(fleet) -> list[str]:
    return [line for line in fleet.output().splitlines() if "engine-0 | " in line]


def test_one_replica_starts_behind_the_router_once_its_engine_is_up_and_says_when_ready(fleet):
    wait_for(lambda: "the fleet is ready" in fleet.output(), 60, "qvl's ready line")
    said = [line for line in fleet.output().splitlines() if line.startswith("qvl: ")]
    order = [next(i for i, s in enumerate(said) if what in s) for what in ("engine-0 is up", "every engine", "ready")]
    assert order == sorted(order), said  # the router and the door start after the engine answered /health
    children = [p.cmdline() for p in psutil.Process(fleet.proc.pid).children()]
    assert sum(1 for c in children if "vllm::router" in " ".join(c)) == 1  # its title (setproctitle)
    status, _, ready = fleet.request("/readiness")  # the router's, through the door: it took its one worker
    assert status == 200 and (ready["healthy_workers"], ready["total_workers"]) == (1, 1), ready
    engine = next(
        c for c in children if "serve" in c and "--port" in c and c[c.index("--port") + 1] == str(fleet.port + 1)
    )
    assert engine[engine.index("--host") + 1] == "127.0.0.1"
    assert any("qwenvl_rbln.serving.front_door" in " ".join(c) for c in children)


def test_a_keyed_fleet_answers_every_route_with_the_key_as_one_engine_does(fleet):
    engine = eng.Server(fleet.proc, fleet.port + 1, fleet.log, fleet.env, key=KEY)  # the engine alone
    tokenize = {"model": "engine", "prompt": "hello there"}
    status, _, alone = engine.request("/tokenize", tokenize)
    assert status == 200 and alone["count"] > 0, alone
    status, _, through = fleet.request("/tokenize", tokenize)
    assert (status, through) == (200, alone)
    status, _, text = fleet.request("/detokenize", {"model": "engine", "tokens": alone["tokens"]})
    assert status == 200 and "hello" in text["prompt"], text
    chat = {"model": "engine", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    status, _, answer = fleet.request("/invocations", chat)
    assert status == 200 and answer["choices"][0]["finish_reason"] in ("stop", "length"), answer
    assert fleet.chat("hi", 2)[0] == 200
    fleet.key = None
    try:
        for path, body in (("/tokenize", tokenize), ("/invocations", chat), ("/v1/chat/completions", chat)):
            assert fleet.request(path, body)[0] == 401, path
            assert fleet.request(path, body, key="wrong")[0] == 401, path
        status, _, metrics = fleet.request("/metrics")  # public: the router's own, not the engine's
        assert status == 200 and "vllm_router_worker_health" in metrics and "vllm:" not in metrics
        assert fleet.request("/load")[:1] == (200,) and fleet.request("/list_workers", key=KEY)[0] == 403
    finally:
        fleet.key = KEY


def test_the_probes_stay_out_of_the_engines_access_log(fleet):
    """The router's /health every 2 s and qvl's own: they would fill the engine's log (and /get_load each second
    under power_of_two, asserted in tests/test_engine_fleet.py)."""
    lines = engine_lines(fleet)
    assert any("POST /tokenize" in line and " 200" in line for line in lines), lines[-20:]
    probes = [line for line in lines if re.search(r'"GET /(health|get_load)\b', line)]
    assert not probes, probes[:5]


def test_ctrl_c_ends_the_keyed_fleet(fleet):
    fleet.remember_processes()
    assert fleet.interrupt() == 130
    assert not eng.alive(fleet.started), eng.alive(fleet.started)
