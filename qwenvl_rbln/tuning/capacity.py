"""Latency targets (SLOs), the figures ``vllm bench serve`` reports, and a replica's capacity under the targets.

- ``parse_slo("ttft_p90=2s,tpot_p99=100ms")``: targets on TTFT, TPOT or latency at p50/p90/p99.
- ``metrics``: TTFT, TPOT ((latency - TTFT) / (output - 1), requests with more than one output token) and latency
  (e2el) percentiles with ``numpy.percentile``'s default (linear) method, which is what ``vllm bench serve``
  calls (``vllm/benchmarks/serve.py::calculate_metrics``, ``np.percentile(ttfts or 0, p)``); ``percentile`` is
  a literal port (qvl's core install has no numpy), checked bit for bit against numpy in the tests. Throughput
  over the run from the benchmark's start (time 0, before the first delayed arrival, as vLLM's duration) to the
  last finish; the NPU busy share (device time / that wall time).
- Arrivals: ``send_times`` is ``vllm bench serve``'s ``get_request`` (``--request-rate R``, burstiness 1, no
  ramp-up) to the bit for the same ``--seed``: N gamma(1, 1/R) delays from numpy's legacy global generator after
  ``np.random.seed(seed)``, cumulated, then rescaled so the last request is sent at exactly N / R. numpy is not
  needed for that: numpy seeds its MT19937 from an integer with ``init_genrand`` and draws a legacy double and an
  exponential (``-log(1 - U)``) exactly as CPython's ``random`` does, so ``_numpy_seeded`` puts the standard
  library's generator in numpy's state and the draws match bit for bit (checked against vLLM's own
  ``get_request`` in the tests). It assumes, as for vLLM's random and ShareGPT datasets, that nothing drew from
  numpy's global generator between the seeding and the sending.
- ``capacity``: the largest Poisson arrival rate one replica sustains with every target met, by bisection over the
  serving simulator (``tuning.simulate``) with one seed and one draw of requests scaled to each rate (common
  random numbers), so the search is deterministic and its figure moves smoothly with the rate. It is capped at
  ``MAX_UTILISATION`` of the replica's saturation throughput (every request queued at once): at and near that
  rate the queue grows for the whole run, so a finite run's percentiles understate what a long one sees, however
  loose the targets are. Below the cap they still do (``NEAR_SATURATION``): a capacity above it is flagged.

Like Vidur (Agrawal et al., MLSys 2024): a scheduler simulation fed by per-graph device times, searched for the
largest rate under the targets.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.tuning.device_time import DeviceTimeModel
from qwenvl_rbln.tuning.host_time import HOST_FREE, HostTimeModel
from qwenvl_rbln.tuning.simulate import LONGEST, Engine, Request, StepCosts, Trace, simulate

METRICS = ("ttft", "tpot", "latency")
PERCENTILES = (50, 90, 99)
EXAMPLE = "e.g. --slo ttft_p90=2s,tpot_p99=100ms"
DEFAULT_REQUESTS = 1000
DEFAULT_SEED = 0
MAX_UTILISATION = 0.95  # the search's top, as a fraction of the saturation throughput
# A capacity above this fraction of saturation rests on tail percentiles a finite run understates: the upstream
# audit (2026-12-06, O5) measured TTFT p90 141 ms at 1,000 requests against 159 ms at 16,000, at 85 % of saturation.
NEAR_SATURATION = 0.8
NEAR_SATURATION_TEXT = (
    "above {:.0%} of saturation a finite run understates the tail (an audit found TTFT p90 11 % low at 85 % with "
    "1,000 requests): rerun with more --sim-requests and other --seed values before relying on it"
)
MAX_SEED = 2**32 - 1  # numpy's np.random.seed range, which vllm bench serve's --seed goes to
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


def metrics(trace: Trace, start: float | None = None) -> dict[str, Any]:
    """The figures ``vllm bench serve`` prints, in seconds, for a simulated run; the duration from ``start`` (None:
    the first arrival) to the last finish. Also the NPU busy share: device time / wall time from 0."""
    recs = trace.records
    series = {
        "ttft": [r.ttft for r in recs],
        "tpot": [t for r in recs if (t := r.tpot) is not None],
        "latency": [r.latency for r in recs],
    }
    start = min(r.request.arrival for r in recs) if start is None else start
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
    out["npu_busy_share"] = trace.npu_busy_share
    out["device_s"], out["host_s"] = trace.device_s, trace.host_s
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
    """One seeded draw of a run and each request's kind. Poisson: one unit exponential per request (``send_times``
    makes vLLM's send times of them at any rate). A replayed trace: its gaps scaled to a mean of 1, first at 0."""

    gaps: tuple[float, ...]
    kinds: tuple[int, ...]
    poisson: bool = True


def _numpy_seeded(seed: int) -> random.Random:
    """The standard library's generator in the state ``np.random.seed(seed)`` leaves numpy's legacy MT19937 in:
    numpy seeds an integer with ``init_genrand`` (Python's own ``seed`` uses ``init_by_array``), 624 words with the
    next draw regenerating them. ``random()`` then gives numpy's legacy doubles (both are genrand_res53)."""
    if not 0 <= seed <= MAX_SEED:
        raise InputError(
            f"--seed {seed} is outside 0..{MAX_SEED}", "vllm bench serve seeds numpy with it: give one in range"
        )
    mt = [seed]
    for i in range(1, 624):
        prev = mt[-1]
        mt.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
    rng = random.Random()
    rng.setstate((3, (*mt, 624), None))
    return rng


def unit_exponentials(n: int, seed: int) -> tuple[float, ...]:
    """numpy's legacy ``standard_exponential`` after ``np.random.seed(seed)``: ``-log(1 - U)``, bit for bit."""
    rng = _numpy_seeded(seed)
    return tuple(-math.log(1.0 - rng.random()) for _ in range(n))


def send_times(exponentials: Sequence[float], rate: float) -> list[float]:
    """When ``vllm bench serve --request-rate rate`` sends each request, from the benchmark's start: its
    ``get_request`` (burstiness 1, no ramp-up) step for step, ``np.random.gamma(1, theta)`` being theta x a unit
    exponential; all at 0 at an infinite rate."""
    if not math.isfinite(rate):
        return [0.0] * len(exponentials)
    theta = 1.0 / (rate * 1.0)
    delay_ts = [theta * e for e in exponentials]
    for i in range(1, len(delay_ts)):
        delay_ts[i] += delay_ts[i - 1]
    if delay_ts and delay_ts[-1] != 0:
        normalize_factor = (len(delay_ts) / rate) / delay_ts[-1]
        delay_ts = [delay * normalize_factor for delay in delay_ts]
    return delay_ts


def draw(mix: Sequence[Kind], n: int, seed: int, arrivals: Sequence[float] | None = None) -> Draw:
    """vllm bench serve's Poisson delays for ``seed`` (``unit_exponentials``), or a replayed trace's gaps scaled to a
    mean of 1 (its shape, at any rate); the requests' kinds in the mix's proportions (``apportion``), in an order
    shuffled with ``seed`` (the standard library's own seeding, apart from the arrivals)."""
    if arrivals is not None:
        n = len(arrivals)
        diffs = [float(b) - float(a) for a, b in zip(arrivals, arrivals[1:], strict=False)]
        mean = sum(diffs) / len(diffs)
        gaps, poisson = tuple(d / mean for d in diffs), False
    else:
        gaps, poisson = unit_exponentials(n, seed), True
    kinds = apportion([k.weight for k in mix], n)
    random.Random(seed).shuffle(kinds)
    return Draw(gaps, tuple(kinds), poisson)


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
    """The draw's requests at ``rate`` requests/s (``math.inf``: all at once): sent as vllm bench serve sends them,
    or a replayed trace's shape (first at 0)."""
    if d.poisson:
        times = send_times(d.gaps, rate)
    else:
        times, t = [], 0.0
        for i in range(len(d.kinds)):
            if i:
                t = t + d.gaps[i - 1] / rate if math.isfinite(rate) else 0.0
            times.append(t)
    return [Request(t, mix[k].prompt, output, mix[k].vit) for t, k in zip(times, d.kinds, strict=True)]


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
    host: HostTimeModel = HOST_FREE
    context_end: str = LONGEST

    def __post_init__(self) -> None:
        self._draw = draw(self.mix, self.requests, self.seed, self.arrivals)
        self._runs: dict[float, dict[str, Any]] = {}
        self._costs = StepCosts(self.engine, self.model, self.host, self.context_end)

    def at(self, rate: float) -> dict[str, Any]:
        if rate not in self._runs:
            reqs = requests_at(self.mix, self._draw, rate, self.output)
            trace = simulate(self.engine, self.model, reqs, costs=self._costs)
            self._runs[rate] = metrics(trace, start=0.0)
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
        return {**out, **_utilisation(0.0, saturated), "capacity_rps": 0.0, "unreachable": missed,
                "at_lightest": at_light}  # fmt: skip
    if not misses(load.at(top), slos):
        return {
            **out,
            **_utilisation(top, saturated),
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
    return {**out, **_utilisation(lo, saturated), "capacity_rps": lo,
            "binding": ", ".join(m["target"] for m in binding), "at_capacity": load.at(lo)}  # fmt: skip


def _utilisation(rate: float, saturated: float) -> dict[str, Any]:
    """The capacity as a share of saturation, and the warning when a finite run's tail is not to be trusted."""
    share = rate / saturated if saturated > 0 else 0.0
    near = NEAR_SATURATION_TEXT.format(NEAR_SATURATION) if share > NEAR_SATURATION else None
    return {"utilisation": share, "near_saturation": near}


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
