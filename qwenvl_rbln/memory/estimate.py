"""One estimate: each scenario's items per device, whether each device fits and why not, and the three
scenarios folded into a verdict per device (or the verdict the product document observed).

Its own module because the suggestions re-run exactly this on changed settings.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from qwenvl_rbln.memory.binding import decided_by, describe
from qwenvl_rbln.memory.calibration import model_key
from qwenvl_rbln.memory.chiplets import chiplet_view
from qwenvl_rbln.memory.context import Ctx, quant
from qwenvl_rbln.memory.items import build_lm_items, build_visual_items, items_by_device
from qwenvl_rbln.memory.moe import moe_notes
from qwenvl_rbln.memory.placement import device_list
from qwenvl_rbln.memory.report import (
    ASSUMPTIONS,
    DOES_NOT_FIT,
    FITS,
    SOURCE_OVERRIDE,
    SOURCE_SPEC,
    UNCERTAIN,
    DeviceMemory,
    MemoryItem,
    MemoryReport,
    fmt_gib,
)
from qwenvl_rbln.planning.catalogue.devices import GiB
from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_2B

SCENARIOS = ("low", "mid", "high")

SEED_DOC = "the product document (Qwen3-VL-2B on Rebel100, shared/seed)"
# (batch_size, max_seq_len, ViT shares the LM's card) -> (verdict, what the document says).
OBSERVED = {
    (1, 262144, True): (
        FITS,
        f"{SEED_DOC}: the Model Zoo baseline (batch 1, max_seq_len 262144, ViT bucket 16384) loads ViT, LM graphs "
        "and KV cache on one NPU (device 0)",
    ),
    (4, 262144, True): (
        DOES_NOT_FIT,
        f"{SEED_DOC}: at batch_size=4 the 262,144-token context does not fit on one Rebel100 together with the ViT; "
        "loading fails with 'Failed to create RBLN runtime ... Lack of device memory'",
    ),
    (4, 32768, True): (
        FITS,
        f"{SEED_DOC}: at batch_size=4 with max_seq_len 32,768 both submodules load together on one NPU",
    ),
    (4, 262144, False): (
        FITS,
        f"{SEED_DOC}: to keep the full context at a larger batch, place the ViT on another NPU (the documented remedy)",
    ),
}


def observed_case(ctx: Ctx, resolved: Any, placement: dict[str, Any]) -> tuple[str, str] | None:
    """(verdict, citation) when the product document's observations decide the configuration, else None.

    The document's cases: Qwen3-VL-2B in bf16 on RBLN-CR13 with its nominal DRAM, ViT bucket 16384, flash
    attention with partition 8192 and prefill chunk 512, automatic (or the full) KV blocks, no memory_budget,
    num_devices 1 (OBSERVED). A configuration of the same kind that needs no more memory than one observed to
    fit (batch, context, largest ViT bucket and decoder graphs all at most its) fits; one that needs at least as
    much as the one observed to fail (batch >= 4 at the full 262144 context beside a ViT bucket >= 16384) fails.
    Smaller ViT buckets beside the largest add no buffer (one .rbln, the largest decides)."""
    r = resolved
    lm_devs = device_list(placement["device"])
    vis_devs = device_list(placement.get("visual_device", placement["device"]))
    if (
        ctx.usable_source != SOURCE_SPEC
        or ctx.spec.sku != "RBLN-CR13"
        or ctx.dtype_bytes != 2
        or model_key(ctx.geometry) != model_key(QWEN3_VL_2B)
        or quant(r)
        or getattr(r, "use_attention_mask", False)
        or r.attn_impl != "flash_attn"
        or r.kvcache_block_size != 8192
        or r.prefill_chunk_size != 512
        or r.kvcache_num_blocks not in (0, r.num_full_blocks)  # an explicit full count compiles the same pool
        or r.memory_budget is not None
        or r.num_devices != 1
        or r.visual_num_devices != 1
        or len(lm_devs) != 1
        or len(vis_devs) != 1
    ):
        return None
    shared, top = lm_devs == vis_devs, max(r.vit_buckets)
    exact = list(r.vit_buckets) == [16384]
    for (batch, length, on_one_card), (verdict, source) in OBSERVED.items():
        if on_one_card != shared:
            continue
        graphs = {1} if batch == 1 else {1, 2, 4}
        same = exact and r.batch_size == batch and r.max_seq_len == length and set(r.decoder_batch_sizes) <= graphs
        if same:
            return verdict, source
        if verdict == FITS:
            smaller = r.batch_size <= batch and r.max_seq_len <= length and top <= 16384
            if smaller and set(r.decoder_batch_sizes) <= graphs:
                return verdict, (
                    f"{source} (this configuration needs no more memory: batch {r.batch_size} <= {batch}, "
                    f"max_seq_len {r.max_seq_len} <= {length}, largest ViT bucket {top} <= 16384)"
                )
        elif r.batch_size >= batch and r.max_seq_len >= length and top >= 16384:
            return verdict, (
                f"{source} (this configuration needs at least as much: batch {r.batch_size} >= {batch}, "
                f"max_seq_len {r.max_seq_len}, largest ViT bucket {top} >= 16384)"
            )
    return None


def evaluate(ctx: Ctx, resolved: Any, placement: dict[str, Any]) -> MemoryReport:
    """The estimate, its low / high ranges from the two other scenarios, and a verdict per device."""
    runs = {s: _estimate(replace(ctx, scenario=s), resolved, placement) for s in SCENARIOS}
    report = runs["mid"]
    observed = observed_case(ctx, resolved, placement)
    low_kv, high_kv = runs["low"].kv["num_blocks"], runs["high"].kv["num_blocks"]
    report.kv["num_blocks_range"] = [min(low_kv, high_kv, report.kv["num_blocks"]), max(low_kv, high_kv)]
    for dev in report.devices:
        others = [run.device(dev.device) for run in runs.values()]
        for item in dev.items:
            sizes = [next((i.bytes for i in o.items if i.name == item.name), item.bytes) for o in others]
            item.low_bytes, item.high_bytes = min(sizes), max(sizes)
        totals = [o.total_bytes for o in others]
        dev.total_low_bytes, dev.total_high_bytes = min(totals), max(totals)
        oks = [o.ok for o in others]
        dev.verdict = FITS if all(oks) else DOES_NOT_FIT if not any(oks) else UNCERTAIN
        split = _split_here(resolved, placement, dev.device)
        if split and dev.verdict == FITS:
            dev.verdict = UNCERTAIN
            dev.notes.append(
                f"at most uncertain: {' and '.join(split)} on this device, and optimum-rbln splits nothing in Python "
                "(modeling_base.py passes num_devices to rebel.compile_from_torch): the compiler decides the "
                "split, so the planner cannot vouch for it (it fits even with norms, lm_head and inputs whole on "
                "every device)"
            )
        chip_high = max(o.chiplets["fullest_bytes"] for o in others)
        chip_low = min(o.chiplets["fullest_bytes"] for o in others)
        dev.chiplets["fullest_low_bytes"], dev.chiplets["fullest_high_bytes"] = chip_low, chip_high
        if observed:
            verdict, source = observed
            if verdict != dev.verdict:
                dev.notes.append(
                    f"the planner alone says {dev.verdict.replace('_', ' ')} (margin "
                    f"{(dev.usable_bytes - dev.total_high_bytes) / GiB:+.2f} .. "
                    f"{(dev.usable_bytes - dev.total_low_bytes) / GiB:+.2f} GiB); the observed verdict is kept"
                )
            dev.verdict, dev.verdict_source = verdict, "observed: " + source
        dev.decided_by = decided_by(dev.to_dict(), report.kv)
        if not observed and dev.verdict == UNCERTAIN:
            if not dev.ok:  # the estimate's failure note is one scenario's, not the verdict
                dev.notes[0] = "at the estimate: " + dev.notes[0]
            dev.notes.append(
                f"uncertain: {describe(dev.to_dict(), UNCERTAIN)} (the worst margin with every modelled item at "
                "its high end, the best at its low end); calibrate with `qvl load-check` on the NPU host, or take a "
                "suggestion that fits"
            )
        dev.fits = {FITS: True, DOES_NOT_FIT: False, UNCERTAIN: None}[dev.verdict]
    return report


def _split_here(resolved: Any, placement: dict[str, Any], dev: int) -> list[str]:
    """The submodules compiled for more than one device that have a share on ``dev``."""
    lm_devs = device_list(placement["device"])
    vis_devs = device_list(placement.get("visual_device", placement["device"]))
    out = []
    if getattr(resolved, "num_devices", 1) > 1 and dev in lm_devs:
        out.append(f"the LM split over num_devices={resolved.num_devices}")
    if getattr(resolved, "visual_num_devices", 1) > 1 and dev in vis_devs:
        out.append(f"the ViT split over visual.num_devices={resolved.visual_num_devices}")
    return out


def _failure_note(
    ctx: Ctx, resolved: Any, items: list[MemoryItem], kv: dict[str, Any], chip: dict[str, Any], has: tuple[bool, bool]
) -> str:
    """Why a device that does not fit fails; ``has`` = (LM here, ViT here)."""
    has_lm, has_vis = has
    n_blocks, total = kv["num_blocks"], sum(i.bytes for i in items)
    if has_lm and kv["outcome"] == "insufficient":
        return (
            f"optimum-rbln's compile fails: 'Insufficient memory for the required KV cache: only {n_blocks} "
            f"blocks can be allocated, but at least {resolved.num_min_blocks} blocks are required'"
        )
    if total <= ctx.usable and not chip["fits"]:  # the card total fits: the fullest chiplet is what binds
        return (
            f"the fullest chiplet is over ({fmt_gib(chip['fullest_bytes'])} of "
            f"{fmt_gib(chip['usable_per_chiplet_bytes'])}) although the card total fits ({fmt_gib(total)} of "
            f"{fmt_gib(ctx.usable)}): a single tensor is placed whole on one chiplet"
        )
    if has_lm and has_vis and kv["mode"] == "auto":
        lm_only = sum(i.bytes for i in items if i.name.startswith("lm."))
        vis_only = total - lm_only
        lead = (
            "auto KV sizing filled the card before the ViT loads"
            if kv["outcome"] == "partial"
            else "auto KV sizing left no room for the ViT"
        )
        return (
            f"{lead}: optimum-rbln sized the KV pool "
            f"({n_blocks} blocks, {fmt_gib(kv['bytes'])}) for the LM alone ({fmt_gib(lm_only)} of "
            f"{fmt_gib(kv.get('budget_bytes', ctx.usable))} budget); the ViT on the same device needs "
            f"{fmt_gib(vis_only)} more, so loading fails with 'Failed to create RBLN runtime ... "
            "Lack of device memory'"
        )
    if has_lm and kv["mode"] == "auto" and ctx.usable_source == SOURCE_OVERRIDE:
        return (
            f"auto KV sizing aims at optimum-rbln's nominal {fmt_gib(ctx.spec.usable_bytes)}, not the "
            f"{fmt_gib(ctx.usable)} given with --device-memory"
        )
    return (
        f"needs {fmt_gib(total)} of {fmt_gib(ctx.usable)} usable (fullest chiplet {fmt_gib(chip['fullest_bytes'])} "
        f"of {fmt_gib(chip['usable_per_chiplet_bytes'])}): loading fails with 'Failed to create RBLN runtime ... "
        "Lack of device memory'"
    )


def _device_memory(
    ctx: Ctx,
    resolved: Any,
    dev: int,
    items: list[MemoryItem],
    kv: dict[str, Any],
    tensor_bytes: int,
    has: tuple[bool, bool],
) -> DeviceMemory:
    """One device in one scenario: its chiplet view, whether it fits (``ok``) and the notes that say why."""
    chip = chiplet_view(ctx, items, kv, tensor_bytes)
    total = sum(i.bytes for i in items)
    has_lm = has[0]
    insufficient = kv["outcome"] == "insufficient"
    ok = total <= ctx.usable and chip["fits"] and not (insufficient and has_lm)
    notes: list[str] = []
    if not ok:  # an insufficient KV pool on an LM device is never ok
        notes.append(_failure_note(ctx, resolved, items, kv, chip, has))
    if has_lm and kv["outcome"] == "partial" and ok:
        notes.append(
            f"only {kv['num_blocks']} of {resolved.num_full_blocks} full KV blocks: fine for vllm-rbln (it pages "
            "blocks); optimum-rbln's own generate() can run out of blocks when every row runs long"
        )
    return DeviceMemory(dev, ctx.usable, items, chip, ok, notes, ok=ok)


def _report_notes(ctx: Ctx, resolved: Any) -> list[str]:
    """Notes on the whole report: a --device-memory override, a quantized model."""
    notes: list[str] = []
    if ctx.usable_source == SOURCE_OVERRIDE:
        notes.append(
            f"usable bytes per device from --device-memory ({fmt_gib(ctx.usable)}); optimum-rbln's own auto KV "
            f"sizing still assumes {fmt_gib(ctx.spec.usable_bytes)}"
        )
    q = quant(resolved)
    if q:
        notes.append(
            f"quantization weights={q['weights']} activations={q['activations']} kv_caches={q['kv_caches']}: "
            "optimum-rbln 0.12 loads a quantized model in float32 (rbln_quantization.get_quantized_model), so the "
            "unquantized parts, the ViT and a non-fp8 KV cache are fp32; modelled from the source, not measured"
        )
    return notes


def _estimate(ctx: Ctx, resolved: Any, placement: dict[str, Any]) -> MemoryReport:
    """One scenario: the items per device and whether each device fits (``ok``); no verdict, no ranges."""
    lm_devs = device_list(placement["device"])
    vis_devs = device_list(placement.get("visual_device", placement["device"]))
    lm_items, kv, tensor_bytes = build_lm_items(ctx, resolved, len(lm_devs))
    vis_items = build_visual_items(ctx, resolved, len(vis_devs))
    by_dev = items_by_device(lm_items, vis_items, lm_devs, vis_devs)
    devices = [
        _device_memory(ctx, resolved, dev, by_dev[dev], kv, tensor_bytes, (dev in lm_devs, dev in vis_devs))
        for dev in sorted(by_dev)
    ]
    return MemoryReport(
        npu=ctx.spec.sku,
        usable_bytes=ctx.usable,
        usable_source=ctx.usable_source,
        devices=devices,
        kv=kv,
        suggestions=[],
        assumptions=list(ASSUMPTIONS),
        notes=_report_notes(ctx, resolved) + moe_notes(ctx, resolved, len(lm_devs)),
    )
