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


def test_rate_is_a_positive_value():
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
    assert cap["binding"] == "throughput: every target met at 95% of saturation"


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


def test_a_replayed_trace_keeps_its_shape_at_every_rate(tmp_path):
    from qwenvl_rbln.tuning.capacity import read_arrivals

    even = tuple(float(i) for i in range(200))
    bursty = tuple(float(i // 10) * 10 for i in range(200))  # ten at once, every ten seconds
    slos = parse_slo("ttft_p90=300ms")
    caps = {name: capacity(_load(arrivals=trace), slos)["capacity_rps"] for name, trace in
            (("even", even), ("bursty", bursty))}  # fmt: skip
    poisson = capacity(_load(), slos)["capacity_rps"]
    assert caps["even"] > poisson > caps["bursty"]
    path = tmp_path / "a.txt"
    path.write_text("\n".join(map(str, even)) + "\n")
    assert read_arrivals(path) == even
    (tmp_path / "b.json").write_text("[0, 1, 0.5]")
    with pytest.raises(InputError, match=r"entry 3 \(0.5\) is before entry 2 \(1.0\)"):
        read_arrivals(tmp_path / "b.json")
    (tmp_path / "c.txt").write_text("0 1 x")
    with pytest.raises(InputError, match="is not a list of arrival times in seconds"):
        read_arrivals(tmp_path / "c.txt")
    (tmp_path / "d.txt").write_text("0 1 2")
    with pytest.raises(InputError, match="has 3 arrivals over 2 s"):
        read_arrivals(tmp_path / "d.txt")


def test_the_simulator_imports_neither_vllm_nor_torch():
    """Pure Python at run time: a capacity search over a roofline model loads no vLLM, vllm-rbln or torch, nor
    numpy (not in qvl's core install)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from qwenvl_rbln.tuning.capacity import Kind, Load, capacity, parse_slo\n"
        "from qwenvl_rbln.tuning.device_time import time_model_for\n"
        "from qwenvl_rbln.tuning.simulate import Engine\n"
        "import qwenvl_rbln.tuning.fleet\n"
        "m = time_model_for(model='Qwen/Qwen3-VL-2B-Instruct', chunk=512, block=8192)\n"
        "e = Engine(batch=2, chunk=512, block_size=8192, num_blocks=8, max_model_len=32768)\n"
        "capacity(Load(e, m, [Kind(700, (1024,), 1.0)], output=16, requests=30), parse_slo('ttft_p90=1s'))\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('vllm', 'vllm_rbln', 'torch', 'numpy'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_percentile_is_numpys_default_bit_for_bit():
    import random

    from qwenvl_rbln.tuning.capacity import percentile

    rng = random.Random(5)
    for _ in range(500):
        xs = [rng.expovariate(1.0) * 10 ** rng.randint(-3, 3) for _ in range(rng.randint(1, 60))]
        for q in (0, 1, 50, 90, 99, 100, rng.uniform(0, 100)):
            assert percentile(xs, q) == float(np.percentile(xs, q))
    assert percentile([], 90) == float(np.percentile(0, 90))  # vllm bench serve's `ttfts or 0`


def test_a_runs_kinds_follow_the_mix_exactly_in_a_seeded_order():
    from collections import Counter

    from qwenvl_rbln.tuning.capacity import apportion, draw

    assert Counter(apportion([3.0, 1.0, 0.02], 100)) == {0: 75, 1: 25}  # largest remainder: 74.6, 24.9, 0.5 -> 75, 25
    assert sorted(Counter(apportion([1.0, 1.0, 1.0], 10)).values()) == [3, 3, 4]
    mix = [Kind(10, (), 0.9), Kind(5000, (16384,), 0.1)]
    runs = [draw(mix, 200, seed) for seed in (0, 1)]
    assert [Counter(r.kinds) for r in runs] == [{0: 180, 1: 20}] * 2  # the rare heavy kind: exactly its share
    assert runs[0].kinds != runs[1].kinds and draw(mix, 200, 0) == runs[0]  # order: the seed's, repeatably


def _vllm_send_times(n: int, rate: float, seed: int, monkeypatch) -> list[float]:
    """vLLM 0.22's own ``get_request`` async generator, run as ``vllm bench serve`` runs it after seeding numpy
    with ``--seed``: each request's send time, read off its sleeps with a clock held at 0 (so each sleep is exactly
    the request's delay from the start) instead of sleeping."""
    import asyncio
    import random
    import types

    from qwenvl_rbln.backends import emulator

    emulator.activate()  # vLLM's platform plugin (vllm-rbln) imports rebel
    from vllm.benchmarks import serve

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(serve, "time", types.SimpleNamespace(time=lambda: 0.0))
    monkeypatch.setattr(serve, "asyncio", types.SimpleNamespace(sleep=sleep))
    random.seed(seed)
    np.random.seed(seed)

    async def collect() -> list[float]:
        sent = []
        async for _request, _rate in serve.get_request(list(range(n)), rate):
            sent.append(slept[-1] if slept else 0.0)  # every delay is > 0 at a finite rate: one sleep each
        return sent

    sent = asyncio.run(collect())
    assert len(slept) == n
    return sent


@pytest.mark.parametrize(("n", "rate", "seed"), [(1000, 8.09, 0), (1000, 20.0, 1), (37, 0.3, 12345)])
def test_the_arrivals_are_vllm_bench_serves_for_the_same_seed_bit_for_bit(n, rate, seed, monkeypatch):
    pytest.importorskip("vllm")
    from qwenvl_rbln.tuning.capacity import draw, requests_at

    expected = _vllm_send_times(n, rate, seed, monkeypatch)
    d = draw([Kind(10, (), 1.0)], n, seed)
    assert [r.arrival for r in requests_at([Kind(10, (), 1.0)], d, rate, 4)] == expected
    assert expected[-1] == pytest.approx(n / rate) and expected[0] > 0  # rescaled to N / rate; the first delayed


def test_the_draws_are_numpys_legacy_generator_without_numpy():
    """The standard library in numpy's seeded state: the same doubles, hence the same exponentials, bit for bit."""
    from qwenvl_rbln.tuning.capacity import _numpy_seeded, unit_exponentials

    for seed in (0, 1, 2**32 - 1):
        rs = np.random.RandomState(seed)
        assert unit_exponentials(500, seed) == tuple(float(x) for x in rs.standard_exponential(500))
        assert [_numpy_seeded(seed).random() for _ in range(3)][0] == np.random.RandomState(seed).random_sample()
    with pytest.raises(InputError, match="--seed -1 is outside 0..4294967295"):
        unit_exponentials(3, -1)


def test_throughput_runs_from_the_benchmarks_start_and_the_npu_busy_share_is_device_over_wall():
    from qwenvl_rbln.tuning.capacity import requests_at

    load = _load()
    fig = load.at(2.0)
    trace = simulate(ENGINE, TOY, requests_at(MIX, load._draw, 2.0, 20))
    assert min(r.request.arrival for r in trace.records) > 0  # vLLM delays the first request too
    assert fig["duration_s"] == trace.end  # from 0, the benchmark's start, to the last finish
    assert fig["requests_per_s"] == pytest.approx(200 / trace.end)
    assert 0 < fig["npu_busy_share"] < 1 and fig["npu_busy_share"] == pytest.approx(fig["device_s"] / trace.end)
    assert fig["host_s"] == 0.0  # host-free by default
    from qwenvl_rbln.tuning.host_time import HostTimeModel

    hosted = _load(host=HostTimeModel(prefill_base_s=0.004, decode_base_s=0.003, source="test")).at(math.inf)
    bare = load.at(math.inf)
    assert hosted["host_s"] > 0 and hosted["npu_busy_share"] < bare["npu_busy_share"] == pytest.approx(1.0)
    assert hosted["requests_per_s"] < bare["requests_per_s"]


def test_a_capacity_near_saturation_is_flagged():
    from qwenvl_rbln.tuning.capacity import NEAR_SATURATION

    cap = capacity(_load(), parse_slo("ttft_p90=100s"))  # loose: the search's top, 95 % of saturation
    assert cap["utilisation"] == pytest.approx(0.95) and cap["utilisation"] > NEAR_SATURATION
    assert "understates the tail" in cap["near_saturation"]
    tight = capacity(_load(), parse_slo("ttft_p90=300ms"))
    assert tight["utilisation"] < NEAR_SATURATION and tight["near_saturation"] is None
