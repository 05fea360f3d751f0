"""Latency targets, the figures vllm bench serve reports (numpy's percentile), and the capacity search."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.tuning.capacity import (
    Kind,
    Load,
    Slo,
    capacity,
    check_rate,
    fleet,
    metrics,
    misses,
    parse_slo,
    replay,
    unreachable_text,
)
from qwenvl_rbln.tuning.device_time import linear_model
from qwenvl_rbln.tuning.simulate import Engine, simulate

TOY = linear_model(prefill=(0.05, 0.0, 0.0), decode=(0.01, 0.001, 0.0))
ENGINE = Engine(batch=4, chunk=512, block_size=4096, num_blocks=4, max_model_len=8192, graphs=(1, 2, 4))
MIX = [Kind(300, (), 3.0), Kind(900, (1024,), 1.0)]


def _load(**kw) -> Load:
    return Load(ENGINE, TOY, MIX, output=20, **{"requests": 200, **kw})


def test_parse_slo():
    assert parse_slo("ttft_p90=2s,tpot_p99=100ms") == [Slo("ttft", 90, 2.0), Slo("tpot", 99, 0.1)]
    assert parse_slo(" latency_p50=1.5s ") == [Slo("latency", 50, 1.5)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "--slo is empty"),
        ("ttft=2s", "--slo target 'ttft=2s' is not METRIC_pN=VALUE"),
        ("itl_p90=2s", "'itl' is not ttft, tpot or latency"),
        ("ttft_p95=2s", "p95 is not p50, p90 or p99"),
        ("ttft_p90=2", "--slo target 'ttft_p90=2' has no unit"),
        ("ttft_p90=0ms", "is not a positive time"),
        ("ttft_p90=2s,ttft_p90=1s", "--slo gives ttft_p90 twice"),
    ],
)
def test_a_bad_slo_is_one_line_naming_the_value_and_the_fix(text, message):
    with pytest.raises(InputError) as exc:
        parse_slo(text)
    assert message in str(exc.value) and exc.value.hint
    assert "\n" not in exc.value.one_line()


def test_rate_needs_targets_and_a_positive_value():
    with pytest.raises(InputError, match="--rate needs latency targets"):
        check_rate(20.0, None)
    with pytest.raises(InputError, match="--rate -1.0 is not a positive request rate"):
        check_rate(-1.0, [Slo("ttft", 90, 2.0)])


def test_percentiles_are_numpys_default_as_vllm_bench_serve():
    trace = simulate(ENGINE, TOY, replay(MIX, [0.0, 0.01, 0.02, 0.5, 0.51, 2.0, 2.0], 20, seed=3))
    fig = metrics(trace)
    ttfts = [r.first_token - r.request.arrival for r in trace.records]
    tpots = [(r.finish - r.first_token) / 19 for r in trace.records]
    for q in (50, 90, 99):
        assert fig["ttft"][f"p{q}"] == pytest.approx(np.percentile(ttfts, q))
        assert fig["tpot"][f"p{q}"] == pytest.approx(np.percentile(tpots, q))
    assert fig["requests_per_s"] == pytest.approx(7 / max(r.finish for r in trace.records))


def test_a_run_is_determined_by_its_seed():
    assert _load().at(5.0) == _load().at(5.0)
    assert _load(seed=1).at(5.0) != _load().at(5.0)


def test_capacity_meets_every_target_there_and_misses_one_just_above():
    load = _load()
    slos = parse_slo("ttft_p90=500ms,tpot_p99=60ms")
    cap = capacity(load, slos)
    assert 0 < cap["capacity_rps"] < cap["saturation_rps"]
    assert misses(load.at(cap["capacity_rps"]), slos) == []
    assert misses(load.at(cap["capacity_rps"] * 1.02), slos)
    assert capacity(_load(), slos) == cap  # deterministic


def test_capacity_is_monotone_in_the_targets():
    caps = [capacity(_load(), parse_slo(f"ttft_p90={t}ms"))["capacity_rps"] for t in (200, 400, 800, 1600)]
    assert caps == sorted(caps) and caps[0] < caps[-1]


def test_loose_targets_are_capped_below_the_saturation_throughput():
    cap = capacity(_load(), parse_slo("latency_p99=1000s"))
    assert cap["capacity_rps"] == pytest.approx(0.95 * cap["saturation_rps"])
    assert cap["binding"].startswith("throughput (every target met at 95% of the saturation throughput)")


def test_an_unreachable_target_says_which_and_by_how_much():
    cap = capacity(_load(), parse_slo("ttft_p50=10ms,tpot_p99=1s"))
    assert cap["capacity_rps"] == 0.0
    (miss,) = cap["unreachable"]
    assert miss["target"] == "ttft_p50=10ms" and miss["got_s"] == pytest.approx(0.05)
    assert unreachable_text(cap["unreachable"]) == (
        "ttft_p50=10ms is unreachable: 50ms at the lightest load, 40ms over (x5.00)"
    )


def test_fleet_size():
    assert fleet(4.0, 20.0, 1) == {"replicas": 5, "npus": 5}
    assert fleet(3.0, 20.0, 2) == {"replicas": 7, "npus": 14}
    assert fleet(0.0, 20.0, 1) == {"replicas": None, "npus": None}
    assert math.ceil(20 / 3) == 7
