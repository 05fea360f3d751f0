"""One candidate's estimate from the cost model: ViT time per request (packed), TTFT, TPOT per decoder graph and
at the batch trace, throughput and latency. Every number is a roofline bound unless a measured timing replaced it.

Serving model (vllm-rbln on one card for the LM): a request costs the LM card its prefill and its share of the
decode steps; with the ViT on the same card its ViT calls too, with the ViT on its own card they overlap (the two
cards pipeline, the slower one decides). Running batches above the compiled batch wait in the queue.

Every engine step is also charged what the serving simulator (``tuning.simulate``) charges it, from the same
figures: the sampler's NPU call (``Roofline.sampler_call``: one row for a prefill, the running rows padded to the
sampler's bucket for a decode, ``simulate.sampler_rows``; an assumption, ``roofline.SAMPLER_ASSUMPTION``) and the
host's own time (``host_time.HostTimeModel``, the one ``host_time.for_prediction`` gives: a prefill step by its
tokens and ViT calls, a decode step by its running rows), during which the NPU waits. Graph figures
(``decode_graphs[].step_s``, ``prefill_s_per_request``) are the graph calls alone; TTFT, TPOT, throughput and
latency include both. ``npu_busy_share`` is device time / (device + host time) per request.

Two corrections to a single figure (docs/tuning.md, "The cost model"):
- a MoE model's figures are a range: ``low`` with only the routed experts computed and read, ``high`` with every
  expert (a dense ``custom_moe_glu``). The headline figures, and so the ranking, are the high end: the one a
  deployment can count on until a measured timing (which is the same at both ends) says otherwise.
- without a batch trace the running batch is assumed to be the compiled batch on every step, which makes the
  largest batch the fastest by construction. The estimate also gives the figures at a lighter load (``load``:
  a declared concurrency, or half the largest batch that fits), and the throughput objective ranks by that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from qwenvl_rbln.tuning.host_time import HostTimeModel
from qwenvl_rbln.tuning.roofline import Roofline
from qwenvl_rbln.tuning.simulate import sampler_rows
from qwenvl_rbln.tuning.workload import Work, chunks, clamp_trace, vit_seconds_per_request
from qwenvl_rbln.vision.buckets import select_bucket

RANGED = ("ttft_s", "tpot_s", "latency_s", "output_tokens_per_s", "prefill_s_per_request", "prefill_s_per_chunk")
FULL_BATCH = "without a batch trace every decode step is assumed to run the full compiled batch"


def _prefill_per_request(work: Work, roof: Roofline, block: int) -> tuple[float, float]:
    """(mean prefill seconds, mean prefill chunks) per request of the workload."""
    count = sum(work.chunks_hist.values())
    if not count:
        return roof.prefill(work.prompt_tokens, block), float(chunks(work.prompt_tokens, roof.chunk))
    seconds = sum(n * roof.prefill(t + work.prompt_tokens, block) for t, n in work.chunks_hist.items())
    pieces = sum(n * chunks(t + work.prompt_tokens, roof.chunk) for t, n in work.chunks_hist.items())
    return seconds / count, pieces / count


@dataclass(frozen=True)
class _Fixed:
    """What a request costs outside its decode steps: its ViT calls, and its prefill step's chunks, sampler call (one
    row) and host time; ``shared``: the ViT on the LM's card."""

    vit_s: float
    prefill_s: float
    sampler_s: float
    host_s: float
    shared: bool
    front_s: float = 0.0  # the API server's own time before the scheduler: in TTFT, not on the card

    @property
    def ttft(self) -> float:
        return self.front_s + self.vit_s + self.prefill_s + self.sampler_s + self.host_s


@dataclass(frozen=True)
class _Step:
    """A decoder's step costs: the graph (by the roofline end), the sampler and the host; the same at every load."""

    roof: Roofline
    host: HostTimeModel
    graphs: list[int]
    batch: int
    block: int

    def __call__(self, running: int, context: float) -> tuple[float, float, float]:
        """(graph, sampler, host) seconds of one decode step of ``running`` rows."""
        g = select_bucket(running, self.graphs) or self.graphs[-1]
        graph = self.roof.decode_step(g, running, context, self.block)
        return graph, self.roof.sampler_call(sampler_rows(running, self.graphs, self.batch)), self.host.decode(running)


def _at_load(work: Work, step: _Step, trace: dict[int, int], fixed: _Fixed) -> dict[str, float]:
    """Throughput and latency with the running batches of ``trace``: every step's graph, sampler and host time."""
    context = work.mean_input_tokens + work.output_tokens / 2  # mean tokens each row attends to while decoding
    steps = rows = graph_s = sampler_s = host_s = 0.0
    for running, n in trace.items():
        graph, sampler, host = step(running, context)
        steps += n
        rows += n * running
        graph_s, sampler_s, host_s = graph_s + n * graph, sampler_s + n * sampler, host_s + n * host
    step_time = graph_s + sampler_s + host_s
    per_token = step_time / rows  # decode seconds per generated token, shared by the running rows
    tpot = step_time / steps  # what one request waits per output token
    lm_per_request = fixed.prefill_s + fixed.sampler_s + fixed.host_s + work.output_tokens * per_token
    card_s = lm_per_request + fixed.vit_s if fixed.shared else max(lm_per_request, fixed.vit_s)
    requests_per_s = 1.0 / card_s if card_s else 0.0
    device = fixed.vit_s + fixed.prefill_s + fixed.sampler_s + work.output_tokens * (graph_s + sampler_s) / rows
    host_per_request = fixed.host_s + work.output_tokens * host_s / rows
    return {
        "ttft_s": fixed.ttft,
        "tpot_s": tpot,
        "mean_running_batch": rows / steps,
        "latency_s": fixed.ttft + work.output_tokens * tpot,
        "requests_per_s": requests_per_s,
        "output_tokens_per_s": requests_per_s * work.output_tokens,
        "decode_sampler_s_per_step": sampler_s / steps,
        "decode_host_s_per_step": host_s / steps,
        "device_s_per_request": device,
        "host_s_per_request": host_per_request,
        "npu_busy_share": device / (device + host_per_request) if device + host_per_request > 0 else None,
        "lm_s_per_request": lm_per_request,
    }


def _one_end(work: Work, step: _Step, vit: tuple[float, float], shared: bool, load: int | None) -> dict[str, Any]:
    """Every figure at one end of the cost model: at the trace (or the full batch), and at the lighter load.
    ``vit``: (ViT seconds, ViT calls) per request."""
    roof, batch, graphs = step.roof, step.batch, step.graphs
    prefill_s, prefill_chunks = _prefill_per_request(work, roof, step.block)
    # one prefill step per request; the host-time model is linear, so the mean request's tokens and calls are exact
    prefill_host = step.host.prefill(work.mean_input_tokens, vit[1])
    fixed = _Fixed(vit[0], prefill_s, roof.sampler_call(1), prefill_host, shared, step.host.front(vit[1]))
    context = work.mean_input_tokens + work.output_tokens / 2
    trace = clamp_trace(work.trace, batch) if work.trace else {batch: 1}
    decode_graphs = []
    for g in graphs:
        graph, sampler, host = step(g, context)
        decode_graphs.append({"graph": g, "step_s": graph, "sampler_s": sampler, "host_s": host})
    out: dict[str, Any] = {
        "vit_s_per_request": vit[0],
        "vit_calls_per_request": vit[1],
        "prefill_s_per_request": prefill_s,
        "prefill_chunks_per_request": prefill_chunks,
        "prefill_s_per_chunk": prefill_s / prefill_chunks,
        "prefill_sampler_s": fixed.sampler_s,
        "prefill_host_s": fixed.host_s,
        "decode_graphs": decode_graphs,
        **_at_load(work, step, trace, fixed),
    }
    if load is not None and not work.trace:
        light = _at_load(work, step, {min(load, batch): 1}, fixed)
        out["lighter"] = {"concurrency": load, "running_batch": min(load, batch), **light}
    return out


def _span(low: float, high: float) -> dict[str, float]:
    return {"low": min(low, high), "high": max(low, high)}


def _ranges(low: dict[str, Any], high: dict[str, Any]) -> dict[str, Any] | None:
    """{figure: {low, high}} where the two ends differ; None for a dense model or a fully measured one."""
    out: dict[str, Any] = {k: _span(low[k], high[k]) for k in RANGED if abs(low[k] - high[k]) > 1e-15}
    if "lighter" in low:
        light = {k: _span(low["lighter"][k], high["lighter"][k]) for k in RANGED if k in low["lighter"]}
        out["lighter"] = {k: v for k, v in light.items() if v["high"] - v["low"] > 1e-15} or None
    return out if any(v for v in out.values()) else None


def estimate(
    work: Work,
    roof: Roofline,
    *,
    batch: int,
    graphs: list[int],
    vit_buckets: list[int],
    block: int,
    shared: bool,
    host: HostTimeModel,
    load: int | None = None,
) -> dict[str, Any]:
    """The candidate's figures (seconds, tokens/s), as plain data: the headline ones at the high end of a MoE's
    range, ``moe_range`` with both ends, ``lighter_load`` at ``load`` running requests (no trace only). ``host``
    is required: a prediction never leaves the host's time at 0 in silence (``host_time.HOST_FREE`` says so)."""
    vit = (vit_seconds_per_request(work, vit_buckets, roof.vit_call), vit_seconds_per_request(work, vit_buckets, _one))
    ordered = sorted(graphs)
    high_roof = roof.high_end()
    low = _one_end(work, _Step(roof, host, ordered, batch, block), vit, shared, load)
    high = low
    if high_roof is not roof:
        high = _one_end(work, _Step(high_roof, host, ordered, batch, block), vit, shared, load)
    for g_low, g_high in zip(low["decode_graphs"], high["decode_graphs"], strict=True):
        whole = g_high["step_s"] + g_high["sampler_s"] + g_high["host_s"]
        g_high["tokens_per_s"] = g_high["graph"] / whole if whole > 0 else None  # the graph, sampler and host
        differ = abs(g_low["step_s"] - g_high["step_s"]) > 1e-15  # not a dense model, nor a measured graph
        g_high["step_s_range"] = _span(g_low["step_s"], g_high["step_s"]) if differ else None
    moe_range = _ranges(low, high) if high is not low else None
    lighter = high.get("lighter")
    return {
        **{k: v for k, v in high.items() if k not in ("lm_s_per_request", "lighter")},
        "moe_range": moe_range,
        "load": {
            "assumption": None if work.trace else FULL_BATCH,
            "ranked_at": "batch trace" if work.trace else ("lighter load" if lighter else "full batch"),
        },
        "lighter_load": {k: v for k, v in lighter.items() if k != "lm_s_per_request"} if lighter else None,
        "bottleneck": "ViT card" if not shared and vit[0] > high["lm_s_per_request"] else "LM card",
        "label": roof.label(),
    }


def _one(_bucket: int) -> float:
    """A ViT call counted once (``vit_seconds_per_request`` with it gives the packed calls per request)."""
    return 1.0


def score(est: dict[str, Any], objective: str) -> float:
    """Lower is better: seconds per request for latency (at the full batch: the slowest TPOT the batch can see),
    the inverse of throughput for throughput, at the lighter load when there is one (else at the trace)."""
    if objective == "latency":
        value = est["latency_s"]
    else:
        tokens = (est.get("lighter_load") or est)["output_tokens_per_s"]
        value = 1.0 / tokens if tokens else float("inf")
    return value if math.isfinite(value) else float("inf")  # a figure that is not a number never ranks first
