"""The KV cache: tensor count, bytes per block and per tensor (aligned to 2 MiB), and the block count
optimum-rbln 0.12 ends up with (eager, explicit or its automatic search against the nominal DRAM).

Its own module because the pool is the one item whose size is searched, not summed.
"""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.memory.context import Ctx, model_dtype, quant
from qwenvl_rbln.planning.catalogue.devices import MiB
from qwenvl_rbln.planning.catalogue.modelinfo import ModelGeometry

KV_ALIGN = 2 * MiB  # optimum-rbln aligns every KV tensor to 2 MiB


def align_up(n: int, a: int = KV_ALIGN) -> int:
    return -(-n // a) * a


def kv_tensor_count(geometry: ModelGeometry) -> int:
    return 2 * geometry.text.num_hidden_layers


def kv_block_bytes_per_tensor(geometry: ModelGeometry, block: int, dtype_bytes: int = 2, shards: int = 1) -> int:
    """Bytes of one block in one K or V tensor (kv heads split over ``shards`` devices)."""
    heads = -(-geometry.text.num_key_value_heads // shards)
    return heads * block * geometry.text.head_dim * dtype_bytes


def kv_tensor_bytes(geometry: ModelGeometry, block: int, num_blocks: int, dtype_bytes: int = 2, shards: int = 1) -> int:
    """One K or V tensor [num_blocks, kv_heads, block, head_dim], aligned up to 2 MiB."""
    return align_up(num_blocks * kv_block_bytes_per_tensor(geometry, block, dtype_bytes, shards))


def kv_bytes(geometry: ModelGeometry, block: int, num_blocks: int, dtype_bytes: int = 2, shards: int = 1) -> int:
    """The whole KV pool on one device: 2 x layers aligned tensors."""
    return kv_tensor_count(geometry) * kv_tensor_bytes(geometry, block, num_blocks, dtype_bytes, shards)


def _resolve_budget(budget: float | int | None, available_total: int) -> int:
    """optimum-rbln _resolve_memory_budget: None -> all, fraction (0, 1] -> share, int -> bytes."""
    if budget is None:
        return available_total
    if isinstance(budget, float):
        return int(available_total * budget)
    return min(int(budget), available_total)


def _kv_dtype(ctx: Ctx, resolved: Any) -> int:
    """optimum-rbln get_input_info: the KV dtype is the model dtype, float8_e4m3fn with kv_caches fp8."""
    q = quant(resolved)
    if q and q.get("kv_caches") == "fp8":
        return 1
    return model_dtype(ctx, resolved)


def kv_blocks(ctx: Ctx, resolved: Any, lm_nonkv_per_device: int, shards: int) -> dict[str, Any]:
    """The block count optimum-rbln 0.12 ends up with, and how it got there."""
    g, d = ctx.geometry, _kv_dtype(ctx, resolved)
    block, full, minimum = resolved.kvcache_block_size, resolved.num_full_blocks, resolved.num_min_blocks
    chiplets = ctx.spec.chiplets
    tensors = kv_tensor_count(g)
    per_chiplet_tensors = -(-tensors // chiplets)
    info: dict[str, Any] = {
        "attn_impl": resolved.attn_impl,
        "block_size": block,
        "tensors": tensors,
        "dtype_bytes": d,
        "bytes_per_block": tensors * kv_block_bytes_per_tensor(g, block, d, shards),
        "num_full_blocks": full,
        "num_min_blocks": minimum,
        "memory_budget": resolved.memory_budget,
    }
    if resolved.attn_impl != "flash_attn":
        n = resolved.kvcache_num_blocks or resolved.batch_size
        return {**info, "mode": "eager", "num_blocks": n, "outcome": "eager"}
    if resolved.kvcache_num_blocks:
        n = resolved.kvcache_num_blocks
        return {**info, "mode": "explicit", "num_blocks": n, "outcome": "explicit"}
    # Automatic: optimum-rbln _search_num_kvcache_blocks against the nominal DRAM, LM graphs only. Each device
    # (node) of a num_devices > 1 compile has its own chiplets; the budget is resolved against one device's DRAM
    # (_collect_chiplet_kvcache_inputs: num_chiplets = max chiplet id + 1), so a byte budget is per device.
    nominal_device = ctx.spec.usable_per_chiplet * chiplets
    budget_device = _resolve_budget(resolved.memory_budget, nominal_device)
    budget_chiplet = budget_device // chiplets
    nonkv_chiplet = -(-lm_nonkv_per_device // chiplets)

    def fits(n: int) -> bool:
        return per_chiplet_tensors * kv_tensor_bytes(g, block, n, d, shards) + nonkv_chiplet <= budget_chiplet

    if fits(full):
        n = full
    else:
        lo, hi, n = 1, full - 1, 0
        while lo <= hi:
            mid = (lo + hi) // 2
            if fits(mid):
                n, lo = mid, mid + 1
            else:
                hi = mid - 1
    if n >= full:
        outcome = "full"
    elif n >= minimum:
        outcome = "partial"
    else:
        outcome = "insufficient"
    return {**info, "mode": "auto", "num_blocks": n, "outcome": outcome, "budget_bytes": budget_device}
