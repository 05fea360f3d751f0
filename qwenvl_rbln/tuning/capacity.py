"""Latency targets (SLOs), the figures ``vllm bench serve`` reports, and a replica's capacity under the targets.

- ``parse_slo("ttft_p90=2s,tpot_p99=100ms")``: targets on TTFT, TPOT or latency at p50/p90/p99.
- ``metrics``: TTFT, TPOT ((latency - TTFT) / (output - 1), requests with more than one output token) and latency
  (e2el) percentiles with ``numpy.percentile``'s default (linear) method, which is what ``vllm bench serve``
  calls (``vllm/benchmarks/serve.py::calculate_metrics``, ``np.percentile(ttfts or 0, p)``); ``percentile`` is
  a literal port (qvl's core install has no numpy), checked bit for bit against numpy in the tests. Throughput
  over the run from the first arrival to the last finish.
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
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.tuning.device_time import DeviceTimeModel
from qwenvl_rbln.tuning.simulate import Engine, Request, Trace, simulate

METRICS = ("ttft", "tpot", "latency")
PERCENTILES = (50, 90, 99)
EXAMPLE = "e.g. --slo ttft_p90=2s,tpot_p99=100ms"
DEFAULT_REQUESTS = 1000
DEFAULT_SEED = 0
MAX_UTILISATION = 0.95  # the search's top, as a fraction of the saturation throughput
_TARGET = re.compile(r"(?P<metric>[a-z]+)_p(?P<pct>\d+)=(?P<num>-?[0-9]*\.?[0-9]+(?:e[-+]?\d+)?)(?P<unit>ms|s)?")
# The rates a simulation answers sanely: below RATE_MIN the arrival times of a long run (up to 100,000 requests /
# rate seconds) lose the precision of a device step (at 1e-12 req/s every figure came out 0 ms); above RATE_MAX the
# replica count is no deployment (1e300 req/s printed a 48-digit --replicas).
RATE_MIN, RATE_MAX = 1e-3, 1e6


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
    """A time as a target is written: 3 significant figures, ms below a second."""
    return f"{s * 1000:.3g}ms" if s < 1 else f"{s:.3g}s"


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


def read_arrivals(path: Path) -> tuple[float, ...]:
    """A trace of arrival times (seconds): a JSON list or one number per line, non-decreasing, at least 20, not all
    at one instant. Replayed with its shape scaled to each rate the search tries."""
    import json

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(
            f"--arrivals {path} cannot be read ({exc.strerror or exc})", "give a file of arrival times"
        ) from None
    except UnicodeDecodeError as exc:
        raise InputError(
            f"--arrivals {path} is not a UTF-8 text file ({exc.reason} at byte {exc.start})",
            "a JSON list or one number per line, e.g. 0.0 0.13 0.52",
        ) from None
    try:
        raw = json.loads(text) if text.lstrip().startswith("[") else [ln for ln in text.split() if ln]
        times = tuple(float(x) for x in raw)
    except (ValueError, TypeError):
        raise InputError(
            f"--arrivals {path} is not a list of arrival times in seconds",
            "a JSON list or one number per line, e.g. 0.0 0.13 0.52",
        ) from None
    bad = next((i for i, t in enumerate(times) if not math.isfinite(t) or t < 0), None)
    if bad is not None:
        raise InputError(f"--arrivals {path}: entry {bad + 1} ({times[bad]}) is not a time >= 0", "fix that entry")
    back = next((i for i in range(1, len(times)) if times[i] < times[i - 1]), None)
    if back is not None:
        raise InputError(
            f"--arrivals {path}: entry {back + 1} ({times[back]}) is before entry {back} ({times[back - 1]})",
            "sort the arrival times",
        )
    if len(times) < 20 or times[-1] <= times[0]:
        raise InputError(
            f"--arrivals {path} has {len(times)} arrivals over {times[-1] - times[0] if times else 0:g} s",
            "give at least 20 arrival times spread over time",
        )
    return times


def check_rate(rate: float | None, slos: list[Slo] | None) -> None:
    if rate is None:
        return
    if not math.isfinite(rate) or rate <= 0:
        raise InputError(f"--rate {rate} is not a positive request rate", "requests per second, e.g. --rate 20")
    if not RATE_MIN <= rate <= RATE_MAX:
        raise InputError(
            f"--rate {rate:g} is outside {RATE_MIN:g}..{RATE_MAX:g} requests per second, where the simulation's "
            "figures hold (its arrival times lose precision below, and no fleet is that large above)",
            "requests per second, e.g. --rate 20",
        )


# ------------------------------------------------------------------------------------------------ figures


def percentile(values: Sequence[float], q: float) -> float:
    """``numpy.percentile(values or 0, q)`` with its default (linear) method, ported literally so that qvl's core
    install (no numpy) computes the same figure: the virtual index (q / 100) x (n - 1) between the two order
    statistics around it, interpolated as numpy's ``_lerp`` does (from the upper one when the weight is >= 0.5)."""
    xs = sorted(values) or [0.0]
    h = (q / 100) * (len(xs) - 1)
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    a, b, t = xs[lo], xs[hi], h - lo
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


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


def draw(mix: Sequence[Kind], n: int, seed: int, arrivals: Sequence[float] | None = None) -> Draw:
    """Poisson gaps (unit rate), or a replayed trace's gaps scaled to a mean of 1 (its shape, at any rate); the
    requests' kinds in the mix's proportions (``apportion``), in an order shuffled with ``seed``."""
    import random

    rng = random.Random(seed)  # the standard library's: qvl's core install has no numpy
    if arrivals is not None:
        n = len(arrivals)
        diffs = [float(b) - float(a) for a, b in zip(arrivals, arrivals[1:], strict=False)]
        mean = sum(diffs) / len(diffs)
        gaps = [d / mean for d in diffs]
    else:
        gaps = [rng.expovariate(1.0) for _ in range(max(n - 1, 0))]
    kinds = apportion([k.weight for k in mix], n)
    rng.shuffle(kinds)
    return Draw(tuple(gaps), tuple(kinds))


def apportion(weights: Sequence[float], n: int) -> list[int]:
    """``n`` request kinds in the workload's proportions (largest remainder), not drawn at random: a mix with a rare
    heavy kind (a video's ViT calls) drawn at random puts a different number of them in each run, and the
    capacity would follow that count more than the scheduler."""
    total = sum(weights)
    quotas = [w * n / total for w in weights]
    counts = [math.floor(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return [i for i, c in enumerate(counts) for _ in range(c)]


def requests_at(mix: Sequence[Kind], d: Draw, rate: float, output: int) -> list[Request]:
    """The draw's requests as a Poisson process at ``rate`` requests/s (``math.inf``: all at once)."""
    t, out = 0.0, []
    for i, k in enumerate(d.kinds):
        if i:
            t = t + d.gaps[i - 1] / rate if math.isfinite(rate) else 0.0
        out.append(Request(t, mix[k].prompt, output, mix[k].vit))
    return out


def replay(mix: Sequence[Kind], arrivals: Sequence[float], output: int, seed: int) -> list[Request]:
    """A replayed trace of arrival times (seconds), the kinds in the mix's proportions, shuffled with ``seed``."""
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
    arrivals: tuple[float, ...] | None = None  # a replayed trace (its shape scaled to each rate), else Poisson

    def __post_init__(self) -> None:
        self._draw = draw(self.mix, self.requests, self.seed, self.arrivals)
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
            "binding": f"throughput: every target met at {MAX_UTILISATION:.0%} of saturation",
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
        f"{_secs(m['over_s'])} over (x{m['over_ratio']:.{'2f' if m['over_ratio'] < 1e4 else '3g'}})"
        for m in missed
    )


def predict(engine: Engine, model: DeviceTimeModel, requests: Sequence[Request]) -> dict[str, Any]:
    """The figures one replica shows for these requests (a replayed run: the arrival times a client sent at):
    what a measured ``vllm bench serve``-style run of the same requests is checked against."""
    return metrics(simulate(engine, model, requests))
