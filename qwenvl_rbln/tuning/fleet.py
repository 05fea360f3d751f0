"""``qvl tune --slo [--rate]``: each candidate's capacity under the latency targets, the replicas and NPUs a rate
needs, and the ranking by NPUs.

Each candidate is run through the serving simulator (``tuning.simulate``: vllm-rbln's optimum scheduler) on the
workload's own mix of requests (its images' ViT calls, packed into the candidate's buckets, and their LM tokens
plus --prompt-tokens), fed by the same figures tune ranks by (``MeasuredRoofline``: measured graphs where
timings.json has them, a MoE at its high end) through ``tuning.device_time``. ``tuning.capacity`` searches the
largest rate per replica that meets every target.

Every step is charged its host time too (``tuning.host_time``: timings.json's measured ``host_time`` entry, else
``host_time.DEFAULT``, named as this machine's measurement) and the sampler's device call (an
assumption, stated). Each row is ranked at the upper end of a decode step's cost (every row at the longest row's
context, as a MoE is ranked at its high end: a capacity promised at the lower end might not hold) and also sized
at the lower end (each row at its own context), shown beside it. Its NPU busy share at capacity (device time /
wall time) says how much of the card the host leaves unused.

Placement: vllm-rbln runs a request's ViT calls inside its prefill step whichever NPU they run on, so a replica
with the ViT on its own NPU serves no faster in the simulation and needs two NPUs per replica.
"""

from __future__ import annotations

import math
from typing import Any

from qwenvl_rbln.errors import DoesNotFit
from qwenvl_rbln.tuning.capacity import MAX_UTILISATION, Kind, Load, capacity, fleet, unreachable_text
from qwenvl_rbln.tuning.device_time import DeviceTimeModel, from_roofline
from qwenvl_rbln.tuning.host_time import section as host_section
from qwenvl_rbln.tuning.search import Checker, Config
from qwenvl_rbln.tuning.simulate import CONTEXT_ENDS, LONGEST, OWN, Engine
from qwenvl_rbln.tuning.workload import Work
from qwenvl_rbln.vision.buckets import select_bucket
from qwenvl_rbln.vision.packing import slot, uniform_packs

PERCENTILE_RULE = "numpy.percentile's default (linear), as vllm bench serve computes them"
SCHEDULER = (
    "vllm-rbln 0.11.1a1's optimum scheduler, simulated: one prefill at a time and first (ViT calls, then the "
    "prompt in prefill_chunk_size chunks), decode steps wait while it runs, up to batch_size requests on the "
    "smallest decoder graph that holds them, KV blocks admitted per request"
)
BUSY = "NPU busy share: device time (every graph call and the sampler) / wall time of the simulated run"
RANKED_END = (
    "ranked at the upper end (every decode row at the longest row's context), as a MoE at its high end: what an "
    "RBLN decode costs a shorter row is unknown, and a capacity promised at the lower end might not hold; the lower "
    "end (each row at its own context, the roofline's bound) is shown beside it"
)


def kinds(work: Work, buckets: list[int]) -> list[Kind]:
    """The workload's kinds of request under these ViT buckets: LM tokens and the packed ViT calls of each."""
    ordered = sorted(buckets)
    out: dict[tuple[int, tuple[int, ...]], float] = {}
    for (patches, segments, lm_tokens), count in sorted(work.mix.items()):
        bucket = select_bucket(slot(patches), ordered)
        if bucket is None:
            continue
        key = (lm_tokens + work.prompt_tokens, (bucket,) * uniform_packs(patches, segments, bucket))
        out[key] = out.get(key, 0.0) + count
    if not out:
        return [Kind(max(work.prompt_tokens, 1), (), 1.0)]
    return [Kind(prompt, vit, weight) for (prompt, vit), weight in out.items()]


def engine_for(cfg: Config, row: dict[str, Any], chunk: int) -> Engine:
    """The compiled facts the scheduler sees (the KV block is the partition: flash attention)."""
    full = cfg.batch * math.ceil(cfg.max_seq_len / cfg.partition)
    return Engine(
        batch=cfg.batch,
        chunk=chunk,
        block_size=cfg.partition,
        num_blocks=int(row.get("kv_blocks") or full),
        max_model_len=cfg.max_seq_len,
        graphs=tuple(row["decoder_batch_sizes"]),
    )


def time_model(checker: Checker, cfg: Config) -> DeviceTimeModel:
    roof = checker.roof.high_end()
    return from_roofline(roof, cfg.partition, roof.label())


def _figures(fig: dict[str, Any]) -> dict[str, Any]:
    keep = ("ttft", "tpot", "latency", "requests_per_s", "output_tokens_per_s", "preemptions", "npu_busy_share")
    return {k: fig[k] for k in keep}


def size_one(checker: Checker, cfg: Config, row: dict[str, Any]) -> dict[str, Any]:
    """One candidate's capacity under the targets (and, with --rate, its fleet), and with --rate the figures each
    replica shows at its share of the rate (the whole rate on one replica without targets); at the ranked (upper)
    end of a decode step's cost, and the same at the lower end under ``own_context``."""
    needs = checker.needs
    engine, model = engine_for(cfg, row, checker.roof.chunk), time_model(checker, cfg)
    mix = kinds(checker.work, checker.vit(cfg))
    run = (engine, model, mix, checker.work.output_tokens, needs.sim_requests, needs.seed, needs.arrivals)
    loads = {end: Load(*run, host=checker.host, context_end=end) for end in (LONGEST, OWN)}  # the estimate's own
    out: dict[str, Any] = {"host_time": "measured" if checker.host_measured else "this machine's default"}
    if needs.slos:
        out.update(_sized(loads[LONGEST], needs, row["npus"]))
        lower = _sized(loads[OWN], needs, row["npus"])
        out["own_context"] = {k: lower.get(k) for k in ("capacity_rps", "capacity_per_npu_rps", "npu_busy_share",
                                                          "binding", "replicas", "npus")}  # fmt: skip
    if needs.rate is not None:
        share = needs.rate / (out.get("replicas") or 1)
        out["at_rate"] = {"replica_rps": share, **_figures(loads[LONGEST].at(share))}
        own_share = needs.rate / ((out.get("own_context") or {}).get("replicas") or 1)
        out.setdefault("own_context", {})["at_rate"] = {"replica_rps": own_share, **_figures(loads[OWN].at(own_share))}
    return out


def _sized(load: Load, needs: Any, npus: int) -> dict[str, Any]:
    cap = capacity(load, list(needs.slos))
    out: dict[str, Any] = {
        "capacity_rps": cap["capacity_rps"],
        "capacity_per_npu_rps": cap["capacity_rps"] / npus,
        "npu_busy_share": (cap.get("at_capacity") or {}).get("npu_busy_share"),
        "saturation_rps": cap["saturation_rps"],
        "utilisation": cap.get("utilisation"),
        "near_saturation": cap.get("near_saturation"),
        "binding": cap.get("binding"),
        "unreachable": cap.get("unreachable"),
        "unreachable_text": unreachable_text(cap["unreachable"]) if cap.get("unreachable") else None,
        "at_capacity": _figures(cap["at_capacity"]) if "at_capacity" in cap else None,
        "at_lightest": _figures(cap["at_lightest"]) if "at_lightest" in cap else None,
    }
    if needs.rate is not None:
        out.update(fleet(cap["capacity_rps"], needs.rate, npus))
    return out


def _key(needs: Any, item: tuple[int, Config, dict[str, Any]]) -> tuple:
    i, _, row = item
    c = row["capacity"]
    reachable = c["capacity_rps"] > 0
    if needs.rate is not None:
        return (not reachable, c.get("npus") or 0, -c["capacity_per_npu_rps"], i)
    return (not reachable, -c["capacity_per_npu_rps"], i)


def size_candidates(
    checker: Checker, items: list[tuple[Config, dict[str, Any]]]
) -> tuple[list[tuple[Config, dict[str, Any]]], dict[str, Any], DoesNotFit | None]:
    """Every candidate sized and ranked (by NPUs for --rate, else by capacity per NPU); the document's
    ``capacity`` section; the error when no candidate meets the targets at any rate."""
    needs = checker.needs
    for cfg, row in items:
        row["capacity"] = size_one(checker, cfg, row)
    ranked = items
    if needs.slos:
        ranked = [
            (c, r) for _, c, r in sorted(((i, c, r) for i, (c, r) in enumerate(items)), key=lambda t: _key(needs, t))
        ]
    first_model = time_model(checker, items[0][0]) if items else None
    section: dict[str, Any] = {
        "targets": [s.text() for s in needs.slos],
        "rate_rps": needs.rate,
        "requests_per_run": len(needs.arrivals) if needs.arrivals else needs.sim_requests,
        "seed": needs.seed,
        "scheduler": SCHEDULER,
        "percentiles": PERCENTILE_RULE,
        "arrivals": "Poisson, sent as vllm bench serve --request-rate R --seed S sends them (N gamma delays, "
        "rescaled so the last leaves at N / R), one draw rescaled to each rate simulated"
        if needs.arrivals is None
        else f"the --arrivals trace ({len(needs.arrivals)} requests), its gaps scaled to each rate simulated",
        "search_top": f"{MAX_UTILISATION:.0%} of each candidate's saturation throughput" if needs.slos else None,
        "ranked_by": ("NPUs needed for --rate, then capacity per NPU" if needs.rate is not None else "capacity per NPU")
        if needs.slos
        else "the estimate (no --slo: the figures at --rate are predictions, not a ranking)",
        "time_model": first_model.name if first_model else None,
        "host_time": host_section(checker.host, checker.host_measured),
        "sampler": first_model.sampler_source if first_model else None,
        "decode_context": {"ranked": LONGEST, "also": OWN, "ends": dict(CONTEXT_ENDS), "rule": RANKED_END},
        "npu_busy_share": BUSY,
    }
    error = None
    if not needs.slos:
        return ranked, section, error
    if ranked and ranked[0][1]["capacity"]["capacity_rps"] <= 0:
        closest = min((r["capacity"]["unreachable"] for _, r in ranked), key=lambda m: max(x["over_ratio"] for x in m))
        error = DoesNotFit(
            f"no configuration meets the latency targets at any rate: {unreachable_text(closest)} (the closest "
            "candidate)",
            "relax that target, or serve shorter prompts or smaller images (the figures are in --json capacity)",
        )
    elif ranked:
        best = ranked[0][1]["capacity"]
        section["best"] = {k: best.get(k) for k in ("capacity_rps", "capacity_per_npu_rps", "replicas", "npus")}
    return ranked, section, error
