"""The memory items of one scenario: LM weights, KV cache, LM workspace, attention mask, ViT weights and
workspace, each with its formula and note, and the copies each device carries.

Its own module because it turns the counts (params, kv, workspaces) and the calibration into report items.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from qwenvl_rbln.memory import calibration as cal
from qwenvl_rbln.memory.calibration import model_key
from qwenvl_rbln.memory.context import Ctx, model_dtype, quant
from qwenvl_rbln.memory.kv import kv_block_bytes_per_tensor, kv_blocks, kv_tensor_bytes
from qwenvl_rbln.memory.moe import glu_workspace_item, moe_weight_shards, weights_formula, weights_note
from qwenvl_rbln.memory.params import (
    QUANT_MODEL_DTYPE,
    QUANT_WEIGHT_BYTES,
    lm_params,
    quantized_lm_weight_bytes,
    vision_params,
)
from qwenvl_rbln.memory.report import MemoryItem, fmt_gib
from qwenvl_rbln.memory.workspaces import (
    FP32,
    LM_WORKSPACE_FORMULA,
    LM_WORKSPACE_RANGE,
    VISUAL_WORKSPACE_FORMULA,
    VISUAL_WORKSPACE_RANGE,
    lm_graph_workspace,
    visual_workspace,
    visual_workspace_parts,
)
from qwenvl_rbln.planning.catalogue.devices import MiB

SPLIT_NOTE = (
    "num_devices {n}: optimum-rbln splits nothing in Python (modeling_base.py passes num_devices to "
    "rebel.compile_from_torch) and the compiler decides"
)


def _split(total: int, replicated: int, n: int, scenario: str) -> int:
    """One device's share of ``total`` bytes over ``n`` devices: an even split, except at the high end, where
    the ``replicated`` part (norms, lm_head, inputs) sits whole on every device."""
    if n <= 1:
        return total
    if scenario == "high":
        return replicated + -(-(total - replicated) // n)
    return -(-total // n)


def _lm_replicated_params(g: Any) -> int:
    """What a split cannot shard below one copy per device: every RMSNorm (per layer, q/k norms, final) and lm_head."""
    t = g.text
    lp = lm_params(t)
    return lp["norm"] + lp["lm_head"] + t.num_hidden_layers * (2 * t.hidden_size + 2 * t.head_dim)


def _lm_weights_item(ctx: Ctx, resolved: Any, n_lm: int) -> MemoryItem:
    g = ctx.geometry
    lp = lm_params(g.text)
    q = quant(resolved)
    if g.text.moe is not None:
        n_lm = moe_weight_shards(ctx, n_lm)  # on a Rebel100 one MoE model is not split over cards (moe.py)
    split_note = (
        f"; {SPLIT_NOTE.format(n=n_lm)}: low = an even split, high = norms and lm_head whole on every device"
        if n_lm > 1
        else ""
    )
    if not q and g.text.moe is not None:
        d = ctx.dtype_bytes
        div = f" / {n_lm} devices" if n_lm > 1 else ""
        whole = resolved.num_devices > 1 and n_lm == 1
        note = weights_note(lp) + ("; all of it planned on each LM device: one model spans one Rebel100" * whole)
        share = _split(lp["device"] * d, _lm_replicated_params(g) * d, n_lm, ctx.scenario)
        return MemoryItem("lm.weights", share, n_lm == 1, weights_formula(g, lp, d) + div, note + split_note)
    if not q:
        d = ctx.dtype_bytes
        return MemoryItem(
            "lm.weights",
            _split(lp["device"] * d, _lm_replicated_params(g) * d, n_lm, ctx.scenario),
            n_lm == 1,
            f"(layers {g.text.num_hidden_layers} x {lp['layer']:,} + norm {lp['norm']:,} + lm_head {lp['lm_head']:,}) "
            f"params x {d} B" + (f" / {n_lm} devices" if n_lm > 1 else ""),
            f"{lp['device']:,} params; embed_tokens ({lp['embed_tokens_host']:,} params) stays on the host"
            + split_note,
        )
    wbytes = QUANT_WEIGHT_BYTES[q["weights"]]
    if ctx.scenario == "high" and q["weights"] == "int4":
        wbytes = 1.0  # if the compiler kept int4 weights in int8 containers
    rest_d = 2 if ctx.scenario == "low" else QUANT_MODEL_DTYPE
    scales = lp["scale_channels"] * QUANT_MODEL_DTYPE
    rest = lp["device"] - lp["quantizable"]
    total = quantized_lm_weight_bytes(g.text, wbytes, rest_d)
    return MemoryItem(
        "lm.weights",
        _split(total, _lm_replicated_params(g) * rest_d, n_lm, ctx.scenario),
        False,
        f"quantized q/k/v/o/gate/up/down {lp['quantizable']:,} params x {wbytes:g} B ({q['weights']}) + fp32 "
        f"weight_scale per output channel ({scales:,} B) + the rest ({rest:,} params: norms, lm_head"
        + (", experts, router" if g.text.moe is not None else "")
        + f") x {rest_d} B"
        + (f" / {n_lm} devices" if n_lm > 1 else ""),
        "quantization (optimum-rbln 0.12 rbln_quantization.py: QUANTIZED_WEIGHTS, get_quantized_model loads the "
        "model in float32); modelled from the source, not measured" + split_note,
    )


def _lm_workspace_item(ctx: Ctx, resolved: Any) -> tuple[int, MemoryItem]:
    g, d = ctx.geometry, model_dtype(ctx, resolved)
    block = resolved.kvcache_block_size
    keys = cal.graph_keys(resolved)
    models = [model_key(g), g.name]
    parts: list[str] = []
    total = 0
    calibrated = []
    graphs = [("prefill", resolved.prefill_chunk_size, 1, True)] + [
        (f"decoder_batch_{b}", b, b, False) for b in resolved.decoder_batch_sizes
    ]
    for name, rows, logits_rows, is_prefill in graphs:
        measured = cal.lookup(ctx.calibration, models, ctx.spec.sku, keys[name])
        if measured is not None:
            total += measured
            calibrated.append(name)
            parts.append(f"{name} {measured / MiB:.0f} MiB (calibrated)")
        else:
            ws = lm_graph_workspace(g, rows, block, logits_rows, d, prefill=is_prefill)
            value = {"low": ws["linear"] + ws["io"], "mid": ws["total"], "high": 2 * ws["total"]}[ctx.scenario]
            total += value
            parts.append(f"{name} {ws['total'] / MiB:.0f} MiB")
    all_cal = len(calibrated) == len(graphs)
    note = ", ".join(parts)
    if calibrated and not all_cal:
        note += "; partly calibrated"
    item = MemoryItem(
        name="lm.workspace",
        bytes=total,
        exact=False,
        formula=(f"measured by load-check ({', '.join(calibrated)})" if all_cal else LM_WORKSPACE_FORMULA),
        note=("estimate: " if not all_cal else "") + note + ("" if all_cal else f"; {LM_WORKSPACE_RANGE}"),
        calibrated=all_cal,
    )
    return total, item


def _attention_mask_item(ctx: Ctx, resolved: Any, n_lm: int) -> MemoryItem | None:
    """optimum-rbln get_input_info with use_attention_mask: prefill [1, 1, chunk, max_seq_len] and each decoder
    [B, 1, 1, max_seq_len] in the model dtype ([B, max_seq_len] with use_position_ids)."""
    if not getattr(resolved, "use_attention_mask", False):
        return None
    d, L = model_dtype(ctx, resolved), resolved.max_seq_len
    rows = 1 if getattr(resolved, "use_position_ids", False) else resolved.prefill_chunk_size
    prefill = rows * L * d
    decoders = sum(b * L * d for b in resolved.decoder_batch_sizes)
    total = prefill + decoders
    whole = prefill if n_lm == 1 or ctx.scenario == "high" else -(-prefill // n_lm)
    return MemoryItem(
        "lm.attention_mask",
        _split(total, total, n_lm, ctx.scenario),  # an input: whole on every device at the high end
        True,
        f"prefill attention_mask [1, 1, {rows}, {L}] x {d} B + decoder masks [B, 1, 1, {L}] x {d} B for B in "
        f"{resolved.decoder_batch_sizes}",
        f"use_attention_mask: prefill input {prefill / MiB:.0f} MiB, decoder inputs {decoders / MiB:.1f} MiB",
        whole=[whole],  # split like the item (never more of the tensor than the item holds)
    )


def _visual_workspace_item(ctx: Ctx, resolved: Any) -> MemoryItem:
    g = ctx.geometry
    largest = max(resolved.vit_buckets)
    measured = cal.lookup(ctx.calibration, [model_key(g), g.name], ctx.spec.sku, cal.graph_keys(resolved)["visual"])
    if measured is not None:
        return MemoryItem(
            "visual.workspace",
            measured,
            False,
            "measured by load-check",
            f"largest bucket {largest} (calibrated)",
            calibrated=True,
        )
    parts = visual_workspace_parts(g, largest, model_dtype(ctx, resolved), ctx.scenario)
    mid = visual_workspace(g, largest, model_dtype(ctx, resolved))
    return MemoryItem(
        "visual.workspace",
        parts["total"],
        False,
        VISUAL_WORKSPACE_FORMULA,
        f"estimate for the largest bucket S={largest}: attention {fmt_gib(mid['attention'])} "
        f"(hypothesis: scores materialised, not tiled; the fp32 score buffer is one "
        f"{fmt_gib(g.vision.num_heads * largest * largest * FP32)} tensor) + linear {mid['linear'] / MiB:.0f} MiB "
        f"+ io {mid['io'] / MiB:.0f} MiB; {VISUAL_WORKSPACE_RANGE}",
        whole=parts["whole"],
    )


def _kv_note(resolved: Any, kv: dict[str, Any]) -> str:
    """Why the pool has this many blocks, in the words of each sizing outcome."""
    n_blocks = kv["num_blocks"]
    return {
        "full": f"auto: {n_blocks} of {resolved.num_full_blocks} full blocks (optimum-rbln sized it for the LM alone)",
        "partial": f"auto: only {n_blocks} of {resolved.num_full_blocks} full blocks fit the LM's budget "
        f"(minimum {resolved.num_min_blocks}): optimum-rbln's own generate() can run out of blocks on long batches",
        "insufficient": f"auto: only {n_blocks} blocks fit, below the minimum {resolved.num_min_blocks}: "
        "optimum-rbln's compile stops with 'Insufficient memory for the required KV cache' (shown: the minimum)",
        "explicit": f"kvcache_num_blocks={n_blocks} (full {resolved.num_full_blocks})",
        "eager": f"eager: {n_blocks} blocks of max_seq_len, one sequence each "
        + ("(= batch_size)" if n_blocks == resolved.batch_size else f"(batch_size {resolved.batch_size})"),
    }[kv["outcome"]]


def _kv_cache_item(ctx: Ctx, resolved: Any, kv: dict[str, Any], n_lm: int) -> tuple[MemoryItem, int]:
    """The KV pool item per LM device and the bytes of one KV tensor; records the pool's bytes in ``kv``."""
    g = ctx.geometry
    kv_d = kv["dtype_bytes"]
    shown_blocks = resolved.num_min_blocks if kv["outcome"] == "insufficient" else kv["num_blocks"]
    tensor_bytes = kv_tensor_bytes(g, kv["block_size"], shown_blocks, kv_d, n_lm)
    kv_total = kv["tensors"] * tensor_bytes
    kv["bytes"] = kv_total
    per_block = kv_block_bytes_per_tensor(g, kv["block_size"], kv_d, n_lm)
    dtype_note = {1: "fp8 (kv_caches: fp8)", 2: "bf16", 4: "fp32"}.get(kv_d, f"{kv_d} B")
    if quant(resolved) and kv_d == 4:
        dtype_note += " (a quantized model compiles in float32 and its KV follows the model dtype without fp8)"
    split = f"; {SPLIT_NOTE.format(n=n_lm)}: modelled as the kv heads split over the devices" if n_lm > 1 else ""
    item = MemoryItem(
        "lm.kv_cache",
        kv_total,
        kv["outcome"] != "partial" and n_lm == 1,
        f"2 x {g.text.num_hidden_layers} layers x align_2MiB({shown_blocks} blocks x "
        f"{-(-g.text.num_key_value_heads // n_lm)} kv_heads x {kv['block_size']} x {g.text.head_dim} x {kv_d} B) "
        f"= {kv['tensors']} x {tensor_bytes / MiB:.0f} MiB",
        _kv_note(resolved, kv) + f"; {per_block * kv['tensors'] / MiB:.0f} MiB per block; {dtype_note}" + split,
    )
    return item, tensor_bytes


def build_lm_items(ctx: Ctx, resolved: Any, n_lm: int) -> tuple[list[MemoryItem], dict[str, Any], int]:
    """The LM's items per device (sharded over n_lm devices when num_devices > 1), the KV sizing, the KV tensor
    bytes."""
    lm_weights = _lm_weights_item(ctx, resolved, n_lm)
    lm_ws_total, lm_ws = _lm_workspace_item(ctx, resolved)
    lm_ws.bytes = _split(lm_ws_total, lm_ws_total, n_lm, ctx.scenario)  # high: activations replicated
    mask = _attention_mask_item(ctx, resolved, n_lm)
    moe_ws = glu_workspace_item(ctx, resolved, n_lm)  # Qwen3-VL-MoE only
    extra = [i for i in (mask, moe_ws) if i is not None]
    lm_nonkv = lm_weights.bytes + lm_ws.bytes + sum(i.bytes for i in extra)
    kv = kv_blocks(ctx, resolved, lm_nonkv, n_lm)
    lm_kv, tensor_bytes = _kv_cache_item(ctx, resolved, kv, n_lm)
    return [lm_weights, lm_kv, lm_ws] + extra, kv, tensor_bytes


def _vit_replicated_params(g: Any) -> int:
    """The ViT's LayerNorms (2 per block, the merger's, the deepstack mergers'): whole on every device at worst."""
    v = g.vision
    merged = v.hidden_size * v.spatial_merge_size**2
    return v.depth * 2 * 2 * v.hidden_size + 2 * v.hidden_size + v.num_deepstack * 2 * merged


def build_visual_items(ctx: Ctx, resolved: Any, n_vis: int) -> list[MemoryItem]:
    """The ViT's weights and workspace per device (split over n_vis devices)."""
    g, d = ctx.geometry, model_dtype(ctx, resolved)
    vp = vision_params(g.vision)
    vis_w = vp["device"] * d
    vis_weights = MemoryItem(
        "visual.weights",
        _split(vis_w, _vit_replicated_params(g) * d, n_vis, ctx.scenario),
        not quant(resolved) and n_vis == 1,
        f"({g.vision.depth} blocks x {vp['block']:,} + merger {vp['merger']:,} + {g.vision.num_deepstack} deepstack "
        f"mergers {vp['deepstack_mergers']:,}) params x {d} B" + (f" / {n_vis} devices" if n_vis > 1 else ""),
        f"{vp['device']:,} params; patch_embed ({vp['patch_embed_host']:,}) and pos_embed "
        f"({vp['pos_embed_host']:,}) stay on the host"
        + ("; fp32: a quantized model is loaded in float32 and the ViT is not quantized" if quant(resolved) else "")
        + (
            f"; {SPLIT_NOTE.format(n=n_vis)}: low = an even split, high = norms whole on every device"
            if n_vis > 1
            else ""
        ),
    )
    if quant(resolved) and ctx.scenario == "low":
        vis_weights.bytes = -(-vp["device"] * 2 // n_vis)
    vis_ws = _visual_workspace_item(ctx, resolved)
    if n_vis > 1 and ctx.scenario != "high":  # high: the compiler may keep the activations whole on each device
        vis_ws.bytes = -(-vis_ws.bytes // n_vis)
        # Its single tensors are split like the item (a [heads, S, S] buffer by heads over the devices); dividing
        # the total but not its tensors made the rest negative and the chiplet loads below zero.
        vis_ws.whole = [-(-w // n_vis) for w in vis_ws.whole]
    return [vis_weights, vis_ws]


def items_by_device(
    lm_items: list[MemoryItem], vis_items: list[MemoryItem], lm_devs: list[int], vis_devs: list[int]
) -> dict[int, list[MemoryItem]]:
    """Each device's own copies of the items placed on it (LM first, then the ViT on a shared device)."""
    by_dev: dict[int, list[MemoryItem]] = {}
    for dev in lm_devs:
        by_dev.setdefault(dev, []).extend(replace(i) for i in lm_items)
    for dev in vis_devs:
        by_dev.setdefault(dev, []).extend(replace(i) for i in vis_items)
    return by_dev
