"""Latency targets (SLOs), the figures ``vllm bench serve`` reports, and a replica's capacity under the targets.

- ``parse_slo("ttft_p90=2s,tpot_p99=100ms")``: targets on TTFT, TPOT or latency at p50/p90/p99.
- ``metrics``: TTFT, TPOT ((latency - TTFT) / (output - 1), requests with more than one output token) and latency
  (e2el) percentiles with ``numpy.percentile``'s default (linear) method, which is what ``vllm bench serve``
  calls (``vllm/benchmarks/serve.py::calculate_metrics``, ``np.percentile(ttfts or 0, p)``); throughput over
  the run from the first arrival to the last finish.
- ``capacity``: the largest Poisson arrival rate one replica sustains with every target met, by bisection over the
  serving simulator (``tuning.simulate``) with one seed and one draw of requests scaled to each rate (common
  random numbers), so the search is deterministic and its figure moves smoothly with the rate. It is capped at
  ``MAX_UTILISATION`` of the replica's saturation throughput (every request queued at once): at and near that
  rate the queue grows for the whole run, so a finite run's percentiles understate what a long one sees, however
  loose the targets are.

Like Vidur (Agrawal et al., MLSys 2024): a scheduler simulation fed by per-graph device times, searched for the
largest rate under the targets.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.tuning.device_time import DeviceTimeModel
from qwenvl_rbln.tuning.simulate import Engine, Request, Trace, simulate

METRICS = ("ttft", "tpot", "latency")
PERCENTILES = (50, 90, 99)
EXAMPLE = "e.g. --slo ttft_p90=2s,tpot_p99=100ms"
DEFAULT_REQUESTS = 400
DEFAULT_SEED = 0
MAX_UTILISATION = 0.95  # the search's top, as a fraction of the saturation throughput
_TARGET = re.compile(r"(?P<metric>[a-z]+)_p(?P<pct>\d+)=(?P<num>[0-9]*\.?[0-9]+(?:e[-+]?\d+)?)(?P<unit>ms|s)?")


@dataclass(frozen=True)
class Slo:
    metric: str  # ttft | tpot | latency
    percentile: int  # 50 | 90 | 99
    seconds: float

    @property
    def key(self) -> str:
        return f"{self.metric}_p{self.percentile}"

    def text(self) -> str:
        return f"{self.key}={_secs(self.seconds)}"


def _secs(s: float) -> str:
    return f"{s * 1000:g}ms" if s < 1 else f"{s:g}s"


def parse_slo(text: str) -> list[Slo]:
    """``METRIC_pN=VALUE[ms|s]`` separated by commas; each metric/percentile once."""
    out: dict[str, Slo] = {}
    parts = [p.strip() for p in (text or "").split(",")]
    if not any(parts):
        raise InputError("--slo is empty", f"give latency targets, {EXAMPLE}")
    for part in parts:
        m = _TARGET.fullmatch(part.lower())
        if not m:
            raise InputError(
                f"--slo target {part!r} is not METRIC_pN=VALUE",
                f"METRIC is ttft, tpot or latency, N is 50, 90 or 99, VALUE has a unit (ms or s): {EXAMPLE}",
            )
        metric, pct, unit = m["metric"], int(m["pct"]), m["unit"]
        if metric not in METRICS:
            raise InputError(f"--slo target {part!r}: {metric!r} is not ttft, tpot or latency", EXAMPLE)
        if pct not in PERCENTILES:
            raise InputError(f"--slo target {part!r}: p{pct} is not p50, p90 or p99", EXAMPLE)
        if unit is None:
            raise InputError(f"--slo target {part!r} has no unit", f"write {part}ms or {part}s")
        seconds = float(m["num"]) / (1000 if unit == "ms" else 1)
        if not math.isfinite(seconds) or seconds <= 0:
            raise InputError(f"--slo target {part!r} is not a positive time", EXAMPLE)
        slo = Slo(metric, pct, seconds)
        if slo.key in out:
            raise InputError(f"--slo gives {slo.key} twice ({out[slo.key].text()} and {part})", "give it once")
        out[slo.key] = slo
    return list(out.values())


def check_rate(rate: float | None, slos: list[Slo] | None) -> None:
    if rate is None:
        return
    if not math.isfinite(rate) or rate <= 0:
        raise InputError(f"--rate {rate} is not a positive request rate", "requests per second, e.g. --rate 20")
    if not slos:
        raise InputError("--rate needs latency targets to size a fleet", f"add --slo, {EXAMPLE}")


# ------------------------------------------------------------------------------------------------ figures


def percentile(values: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(list(values) or [0.0], q))


def metrics(trace: Trace) -> dict[str, Any]:
    """The figures ``vllm bench serve`` prints, in seconds, for a simulated run."""
    recs = trace.records
    series = {
        "ttft": [r.ttft for r in recs],
        "tpot": [t for r in recs if (t := r.tpot) is not None],
        "latency": [r.latency for r in recs],
    }
    start = min(r.request.arrival for r in recs)
    duration = max(r.finish for r in recs) - start
    out: dict[str, Any] = {"requests": len(recs), "duration_s": duration}
    for name, vals in series.items():
        out[name] = {
            "mean": sum(vals) / len(vals) if vals else 0.0,
            **{f"p{q}": percentile(vals, q) for q in PERCENTILES},
        }
    tokens = sum(r.request.output for r in recs)
    out["requests_per_s"] = len(recs) / duration if duration > 0 else math.inf
    out["output_tokens_per_s"] = tokens / duration if duration > 0 else math.inf
    out["preemptions"] = sum(r.preemptions for r in recs)
    return out


def misses(figures: dict[str, Any], slos: list[Slo]) -> list[dict[str, Any]]:
    """Every target the figures miss: the target, the figure, and by how much."""
    out = []
    for s in slos:
        got = figures[s.metric][f"p{s.percentile}"]
        if got > s.seconds:
            out.append({"target": s.text(), "got_s": got, "over_s": got - s.seconds, "over_ratio": got / s.seconds})
    return out


# ------------------------------------------------------------------------------------------------ load


@dataclass(frozen=True)
class Kind:
    """One kind of request in the workload: its LM input tokens, its ViT call buckets, and its weight."""

    prompt: int
    vit: tuple[int, ...]
    weight: float


@dataclass(frozen=True)
class Draw:
    """One seeded draw of a run: unit-rate gaps between arrivals (the first request at 0) and each request's kind."""

    gaps: tuple[float, ...]
    kinds: tuple[int, ...]


def draw(mix: Sequence[Kind], n: int, seed: int) -> Draw:
    import numpy as np

    rng = np.random.default_rng(seed)
    gaps = rng.standard_exponential(max(n - 1, 0))
    weights = np.array([k.weight for k in mix], dtype=float)
    kinds = rng.choice(len(mix), size=n, p=weights / weights.sum())
    return Draw(tuple(float(g) for g in gaps), tuple(int(k) for k in kinds))


def requests_at(mix: Sequence[Kind], d: Draw, rate: float, output: int) -> list[Request]:
    """The draw's requests as a Poisson process at ``rate`` requests/s (``math.inf``: all at once)."""
    t, out = 0.0, []
    for i, k in enumerate(d.kinds):
        if i:
            t = t + d.gaps[i - 1] / rate if math.isfinite(rate) else 0.0
        out.append(Request(t, mix[k].prompt, output, mix[k].vit))
    return out


def replay(mix: Sequence[Kind], arrivals: Sequence[float], output: int, seed: int) -> list[Request]:
    """A replayed trace of arrival times (seconds), each request's kind drawn from the mix with ``seed``."""
    d = draw(mix, len(arrivals), seed)
    return [Request(float(a), mix[k].prompt, output, mix[k].vit) for a, k in zip(arrivals, d.kinds, strict=True)]


# ------------------------------------------------------------------------------------------------ search


@dataclass
class Load:
    """One replica under one workload: everything a run at a rate needs."""

    engine: Engine
    model: DeviceTimeModel
    mix: Sequence[Kind]
    output: int
    requests: int = DEFAULT_REQUESTS
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        self._draw = draw(self.mix, self.requests, self.seed)
        self._runs: dict[float, dict[str, Any]] = {}

    def at(self, rate: float) -> dict[str, Any]:
        if rate not in self._runs:
            self._runs[rate] = metrics(
                simulate(self.engine, self.model, requests_at(self.mix, self._draw, rate, self.output))
            )
        return self._runs[rate]


def capacity(load: Load, slos: list[Slo], *, rel_tol: float = 0.01, max_iter: int = 30) -> dict[str, Any]:
    """The largest rate (requests/s) one replica sustains with every target met, with the figures there; or,
    when even the lightest load misses a target, which one and by how much (``unreachable``)."""
    saturated = load.at(math.inf)["requests_per_s"]
    top = MAX_UTILISATION * saturated
    light = saturated / 1000  # requests effectively one at a time
    at_light = load.at(light)
    missed = misses(at_light, slos)
    out: dict[str, Any] = {"saturation_rps": saturated, "requests": load.requests, "seed": load.seed}
    if missed:
        return {**out, "capacity_rps": 0.0, "unreachable": missed, "at_lightest": at_light}
    if not misses(load.at(top), slos):
        return {
            **out,
            "capacity_rps": top,
            "binding": f"throughput (every target met at {MAX_UTILISATION:.0%} of the saturation throughput)",
            "at_capacity": load.at(top),
        }
    lo, hi = light, top
    for _ in range(max_iter):
        if hi - lo <= rel_tol * hi:
            break
        mid = math.sqrt(lo * hi) if hi / lo > 4 else (lo + hi) / 2
        if misses(load.at(mid), slos):
            hi = mid
        else:
            lo = mid
    binding = misses(load.at(hi), slos)
    return {**out, "capacity_rps": lo, "binding": ", ".join(m["target"] for m in binding), "at_capacity": load.at(lo)}


def fleet(capacity_rps: float, rate: float, npus_per_replica: int) -> dict[str, Any]:
    """Replicas (and NPUs) that carry ``rate`` requests/s when each carries ``capacity_rps``."""
    if capacity_rps <= 0:
        return {"replicas": None, "npus": None}
    replicas = max(1, math.ceil(rate / capacity_rps - 1e-9))
    return {"replicas": replicas, "npus": replicas * npus_per_replica}


def unreachable_text(missed: list[dict[str, Any]]) -> str:
    """Which targets no rate meets, and by how much (at the lightest load)."""
    return "; ".join(
        f"{m['target']} is unreachable: {_secs(m['got_s'])} at the lightest load, "
        f"{_secs(m['over_s'])} over (x{m['over_ratio']:.2f})"
        for m in missed
    )
