"""One candidate's estimate from the cost model: ViT time per request (packed), TTFT, TPOT per decoder graph and
at the batch trace, throughput and latency. Every number is a roofline bound unless a measured timing replaced it.

Serving model (vllm-rbln on one card for the LM): a request costs the LM card its prefill and its share of the
decode steps; with the ViT on the same card its ViT calls too, with the ViT on its own card they overlap (the two
cards pipeline, the slower one decides). Running batches above the compiled batch wait in the queue.

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
from typing import Any

from qwenvl_rbln.tuning.roofline import Roofline
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


def _at_load(
    work: Work, roof: Roofline, trace: dict[int, int], graphs: list[int], block: int, fixed: tuple[float, float, bool]
) -> dict[str, float]:
    """Throughput and latency with the running batches of ``trace``; ``fixed`` is (ViT s, prefill s, shared)."""
    vit_s, prefill_s, shared = fixed
    context = work.mean_input_tokens + work.output_tokens / 2  # mean tokens each row attends to while decoding
    steps = rows = step_time = 0.0
    for running, n in trace.items():
        g = select_bucket(running, graphs) or graphs[-1]
        steps += n
        rows += n * running
        step_time += n * roof.decode_step(g, running, context, block)
    per_token = step_time / rows  # decode seconds per generated token, shared by the running rows
    tpot = step_time / steps  # what one request waits per output token
    lm_per_request = prefill_s + work.output_tokens * per_token
    card_s = lm_per_request + vit_s if shared else max(lm_per_request, vit_s)
    requests_per_s = 1.0 / card_s if card_s else 0.0
    ttft = vit_s + prefill_s
    return {
        "ttft_s": ttft,
        "tpot_s": tpot,
        "mean_running_batch": rows / steps,
        "latency_s": ttft + work.output_tokens * tpot,
        "requests_per_s": requests_per_s,
        "output_tokens_per_s": requests_per_s * work.output_tokens,
        "lm_s_per_request": lm_per_request,
    }


def _one_end(
    work: Work, roof: Roofline, batch: int, graphs: list[int], vit_s: float, block: int, shared: bool, load: int | None
) -> dict[str, Any]:
    """Every figure at one end of the cost model: at the trace (or the full batch), and at the lighter load."""
    prefill_s, prefill_chunks = _prefill_per_request(work, roof, block)
    context = work.mean_input_tokens + work.output_tokens / 2
    fixed = (vit_s, prefill_s, shared)
    trace = clamp_trace(work.trace, batch) if work.trace else {batch: 1}
    out: dict[str, Any] = {
        "vit_s_per_request": vit_s,
        "prefill_s_per_request": prefill_s,
        "prefill_chunks_per_request": prefill_chunks,
        "prefill_s_per_chunk": prefill_s / prefill_chunks,
        "decode_graphs": [{"graph": g, "step_s": roof.decode_step(g, g, context, block)} for g in graphs],
        **_at_load(work, roof, trace, graphs, block, fixed),
    }
    if load is not None and not work.trace:
        light = _at_load(work, roof, {min(load, batch): 1}, graphs, block, fixed)
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
    load: int | None = None,
) -> dict[str, Any]:
    """The candidate's figures (seconds, tokens/s), as plain data: the headline ones at the high end of a MoE's
    range, ``moe_range`` with both ends, ``lighter_load`` at ``load`` running requests (no trace only)."""
    vit_s = vit_seconds_per_request(work, vit_buckets, roof.vit_call)
    ordered = sorted(graphs)
    high_roof = roof.high_end()
    low = _one_end(work, roof, batch, ordered, vit_s, block, shared, load)
    high = _one_end(work, high_roof, batch, ordered, vit_s, block, shared, load) if high_roof is not roof else low
    for g_low, g_high in zip(low["decode_graphs"], high["decode_graphs"], strict=True):
        g_high["tokens_per_s"] = g_high["graph"] / g_high["step_s"] if g_high["step_s"] > 0 else None
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
        "bottleneck": "ViT card" if not shared and vit_s > high["lm_s_per_request"] else "LM card",
        "label": roof.label(),
    }


def score(est: dict[str, Any], objective: str) -> float:
    """Lower is better: seconds per request for latency (at the full batch: the slowest TPOT the batch can see),
    the inverse of throughput for throughput, at the lighter load when there is one (else at the trace)."""
    if objective == "latency":
        value = est["latency_s"]
    else:
        tokens = (est.get("lighter_load") or est)["output_tokens_per_s"]
        value = 1.0 / tokens if tokens else float("inf")
    return value if math.isfinite(value) else float("inf")  # a figure that is not a number never ranks first
