"""How one device's items spread over its chiplets, and whether the fullest chiplet fits its share.

Its own module because a card can fit in total and still fail on one chiplet: a single tensor is placed whole.
"""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.memory.context import Ctx
from qwenvl_rbln.memory.report import MemoryItem


def _chiplet_loads(chiplets: int, kv_tensors: int, kv_tensor: int, whole: list[int], spread: int) -> list[int]:
    """Bytes per chiplet: KV tensors round-robin, single tensors whole (largest first, least-filled chiplet),
    the rest split evenly."""
    loads = [(kv_tensors // chiplets + (1 if i < kv_tensors % chiplets else 0)) * kv_tensor for i in range(chiplets)]
    for size in sorted(whole, reverse=True):
        i = loads.index(min(loads))
        loads[i] += size
    share = -(-spread // chiplets)
    return [x + share for x in loads]


def chiplet_view(ctx: Ctx, items: list[MemoryItem], kv: dict[str, Any], tensor_bytes: int) -> dict[str, Any]:
    """How one device's items spread over its chiplets, and whether the fullest one fits its share."""
    chiplets = ctx.spec.chiplets
    per_chiplet_tensors = -(-kv["tensors"] // chiplets)
    kv_here = sum(i.bytes for i in items if i.name == "lm.kv_cache")
    whole = [w for i in items for w in i.whole]
    other = sum(i.bytes for i in items if i.name != "lm.kv_cache")
    loads = _chiplet_loads(chiplets, kv["tensors"] if kv_here else 0, tensor_bytes, whole, other - sum(whole))
    fullest = max(loads)
    usable_chiplet = ctx.usable // chiplets
    return {
        "count": chiplets,
        "loads_bytes": loads,
        "usable_per_chiplet_bytes": usable_chiplet,
        "fullest_bytes": fullest,
        "free_bytes": usable_chiplet - fullest,
        "fits": fullest <= usable_chiplet,
        "assumption": f"KV tensors whole and round-robin ({per_chiplet_tensors} of {kv['tensors']} on the fullest "
        "chiplet); single ViT workspace tensors whole (largest first, least-filled chiplet); weights and the "
        "rest split evenly",
    }
