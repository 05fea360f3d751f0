"""Fixes for a plan that does not fit: each one re-runs the whole three-scenario estimate on changed settings
(quantization first, then context, batch, ViT placement, ViT bucket, memory_budget, KV blocks) and is offered only
when it fits.

Its own module because it is a search over estimates, not part of one.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from qwenvl_rbln.memory.context import Ctx, quant
from qwenvl_rbln.memory.estimate import evaluate
from qwenvl_rbln.memory.placement import device_list
from qwenvl_rbln.memory.report import FITS, MemoryReport, fmt_gib
from qwenvl_rbln.planning.lm.rules import kv_block_counts

# optimum-rbln 0.12 attention limits (planning.lm.rules.ATTENTION_LIMITS), for the max_seq_len suggestion.
_EAGER_MAX = {"REBEL": 16384, "ATOM": 32768}
_MIN_FLASH_LEN = 2048


def _with(resolved: Any, **changes: Any) -> Any:
    """A ResolvedLM with the derived fields (block, full/min blocks, decoder graphs) recomputed."""
    new = replace(resolved, **changes)
    block = new.max_seq_len if new.attn_impl != "flash_attn" else new.kvcache_block_size
    full, minimum = kv_block_counts(new.max_seq_len, block, new.batch_size, new.attn_impl)
    return replace(new, kvcache_block_size=block, num_full_blocks=full, num_min_blocks=minimum)


def _summary(report: MemoryReport) -> dict[str, Any]:
    return {
        "verdict": report.verdict,
        "fits": report.fits,
        "margin_bytes": report.margin_bytes,
        "margin_low_bytes": report.margin_low_bytes,
        "devices": [
            {
                "device": d.device,
                "verdict": d.verdict,
                "total_bytes": d.total_bytes,
                "total_high_bytes": d.total_high_bytes,
                "free_bytes": d.free_bytes,
                "free_low_bytes": d.usable_bytes - (d.total_high_bytes or d.total_bytes),
            }
            for d in report.devices
        ],
        "chiplet_margin_low_bytes": min(
            d.chiplets["usable_per_chiplet_bytes"] - d.chiplets.get("fullest_high_bytes", d.chiplets["fullest_bytes"])
            for d in report.devices
        ),
        "kv_blocks": report.kv["num_blocks"],
    }


def _sug(kind: str, text: str, sets: list[str], report: MemoryReport, **extra: Any) -> dict[str, Any]:
    """A fix is offered only when its own estimate fits in every scenario (margin to spare at the high end)."""
    return {
        "kind": kind,
        "text": text,
        "set": sets,
        "cli": " ".join(f"--set {s}" for s in sets),
        **_summary(report),
        **extra,
    }


def suggestions(ctx: Ctx, resolved: Any, placement: dict[str, Any], report: MemoryReport) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    lm_devs = device_list(placement["device"])
    vis_devs = device_list(placement.get("visual_device", placement["device"]))
    shared = bool(set(lm_devs) & set(vis_devs))
    flash = resolved.attn_impl == "flash_attn"
    auto = flash and not resolved.kvcache_num_blocks

    def run(res: Any = resolved, pl: dict[str, Any] = placement) -> MemoryReport:
        return evaluate(ctx, res, pl)

    if report.verdict == FITS:
        if shared and auto and report.kv["outcome"] == "partial":
            sug = _memory_budget_suggestion(ctx, resolved, placement, report, run, vis_devs)
            if sug:
                out.append(sug)
        return out

    # 0. without quantization: in optimum-rbln 0.12 it loads the model in float32, so it can be what breaks the plan
    sug = _drop_quantization_suggestion(resolved, run)
    if sug:
        out.append(sug)

    # 1. the largest max_seq_len (a multiple of the partition) that fits at this batch
    found = _largest_context(ctx, resolved, run)
    if found:
        out.append(_context_suggestion(resolved, *found))

    # 2. the largest batch that fits at this context
    for batch in range(resolved.batch_size - 1, 0, -1):
        dbs = sorted({b for b in resolved.decoder_batch_sizes if b <= batch} | {batch})
        res, block_sets = _explicit_blocks_follow(
            _with(resolved, batch_size=batch, decoder_batch_sizes=sorted(dbs, reverse=True)), resolved, flash
        )
        if res is None:
            continue
        rep = run(res)
        if rep.fits:
            out.append(
                _sug(
                    "batch_size",
                    f"batch_size={batch}: the largest batch that fits with max_seq_len {resolved.max_seq_len} "
                    f"(decoder graphs {dbs})",
                    [
                        f"batch_size={batch}",
                        "decoder_batch_sizes=" + "[" + ",".join(str(b) for b in dbs) + "]",
                        *block_sets,
                    ],
                    rep,
                )
            )
            break

    # 3. the ViT on its own NPU
    if shared:
        free_ids = [i for i in range(max(lm_devs + vis_devs) + len(vis_devs) + 1) if i not in lm_devs][: len(vis_devs)]
        new_vis: int | list[int] = free_ids if isinstance(placement.get("visual_device"), list) else free_ids[0]
        moved = {**placement, "visual_device": new_vis}
        rep = run(pl=moved)
        if rep.fits:
            value = "[" + ",".join(map(str, new_vis)) + "]" if isinstance(new_vis, list) else str(new_vis)
            out.append(
                _sug(
                    "visual_device",
                    f"move the ViT to an NPU of its own (device {value} is an example: any NPU the LM does not use); "
                    f"the LM and its KV cache keep device {placement['device']} (the documented remedy for large "
                    "batches at full context)",
                    [f"placement.visual_device={value}"],
                    rep,
                    placement={"device": moved["device"], "visual_device": new_vis},  # the whole estimated placement
                )
            )

    # 3b. a smaller largest ViT bucket (its workspace grows with S^2)
    sug = _vit_bucket_suggestion(resolved, placement, run)
    if sug:
        out.append(sug)

    # 4. a memory_budget that leaves room for the ViT (or for what --device-memory says is really there)
    if auto:
        sug = _memory_budget_suggestion(ctx, resolved, placement, report, run, vis_devs if shared else [])
        if sug:
            out.append(sug)

    # 5. an explicit block count that fits
    if flash and resolved.kvcache_num_blocks:
        for n in range(resolved.kvcache_num_blocks - 1, resolved.num_min_blocks - 1, -1):
            rep = run(replace(resolved, kvcache_num_blocks=n))
            if rep.fits:
                out.append(
                    _sug(
                        "kvcache_num_blocks",
                        f"kvcache_num_blocks={n}: the most KV blocks that fit (full {resolved.num_full_blocks}); fewer "
                        "than full means optimum-rbln's own generate() can run out of blocks on long batches",
                        [f"kvcache_num_blocks={n}"],
                        rep,
                    )
                )
                break

    # 6. nothing fits alone: a smaller top ViT bucket together with the largest context that then fits
    if not out:
        sug = _bucket_and_context_suggestion(ctx, resolved, placement, run)
        if sug:
            out.append(sug)
    return out


def _drop_quantization_suggestion(resolved: Any, run: Any) -> dict[str, Any] | None:
    """The plan without ``rbln_config.quantization``, offered first when that alone fits: 0.12 loads a quantized
    model in float32 (ViT, workspaces, unquantized parts and a non-fp8 KV cache double), so dropping it is the
    plain fix, where the others give up context, batch or image detail."""
    q = quant(resolved)
    if not q:
        return None
    rep = run(replace(resolved, quantization=None))
    if not rep.fits:
        return None
    return _sug(
        "quantization",
        f"drop rbln_config.quantization (weights={q['weights']}): the plan fits in bf16; optimum-rbln 0.12 loads a "
        "quantized model in float32, so the ViT, the workspaces and the parts it does not quantize take twice the "
        "memory",
        ["quantization=null"],
        rep,
    )


def rows_run_long(n: int) -> str:
    """'when its one row runs long' / 'when both rows run long' / 'when all 4 rows run long'."""
    if n == 1:
        return "when its one row runs long"
    return "when both rows run long" if n == 2 else f"when all {n} rows run long"


def _largest_context(ctx: Ctx, resolved: Any, run: Any) -> tuple[int, Any, MemoryReport, list[str]] | None:
    """(length, resolved, report, extra --sets) for the largest shorter max_seq_len that fits, else None."""
    flash = resolved.attn_impl == "flash_attn"
    if flash:
        step = resolved.kvcache_block_size
        candidates = [k * step for k in range(resolved.max_seq_len // step - 1, 1, -1)]
        candidates = [c for c in candidates if c >= _MIN_FLASH_LEN]
    else:
        top = min(resolved.max_seq_len - 1, _EAGER_MAX.get(ctx.spec.family, 16384))
        candidates = [c for c in range(top - top % 1024, 1023, -1024)]
    for length in candidates:
        res, block_sets = _explicit_blocks_follow(_with(resolved, max_seq_len=length), resolved, flash)
        if res is None:
            continue
        rep = run(res)
        if rep.fits:
            return length, res, rep, block_sets
    return None


def _context_suggestion(
    before: Any, length: int, res: Any, rep: MemoryReport, block_sets: list[str], also: list[str] | None = None
) -> dict[str, Any]:
    flash = before.attn_impl == "flash_attn"
    step = before.kvcache_block_size
    unit = f"{length // step} partitions of {step}" if flash else "eager"
    return _sug(
        "max_seq_len",
        f"max_seq_len={length}: the largest context ({unit}) that fits at batch {before.batch_size} "
        f"(KV {fmt_gib(rep.kv['bytes'])})",
        [f"max_seq_len={length}", *block_sets, *(also or [])],
        rep,
    )


def _bucket_and_context_suggestion(
    ctx: Ctx, resolved: Any, placement: dict[str, Any], run: Any
) -> dict[str, Any] | None:
    """When no single change fits: the largest top ViT bucket that fits beside the shortest context, then the
    largest context that fits beside that bucket (two --sets applied together)."""
    flash = resolved.attn_impl == "flash_attn"
    shortest = max(_MIN_FLASH_LEN, 2 * resolved.kvcache_block_size) if flash else 1024
    if shortest >= resolved.max_seq_len:
        return None
    small, _ = _explicit_blocks_follow(_with(resolved, max_seq_len=shortest), resolved, flash)
    if small is None:
        return None
    bucket = _vit_bucket_suggestion(small, placement, run)
    if bucket is None:
        return None
    vit = replace(resolved, vit_buckets=bucket["vit_buckets"])
    found = _largest_context(ctx, vit, run)
    if not found:
        return None
    length, res, rep, block_sets = found
    sug = _context_suggestion(resolved, length, res, rep, block_sets, also=bucket["set"])
    sug["kind"] = "max_seq_len+visual.max_seq_len"
    sug["text"] += f", together with {bucket['text']}"
    return sug


def _explicit_blocks_follow(res: Any, before: Any, flash: bool) -> tuple[Any | None, list[str]]:
    """With an explicit ``kvcache_num_blocks``, a smaller context or batch needs fewer blocks: keep the count
    at most the new full count (and say so as a --set); None when the count falls below the new minimum."""
    if not (flash and before.kvcache_num_blocks):
        return res, []
    n = min(before.kvcache_num_blocks, res.num_full_blocks)
    if n < res.num_min_blocks:
        return None, []
    if n == before.kvcache_num_blocks:
        return res, []
    return replace(res, kvcache_num_blocks=n), [f"kvcache_num_blocks={n}"]


def _vit_bucket_suggestion(resolved: Any, placement: dict[str, Any], run: Any) -> dict[str, Any] | None:
    """The largest top ViT bucket (a multiple of 4, at least 256 patches) that makes the plan fit: images above
    it are resized down to it by the processor's max_pixels, so it trades image detail for memory."""
    buckets = sorted(resolved.vit_buckets)
    top = buckets[-1]

    def with_top(size: int) -> Any:
        return replace(resolved, vit_buckets=sorted({b for b in buckets[:-1] if b < size} | {size}))

    lo, hi, best = 64, top // 4 - 1, None  # in units of 4 patches
    if hi < lo or not run(with_top(lo * 4)).fits:
        return None
    while lo <= hi:
        mid = (lo + hi) // 2
        if run(with_top(mid * 4)).fits:
            best, lo = mid * 4, mid + 1
        else:
            hi = mid - 1
    if best is None:
        return None
    new = with_top(best)
    rep = run(new)
    value = "[" + ",".join(str(b) for b in new.vit_buckets) + "]"
    return _sug(
        "visual.max_seq_len",
        f"visual.max_seq_len={value}: the largest top ViT bucket that fits ({best} patches, down from {top}); "
        f"images above {best * 256:,} pixels are resized down to it (processor max_pixels)",
        [f"visual.max_seq_len={value}"],
        rep,
        vit_buckets=new.vit_buckets,
    )


def _memory_budget_suggestion(
    ctx: Ctx, resolved: Any, placement: dict[str, Any], report: MemoryReport, run: Any, vis_devs: list[int]
) -> dict[str, Any] | None:
    lm_devs = device_list(placement["device"])
    dev = report.device(lm_devs[0])
    residents = sum(i.bytes for i in dev.items if not i.name.startswith("lm."))
    nominal = ctx.spec.usable_bytes
    ideal = (ctx.usable - residents) / nominal
    if ideal <= 0:
        return None
    coarse = [k / 20 for k in range(min(20, math.floor(ideal * 20)), 0, -1)]
    fine = [k / 100 for k in range(min(100, math.floor(ideal * 100)), 0, -1)]
    for fraction in coarse + fine:
        res = replace(resolved, memory_budget=round(fraction, 2))
        rep = run(res)
        if rep.fits and rep.kv["outcome"] in ("full", "partial"):
            n, full = rep.kv["num_blocks"], resolved.num_full_blocks
            why = (
                f"the ViT ({fmt_gib(residents)}) fits beside it"
                if vis_devs
                else f"it stays within the {fmt_gib(ctx.usable)} given with --device-memory"
            )
            trade = (
                f"it leaves {n} of {full} full KV blocks: fine for vllm-rbln (it pages blocks), but optimum-rbln's own "
                "generate() can run out of blocks ('No memory blocks are available for allocation') "
                + rows_run_long(resolved.batch_size)
                if n < full
                else f"all {full} full KV blocks still fit"
            )
            return _sug(
                "memory_budget",
                f"memory_budget={fraction:.2f}: optimum-rbln sizes the KV pool within {fraction:.0%} of "
                f"{fmt_gib(nominal)} ({fmt_gib(int(nominal * fraction))}) so {why}; trade: {trade}",
                [f"memory_budget={fraction:.2f}"],
                rep,
                full_blocks=full,
            )
    return None
