"""Capacity figures (tuning/capacity.py) on the inputs the capacity tests leave out (audit 2026-12-06, mutants C06,
C07, C08, C19, C20): 1-token outputs, a run that starts late, a figure exactly on its target, repeated arrival
times, and the rate of the lightest load. Declared toy times through the simulator; nothing is a device figure.
(The arrival draw, capacity.draw, is being reworked and is not pinned here.)"""

from __future__ import annotations

import pytest

from qwenvl_rbln.tuning.capacity import Slo, capacity, metrics, misses, parse_slo, predict, read_arrivals
from qwenvl_rbln.tuning.device_time import linear_model
from qwenvl_rbln.tuning.simulate import Engine, Request, simulate
from tests.test_capacity import ENGINE, TOY, _load

ONE_AT_A_TIME = Engine(batch=1, chunk=512, block_size=64, num_blocks=1, max_model_len=64)
FLAT = linear_model(prefill=(1.0, 0.0, 0.0), decode=(0.1, 0.0, 0.0))  # every prefill 1 s, every decode 0.1 s


def test_a_one_token_request_has_no_tpot_and_its_latency_is_its_ttft():
    """C06: TPOT is (latency - TTFT) / (output - 1) over requests of more than one output token, as vllm bench serve
    (its list skips them); a 1-token request is done at its prefill."""
    reqs = [Request(0.0, 10, 1), Request(10.0, 10, 3), Request(20.0, 10, 1)]
    figures = metrics(simulate(ONE_AT_A_TIME, FLAT, reqs))
    assert figures["tpot"] == pytest.approx({"mean": 0.1, "p50": 0.1, "p90": 0.1, "p99": 0.1})
    assert figures["latency"]["p50"] == pytest.approx(1.0)  # the two 1-token requests: latency = TTFT = 1 s
    assert figures["ttft"]["p99"] == pytest.approx(1.0)


def test_throughput_is_over_the_run_from_its_first_arrival():
    """C07: a replayed run that starts at t=100 lasts from 100 to its last finish, not from 0."""
    reqs = [Request(100.0, 10, 3), Request(101.0, 10, 3), Request(103.0, 10, 3)]
    figures = predict(ONE_AT_A_TIME, FLAT, reqs)
    assert figures["duration_s"] == pytest.approx(104.2 - 100.0)  # the last: prefill 103-104, two decodes
    assert figures["requests_per_s"] == pytest.approx(3 / 4.2)
    assert figures["output_tokens_per_s"] == pytest.approx(9 / 4.2)


def test_a_figure_exactly_on_its_target_meets_it():
    """C08: a target is a bound the figure may reach (ttft_p90=2s is met by 2 s)."""
    figures = {"ttft": {"p90": 2.0}, "tpot": {"p99": 0.1}, "latency": {"p50": 5.0}}
    assert misses(figures, parse_slo("ttft_p90=2s,tpot_p99=100ms,latency_p50=5s")) == []
    (miss,) = misses(figures, [Slo("ttft", 90, 1.5)])
    assert miss["target"] == "ttft_p90=1.5s" and miss["over_s"] == pytest.approx(0.5)


def test_arrivals_at_the_same_instant_are_read(tmp_path):
    """C19: a trace is non-decreasing: several requests sent at one instant (a burst) are a real trace."""
    times = [float(i // 4) for i in range(24)]  # four at a time
    path = tmp_path / "burst.txt"
    path.write_text("\n".join(map(str, times)))
    assert read_arrivals(path) == tuple(times)


def test_the_lightest_load_is_a_thousandth_of_saturation(monkeypatch):
    """C20: 'unreachable' is judged at a rate where requests come effectively one at a time: 1/1000 of the
    saturation throughput (its TTFT is a request's alone, no queue)."""
    load = _load()
    asked: list[float] = []
    at = load.at
    monkeypatch.setattr(load, "at", lambda rate: asked.append(rate) or at(rate))
    cap = capacity(load, parse_slo("ttft_p50=10ms"))
    assert cap["capacity_rps"] == 0.0
    assert min(asked) == pytest.approx(cap["saturation_rps"] / 1000)
    alone = predict(ENGINE, TOY, [Request(0.0, 300, 20)])["ttft"]["p50"]
    assert cap["at_lightest"]["ttft"]["p50"] == pytest.approx(alone)
