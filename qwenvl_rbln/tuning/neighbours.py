"""Why the others lost: each neighbour of the best configuration (one setting changed), checked and costed, with
the one reason it is not the answer; and, when no configuration meets the needs, the nearest ones and which need
each gives up.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from qwenvl_rbln.tuning.search import Checker, Config, Needs, largest, need_len, partitions_for

FASTER = (
    "tune keeps bucket-plan's --optimize buckets and --optimize-decoder graphs (fewest padded patches and rows); "
    "take this one with its --set"
)
TIE = (
    "ties go to fewer NPUs, the documented partition 8192, the smaller batch, then the larger binding margin "
    "(the card's or its fullest chiplet's, whichever is smaller)"
)


def _slower(
    best: dict[str, Any], other: dict[str, Any], objective: str, tie: str, src: str = "roofline estimate"
) -> str:
    pct = (other["score"] / best["score"] - 1) * 100 if best["score"] else 0.0
    light = (best.get("estimate") or {}).get("lighter_load")
    what = "latency" if objective == "latency" else "throughput"
    if light and objective != "latency":
        what = f"throughput at {light['concurrency']} requests in flight"
    if pct > 0.05:
        return f"slower by {pct:.1f} % ({what}, {src})"
    if pct < -0.05:  # only an alternative the search is bound not to take (bucket-plan's ViT buckets, graphs)
        return f"faster by {-pct:.1f} % ({what}, {src}), but {FASTER}"
    return f"no faster ({pct:+.1f} % {what}, {src}); {tie}"


def _lost(
    checker: Checker, best: dict[str, Any], cfg: Config, change: str, why: str | None = None, tie: str = TIE
) -> dict[str, Any]:
    row = checker.describe(cfg, change=change)
    row["meets_needs"] = row["counts"] and why is None  # an explicit why is a need it gives up (or a graph limit)
    if why is not None:
        row["why"] = why
    elif not row["counts"]:
        row["why"] = row["reason"]
    else:
        # with measured graphs in the cost model the comparison is no longer bound against bound: say so
        src = "estimate, some graphs measured" if checker.roof.used_measured else "roofline estimate"
        row["why"] = _slower(best, row, checker.needs.objective, tie, src)
    return row


def neighbours(checker: Checker, best_cfg: Config, best: dict[str, Any]) -> list[dict[str, Any]]:
    """One setting changed at a time: batch, context, partition, placement, ViT buckets, decoder graphs."""
    needs, work, out = checker.needs, checker.work, []
    b, p, length = best_cfg.batch, best_cfg.partition, best_cfg.max_seq_len
    out.append(_lost(checker, best, replace(best_cfg, batch=b + 1), f"batch_size {b + 1}"))
    if b > 1:
        low = replace(best_cfg, batch=b - 1)
        why = f"below the need: batch {b - 1} < --min-batch {needs.min_batch}" if b - 1 < needs.min_batch else None
        out.append(_lost(checker, best, low, f"batch_size {b - 1}", why))
    if length - p >= 2 * p:
        short = replace(best_cfg, max_seq_len=length - p)
        out.append(
            _lost(
                checker,
                best,
                short,
                f"max_seq_len {length - p}",
                f"context too short: {length - p} < --context {needs.context}",
            )
        )
    longer = replace(best_cfg, max_seq_len=length + p)
    if length + p <= checker.max_position:
        row = _lost(checker, best, longer, f"max_seq_len {length + p}")
        if row["counts"]:
            row["why"] = "longer than needed: no faster, and more KV memory (less margin)"
        out.append(row)
    for q in partitions_for(needs, checker.max_position):
        if q != p:
            other = replace(best_cfg, partition=q, max_seq_len=need_len(needs.context, q))
            out.append(_lost(checker, best, other, f"kvcache_partition_len {q}"))
    flip = replace(best_cfg, split=not best_cfg.split)
    if flip.split and needs.devices < 2:
        row = _lost(checker, best, flip, "ViT on device 1", "needs a second NPU: pass --devices 2")
        out.append(row)
    else:
        out.append(_lost(checker, best, flip, "ViT on device 1" if flip.split else "ViT beside the LM (device 0)"))
    for name, base in (work.vit_section.get("baselines") or {}).items():
        buckets = tuple(base.get("buckets") or [])
        if buckets and list(buckets) != checker.vit(best_cfg):
            change = f"ViT buckets {list(buckets)} ({name})"
            out.append(_lost(checker, best, replace(best_cfg, vit=buckets), change, _too_many(buckets, needs)))
    graphs = checker.graphs(best_cfg)
    for label, alt in (("single graph", (b,)), ("powers of two", None)):
        if alt is None:
            from qwenvl_rbln.vision.buckets import decoder_powers_of_two

            alt = tuple(decoder_powers_of_two(b))
        if list(alt) != graphs:
            tie = "decode is weight-bound, so padded rows cost little time; the chosen graphs compute the fewest rows"
            change = f"decoder graphs {list(alt)} ({label})"
            row = _lost(checker, best, replace(best_cfg, graphs=alt), change, _too_many(alt, needs), tie=tie)
            out.append(row)
    return out


def _too_many(graphs: tuple[int, ...], needs: Needs) -> str | None:
    """More compiled graphs than --max-buckets allows: that, not its speed, is why it is not the answer."""
    if len(graphs) > needs.max_buckets:
        return f"{len(graphs)} graphs > --max-buckets {needs.max_buckets} (each is a compiled graph)"
    return None


def nearest(checker: Checker) -> list[dict[str, Any]]:
    """When nothing meets the needs: the configurations closest to them, each naming the need it gives up."""
    needs: Needs = checker.needs
    out: list[dict[str, Any]] = []
    parts = partitions_for(needs, checker.max_position)
    if not parts:
        return out
    p = parts[0]
    length = need_len(needs.context, p)
    for split in (False, True):
        at_need = Config(split, p, length, needs.min_batch)
        extra = ["a second NPU (--devices 2)"] if split and needs.devices < 2 else []
        bmax = largest(lambda b, s=split: checker.fits(Config(s, p, length, b)), 1, needs.min_batch)
        if bmax >= needs.min_batch:
            if extra:
                out.append(checker.describe(at_need, gives_up=extra))
            continue
        if bmax >= 1:
            gives = [f"batch: {bmax} < --min-batch {needs.min_batch}", *extra]
            out.append(checker.describe(Config(split, p, length, bmax), gives_up=gives))
        options = [x for x in (_longest(checker, replace(at_need, partition=q)) for q in parts) if x]
        longest = max(options, key=lambda x: x[0], default=None)
        if longest and longest[0] < length:
            gives = [f"context: {longest[0]} < --context {needs.context}", *extra]
            out.append(checker.describe(longest[1], gives_up=gives))
        if not split:
            out.extend(_budget(checker, at_need))
    from qwenvl_rbln.tuning.smaller import smaller_images

    return out + smaller_images(checker)


def _longest(checker: Checker, cfg: Config) -> tuple[int, Config] | None:
    """The longest context that fits with this partition, as (length, configuration)."""
    found = checker.longest(replace(cfg, max_seq_len=2 * cfg.partition))
    return (found, replace(cfg, max_seq_len=found)) if found else None


def _budget(checker: Checker, cfg: Config) -> list[dict[str, Any]]:
    """The planner's own memory_budget fix for the shared card: the batch and context kept, fewer KV blocks."""
    for sug in checker.check(cfg, suggest=True).get("suggestions") or []:
        if sug.get("kind") != "memory_budget":
            continue
        fraction = float(sug["set"][0].split("=", 1)[1])
        budget = replace(cfg, memory_budget=fraction)
        row = checker.describe(budget)
        if not row["counts"]:
            continue
        blocks, full = row["kv_blocks"], row["full_kv_blocks"]
        per_row = cfg.max_seq_len // cfg.partition
        row["gives_up"] = [
            f"KV blocks: {blocks} of {full} full (memory_budget {fraction:.2f}): {blocks // per_row} of "
            f"{cfg.batch} rows can hold the full context at once"
        ]
        return [row]
    return []
