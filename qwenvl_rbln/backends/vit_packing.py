"""Packed ViT forward for optimum-rbln 0.12.0's ``RBLNQwen3VLVisionModel``: several segments (images, video
temporal patches) of one ``visual()`` call share a compiled ViT call through a block-diagonal attention mask.

optimum-rbln's ``forward`` (``transformers/models/qwen3_vl/modeling_qwen3_vl.py``, ``RBLNQwen3VLVisionModel``)
prepares everything on the host for all segments (patch embedding, interpolated position embeddings,
rotary cos/sin), then runs one compiled call per segment, padded to the smallest bucket ``>=`` it, with
``attn_mask [1, 1, S, S]`` = ones on the valid square, and keeps ``valid_len // 4`` merged rows of the main
output and of each DeepStack output. The graph turns the mask into ``(1 - mask) * finfo.min``
(``qwen3_vl_architecture.py``), so the mask is an input and a block-diagonal one computes each segment's
attention within itself: the same function, with no recompile (``shared/reference/vit-packing.md``).

This forward does the same host preparation (the code below mirrors optimum-rbln's line for line), asks
``qwenvl_rbln.vision.packing.plan_packs`` for the packs (each in its segments' own bucket, starts aligned to the
4-patch merge unit), fills each pack with zeros (buffers kept per bucket, ``_buffers``), copies the segments' rows
in, calls the same compiled graph
(``self.transformer``) once per pack, and returns the main output and DeepStack features in the original
segment order. A call with a segment above the largest bucket runs optimum-rbln's own forward, unchanged
(it raises its ``Required seq_len(...)`` error as today; qvl's oversize policy acts before that).

Two ways in: ``install_on_instance(visual)`` (``qvl infer``: the loaded model's ``visual`` only) and
``install_on_class()`` (every instance in the process: the ``qvl serve`` vLLM plugin). Both are idempotent.
Every call is recorded in a ``PackLog`` (one per instance): what ran, pack by pack, so ``qvl infer`` reports
the graph calls actually made. torch is imported inside the functions only.
"""

from __future__ import annotations

import types
from collections import deque
from typing import Any

from qwenvl_rbln.vision.packing import PackPlan, plan_packs, unpacked

VISION_CLASS = "RBLNQwen3VLVisionModel"
VISION_MODULE = "optimum.rbln.transformers.models.qwen3_vl.modeling_qwen3_vl"
LOG_LIMIT = 1000  # visual() calls remembered per instance
_CLASS_ORIGINALS: dict[type, Any] = {}  # class -> its forward before install_on_class
_NEEDS = ("transformer", "max_seq_len", "patch_embed", "rotary_cos_table", "rotary_sin_table", "spatial_merge_size")


class PackLog:
    """What the ViT did, one entry per ``visual()`` call; ``drain()`` hands the entries over and clears them.

    Bounded (the newest ``LOG_LIMIT`` entries): under ``qvl serve`` nobody drains it, and a server must not grow."""

    def __init__(self) -> None:
        self.entries: deque[dict[str, Any]] = deque(maxlen=LOG_LIMIT)

    def record(self, plan: PackPlan, packed: bool) -> None:
        self.entries.append(
            {
                "packed": packed,
                "segments": len(plan.segments),
                "lengths": list(plan.segments),
                "graph_calls": plan.calls,
                "unpacked_calls": plan.unpacked_calls,
                "packs": [p.to_dict() for p in plan.packs],
            }
        )

    @property
    def graph_calls(self) -> int:
        return sum(e["graph_calls"] for e in self.entries)

    def drain(self) -> list[dict[str, Any]]:
        out = list(self.entries)
        self.entries.clear()
        return out


def _log(visual: Any) -> PackLog:
    log = visual.__dict__.get("_qvl_pack_log")
    if log is None:
        log = visual.__dict__["_qvl_pack_log"] = PackLog()
    return log


def _cost(visual: Any) -> Any:
    """ViT FLOPs per call at ``S`` for this model's vision config (planner cost), cached on the instance."""
    cost = visual.__dict__.get("_qvl_cost")
    if cost is None:
        from qwenvl_rbln.vision.buckets import vit_cost_fn

        c = visual.config
        geometry = types.SimpleNamespace(
            depth=c.depth,
            hidden_size=c.hidden_size,
            intermediate_size=c.intermediate_size,
            out_hidden_size=c.out_hidden_size,
            spatial_merge_size=c.spatial_merge_size,
            num_deepstack=len(c.deepstack_visual_indexes),
        )
        cost = visual.__dict__["_qvl_cost"] = vit_cost_fn(geometry)
    return cost


def _original(visual: Any) -> Any:
    """optimum-rbln's own forward of this instance's class (before any install)."""
    for klass in type(visual).__mro__:
        if klass in _CLASS_ORIGINALS:
            return _CLASS_ORIGINALS[klass]
        f = klass.__dict__.get("forward")
        if f is not None and f is not packed_forward:
            return f
    raise AttributeError(f"{type(visual).__name__} has no forward")


def host_inputs(self: Any, hidden_states: Any, grid_thw: Any) -> tuple[Any, Any, Any, list[int]]:
    """(hidden [N, d], cos [N, hd], sin [N, hd], segment lengths): optimum-rbln 0.12.0's host steps, verbatim."""
    import torch
    from optimum.rbln.transformers.models.qwen3_vl.modeling_qwen3_vl import qwen_vit_rot_pos_ids
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel  # noqa: F401 - as optimum

    hidden_states = self.patch_embed(hidden_states).to(self.rbln_config.dtype)
    pos_embeds = self.fast_pos_embed_interpolate(grid_thw)
    hidden_states = hidden_states + pos_embeds.to(hidden_states.dtype)

    pos_ids = qwen_vit_rot_pos_ids(grid_thw, self.spatial_merge_size)
    seq_len = hidden_states.shape[0]
    hidden_states = hidden_states.reshape(seq_len, -1)
    cos = self.rotary_cos_table[pos_ids].flatten(1)
    sin = self.rotary_sin_table[pos_ids].flatten(1)
    cos = torch.cat((cos, cos), dim=-1).to(self.rbln_config.dtype)
    sin = torch.cat((sin, sin), dim=-1).to(self.rbln_config.dtype)
    lengths = torch.repeat_interleave(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0]).tolist()
    return hidden_states, cos, sin, [int(n) for n in lengths]


def _buffers(self: Any, bucket: int, hidden: Any, cos: Any, sin: Any) -> dict[str, Any]:
    """The inputs of a pack of ``bucket`` (hidden, cos, sin, mask), kept per instance and bucket with the segment
    spans they hold (``run_packs`` rewrites only what changes). Why: a fresh ``[1, 1, S, S]`` mask is S² new
    pages per ViT call (64 MB at bucket 4096: the largest of qvl's own per-step host costs in docs/tuning.md's
    profile), and the same image size gives the same mask call after call. The compiled call is synchronous and
    keeps no reference to its inputs."""
    import torch

    key = (bucket, hidden.shape[-1], cos.shape[-1], sin.shape[-1], hidden.dtype, cos.dtype, sin.dtype)
    cache = self.__dict__.setdefault("_qvl_pack_buffers", {})
    if key not in cache:
        cache[key] = {"h": torch.zeros(bucket, hidden.shape[-1], dtype=hidden.dtype),
                      "c": torch.zeros(bucket, cos.shape[-1], dtype=cos.dtype),
                      "sn": torch.zeros(bucket, sin.shape[-1], dtype=sin.dtype),
                      "mask": torch.zeros(1, 1, bucket, bucket, dtype=hidden.dtype), "spans": ()}  # fmt: skip
    return cache[key]


def _layout(buf: dict[str, Any], spans: tuple[tuple[int, int], ...]) -> None:
    """Zero the rows of the spans ``buf`` last held; the mask's blocks only when the spans change."""
    for start, stop in buf["spans"]:
        buf["h"][start:stop], buf["c"][start:stop], buf["sn"][start:stop] = 0, 0, 0
    if spans != buf["spans"]:
        for start, stop in buf["spans"]:
            buf["mask"][:, :, start:stop, start:stop] = 0
        for start, stop in spans:
            buf["mask"][:, :, start:stop, start:stop] = 1
    buf["spans"] = spans


def run_packs(self: Any, plan: PackPlan, hidden: Any, cos: Any, sin: Any) -> tuple[Any, list[Any]]:
    """One compiled call per pack; outputs gathered back into segment order."""
    import torch

    unit = self.spatial_merge_unit if hasattr(self, "spatial_merge_unit") else self.spatial_merge_size**2
    offsets = [0]
    for n in plan.segments:
        offsets.append(offsets[-1] + n)
    main: list[Any] = [None] * len(plan.segments)
    deep: list[list[Any]] | None = None
    for pack in plan.packs:
        buf = _buffers(self, pack.bucket, hidden, cos, sin)
        _layout(buf, tuple((start, start + n) for start, n in zip(pack.starts, pack.lengths, strict=True)))
        h, c, sn = buf["h"], buf["c"], buf["sn"]
        for i, start, length in zip(pack.segments, pack.starts, pack.lengths, strict=True):
            src, dst = slice(offsets[i], offsets[i] + length), slice(start, start + length)
            h[dst], c[dst], sn[dst] = hidden[src], cos[src], sin[src]
        outputs = self.transformer(h, buf["mask"], c[None, None, :, :], sn[None, None, :, :])
        if deep is None:
            deep = [[None] * len(plan.segments) for _ in outputs[1:]]
        for i, start, length in zip(pack.segments, pack.starts, pack.lengths, strict=True):
            rows = slice(start // unit, start // unit + length // unit)
            main[i] = outputs[0][rows]
            for j, ds in enumerate(outputs[1:]):
                deep[j][i] = ds[rows]
    return torch.cat(main), [torch.cat(parts) for parts in deep or []]


def packed_forward(self: Any, hidden_states: Any, grid_thw: Any) -> tuple[Any, list[Any]]:
    """``RBLNQwen3VLVisionModel.forward`` with the segments of this call packed (see the module docstring)."""
    import torch

    buckets = [int(b) for b in torch.as_tensor(self.max_seq_len).tolist()]
    lengths = [int(n) for n in torch.repeat_interleave(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0]).tolist()]
    packing = self.__dict__.get("_qvl_vit_packing", True)
    plan = plan_packs(lengths, buckets, _cost(self)) if packing else unpacked(lengths, buckets)
    if plan.oversize or not packing:  # optimum-rbln's own forward: today's behaviour, today's error
        result = _original(self)(self, hidden_states, grid_thw)
        _log(self).record(unpacked(lengths, buckets), packed=False)
        return result
    hidden, cos, sin, _ = host_inputs(self, hidden_states, grid_thw)
    result = run_packs(self, plan, hidden, cos, sin)
    _log(self).record(plan, packed=True)
    return result


def can_pack(visual: Any) -> bool:
    """Whether ``visual`` looks like optimum-rbln 0.12's loaded ViT (a compiled graph and the host tables)."""
    try:
        return all(hasattr(visual, name) for name in _NEEDS) and hasattr(visual, "__dict__")
    except Exception:  # noqa: BLE001 - optimum's __getattr__ redirect may raise anything
        return False


def install_on_instance(visual: Any, *, enabled: bool = True) -> PackLog | None:
    """Take over ``forward`` of this loaded ViT only; ``enabled=False`` keeps optimum-rbln's forward but still
    records the calls. Returns the instance's PackLog, or None when ``visual`` is not optimum-rbln's ViT."""
    if not can_pack(visual):
        return None
    visual.__dict__["_qvl_vit_packing"] = bool(enabled)
    visual.__dict__["forward"] = types.MethodType(packed_forward, visual)
    return _log(visual)


def vision_class() -> Any:
    import importlib

    return getattr(importlib.import_module(VISION_MODULE), VISION_CLASS)


def install_on_class(cls: Any = None) -> Any:
    """Patch ``RBLNQwen3VLVisionModel.forward`` for every instance in this process (idempotent); returns the class.

    An instance can still opt out: ``visual._qvl_vit_packing = False`` (as ``install_on_instance(v, enabled=False)``).
    """
    cls = cls or vision_class()
    if cls not in _CLASS_ORIGINALS:
        _CLASS_ORIGINALS[cls] = cls.__dict__["forward"]
        cls.forward = packed_forward
    return cls


def uninstall_class(cls: Any = None) -> None:
    """Undo ``install_on_class`` (tests)."""
    cls = cls or vision_class()
    original = _CLASS_ORIGINALS.pop(cls, None)
    if original is not None:
        cls.forward = original


def pack_log(visual: Any) -> PackLog | None:
    """The PackLog of an instance the packed forward has run on (or was installed on)."""
    return getattr(visual, "__dict__", {}).get("_qvl_pack_log")
