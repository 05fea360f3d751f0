"""One candidate's estimate from the cost model: ViT time per request (packed), TTFT, TPOT per decoder graph and
at the batch trace, throughput and latency. Every number is a roofline bound unless a measured timing replaced it.

Serving model (vllm-rbln on one card for the LM): a request costs the LM card its prefill and its share of the
decode steps; with the ViT on the same card its ViT calls too, with the ViT on its own card they overlap (the two
cards pipeline, the slower one decides). Running batches above the compiled batch wait in the queue.
"""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.tuning.roofline import Roofline
from qwenvl_rbln.tuning.workload import Work, chunks, clamp_trace, vit_seconds_per_request
from qwenvl_rbln.vision.buckets import select_bucket


def _prefill_per_request(work: Work, roof: Roofline, block: int) -> tuple[float, float]:
    """(mean prefill seconds, mean prefill chunks) per request of the workload."""
    count = sum(work.chunks_hist.values())
    if not count:
        return roof.prefill(work.prompt_tokens, block), float(chunks(work.prompt_tokens, roof.chunk))
    seconds = sum(n * roof.prefill(t + work.prompt_tokens, block) for t, n in work.chunks_hist.items())
    pieces = sum(n * chunks(t + work.prompt_tokens, roof.chunk) for t, n in work.chunks_hist.items())
    return seconds / count, pieces / count


def estimate(
    work: Work,
    roof: Roofline,
    *,
    batch: int,
    graphs: list[int],
    vit_buckets: list[int],
    block: int,
    shared: bool,
) -> dict[str, Any]:
    """The candidate's figures (seconds, tokens/s), as plain data."""
    vit_s = vit_seconds_per_request(work, vit_buckets, roof.vit_call)
    prefill_s, prefill_chunks = _prefill_per_request(work, roof, block)
    context = work.mean_input_tokens + work.output_tokens / 2  # mean tokens each row attends to while decoding
    ordered = sorted(graphs)
    per_graph = [
        {
            "graph": g,
            "step_s": roof.decode_step(g, g, context, block),
            "tokens_per_s": g / roof.decode_step(g, g, context, block),
        }
        for g in ordered
    ]
    trace = clamp_trace(work.trace, batch) if work.trace else {batch: 1}
    steps = rows = step_time = 0.0
    for running, n in trace.items():
        g = select_bucket(running, ordered) or ordered[-1]
        t = roof.decode_step(g, running, context, block)
        steps += n
        rows += n * running
        step_time += n * t
    per_token = step_time / rows  # decode seconds per generated token, shared by the running rows
    tpot = step_time / steps  # what one request waits per output token
    lm_per_request = prefill_s + work.output_tokens * per_token
    card_s = lm_per_request + vit_s if shared else max(lm_per_request, vit_s)
    requests_per_s = 1.0 / card_s if card_s else 0.0
    ttft = vit_s + prefill_s
    return {
        "vit_s_per_request": vit_s,
        "prefill_s_per_request": prefill_s,
        "prefill_chunks_per_request": prefill_chunks,
        "prefill_s_per_chunk": prefill_s / prefill_chunks,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "decode_graphs": per_graph,
        "mean_running_batch": rows / steps,
        "latency_s": ttft + work.output_tokens * tpot,
        "requests_per_s": requests_per_s,
        "output_tokens_per_s": requests_per_s * work.output_tokens,
        "bottleneck": "ViT card" if not shared and vit_s > lm_per_request else "LM card",
        "label": roof.label(),
    }


def score(est: dict[str, Any], objective: str) -> float:
    """Lower is better: seconds per request for latency, the inverse of throughput for throughput."""
    if objective == "latency":
        return est["latency_s"]
    return 1.0 / est["output_tokens_per_s"] if est["output_tokens_per_s"] else float("inf")
