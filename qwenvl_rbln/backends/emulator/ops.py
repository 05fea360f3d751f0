"""``torch.ops.rbln_custom_ops.*`` on CPU: what the Qwen3-VL LM graphs of optimum-rbln 0.12 call.

rebel-compiler registers these ops; without it, the emulator registers them with ``torch.library``. Their
semantics are *inferred* from the optimum-rbln 0.12.0 call sites (paths inside ``optimum/rbln/``), never
from NPU documentation or hardware:

* ``linear(input, weight, bias=None)``: plain ``torch.nn.functional.linear`` (decomposed into aten ops when a
  graph is traced, so graph files hold no call to it). optimum-rbln patches
  ``torch.nn.functional.linear`` to this op while it compiles an LM graph
  (``transformers/models/decoderonly/modeling_decoderonly.py:244-260``).
* ``paged_attn_{prefill,decode}``, ``paged_causal_attn_{prefill,decode}``, ``paged_flash_attn_{prefill,decode}``,
  ``paged_flash_causal_attn_{prefill,decode}``: called by ``AttentionOp.forward`` and
  ``FlashAttentionOp.forward`` (``transformers/models/decoderonly/decoderonly_architecture.py:995-1060,
  1120-1180``; op names from ``get_attn_op_name``, ``:941-955, 1081-1096``) with keyword arguments

  - ``q [B, Hkv, G, Q, D]`` (``G`` query heads per KV head), ``k``/``v [B, Hkv, 1, Q, D]``;
  - ``kcache``/``vcache [NB, Hkv, 1, BS, D]``: a view of the graph's static ``past_key_values_<i>`` buffer
    (``[NB, Hkv, BS, D]`` unsqueezed), **mutated in place**;
  - ``seq [B, 1]``: the position of the first query row (prefill: the chunk start; decode: the position
    being written), from ``cache_position[:, :1]`` (eager) or ``cache_position[:, 0].unsqueeze(-1)`` (flash,
    ``decoderonly_architecture.py:431-434``);
  - ``scale`` (a 0-d tensor), ``block_table`` (``[MB]`` in prefill, ``[B, MB]`` in decode; ``-1`` marks an
    unallocated block, ``RBLNPageTableManager.EMPTY_BLOCK`` in ``decoderonly_runtime_utils.py:31``),
    ``block_size``, ``partition`` (flash only), and optionally ``mask``, ``is_bidirectional``, ``k_scale``/
    ``v_scale`` (fp8 KV) and ``s_aux`` (attention sinks).

  Semantics: for each row ``b``, the ``Q`` new keys/values are written at logical positions
  ``seq[b] .. seq[b]+Q-1`` through the block table (block ``pos // BS``, offset ``pos % BS``; positions past the
  table or on an unallocated block are skipped), then every query row ``i`` attends over the logical cache
  ``0 .. seq[b]+Q-1``: the ``causal`` ops keep positions ``<= seq[b]+i`` (or the whole chunk when
  ``is_bidirectional``), the others keep positions where ``mask`` is non-zero. Flash and non-flash differ only
  in how the NPU tiles the work (``partition``); on a CPU the maths is the same. Output: ``[B, Hkv, G, Q, D]``.
  fp8 KV (``_kv_fp8`` variants, ``k_scale``/``v_scale``) and attention sinks (``s_aux``) are not emulated and
  raise.
* ``custom_moe_glu(hidden_states, gate_proj_weight, up_proj_weight, down_proj_weight, masked_routing_weight,
  hidden_act)``: the MoE expert block of Qwen3-VL-MoE; its semantics and call site are in ``moe.py``.
* ``rbln_cache_update(cache, value, position, axis)``: writes ``value`` into ``cache`` at ``position`` along
  ``axis`` in place and returns the updated cache (a copy). Not used by Qwen3-VL; inferred from
  ``transformers/models/whisper/whisper_architecture.py:72`` and ``seq2seq/seq2seq_architecture.py:109``.
"""

from __future__ import annotations

from typing import Any

_LIB: Any = None

ATTN_OPS = tuple(
    f"paged_{kind}attn_{phase}"
    for kind in ("", "causal_", "flash_", "flash_causal_")
    for phase in ("prefill", "decode")
)
ATTN_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor(a!) kcache, Tensor(b!) vcache, Tensor seq, Tensor scale, "
    "Tensor block_table, int block_size, int? partition=None, Tensor? mask=None, bool? is_bidirectional=None, "
    "Tensor? k_scale=None, Tensor? v_scale=None, Tensor? s_aux=None) -> Tensor"
)


def register() -> None:
    """Define the ops once per process (idempotent): ``rbln_custom_ops`` (the LM graphs') and ``rbln`` (vllm-rbln's
    RBLN sampler's, ``engine.py``)."""
    global _LIB
    if _LIB is not None:
        return
    import torch

    lib = torch.library.Library("rbln_custom_ops", "FRAGMENT")
    lib.define("linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor")
    # CompositeImplicitAutograd: a traced graph records the aten ops of a linear (no Python call per run)
    lib.impl("linear", _linear, "CompositeImplicitAutograd")
    for name in ATTN_OPS:
        lib.define(name + ATTN_SCHEMA)
        causal = "causal" in name
        lib.impl(name, _attn_impl(causal), "CPU")
        lib.impl(name, _attn_meta, "Meta")
    lib.define("rbln_cache_update(Tensor(a!) cache, Tensor value, Tensor position, int axis) -> Tensor")
    lib.impl("rbln_cache_update", _cache_update, "CPU")
    from qwenvl_rbln.backends.emulator import engine, moe

    moe.register(lib)  # custom_moe_glu: the MoE expert block (moe.py)
    sampler = torch.library.Library("rbln", "FRAGMENT")
    engine.define_ops(sampler)  # argmax, top_k_top_p: vllm-rbln's RBLN sampler (engine.py)
    _LIB = (lib, sampler)


def _linear(input: Any, weight: Any, bias: Any = None) -> Any:
    import torch

    # torch.nn.functional.linear may be patched to this very op while optimum-rbln compiles
    return torch._C._nn.linear(input, weight, bias)


def _attn_meta(q: Any, *args: Any, **kwargs: Any) -> Any:
    return q.new_empty(q.shape)


def _attn_impl(causal: bool):
    def impl(
        q: Any,
        k: Any,
        v: Any,
        kcache: Any,
        vcache: Any,
        seq: Any,
        scale: Any,
        block_table: Any,
        block_size: int,
        partition: int | None = None,
        mask: Any = None,
        is_bidirectional: bool | None = None,
        k_scale: Any = None,
        v_scale: Any = None,
        s_aux: Any = None,
    ) -> Any:
        if k_scale is not None or v_scale is not None or s_aux is not None:
            raise NotImplementedError("qvl emulator: fp8 KV scales and attention sinks (s_aux) are not emulated")
        return paged_attention(
            q, k, v, kcache, vcache, seq, scale, block_table, block_size, causal, mask, bool(is_bidirectional)
        )

    return impl


def paged_attention(
    q: Any,
    k: Any,
    v: Any,
    kcache: Any,
    vcache: Any,
    seq: Any,
    scale: Any,
    block_table: Any,
    block_size: int,
    causal: bool,
    mask: Any = None,
    bidirectional: bool = False,
) -> Any:
    """Write the new K/V through the block table, then attend over the logical cache (see the module docstring)."""
    import torch

    bsz, hkv, groups, qlen, dim = q.shape
    table_all = block_table.reshape(1, -1) if block_table.dim() == 1 else block_table
    num_blocks = kcache.shape[0]
    out = torch.zeros_like(q)
    scale_f = float(scale) if not hasattr(scale, "item") else float(scale.item())
    for b in range(bsz):
        table = table_all[b if table_all.shape[0] > 1 else 0].long()
        capacity = table.numel() * block_size
        start = int(seq.reshape(bsz, -1)[b, 0])
        pos = torch.arange(start, start + qlen)
        keep = pos < capacity
        blocks = torch.full_like(pos, -1)
        blocks[keep] = table[pos[keep] // block_size]
        keep &= (blocks >= 0) & (blocks < num_blocks)
        if bool(keep.any()):
            offs = pos[keep] % block_size
            kcache[blocks[keep], :, 0, offs, :] = k[b, :, 0][:, keep].transpose(0, 1).to(kcache.dtype)
            vcache[blocks[keep], :, 0, offs, :] = v[b, :, 0][:, keep].transpose(0, 1).to(vcache.dtype)
        length = min(start + qlen, capacity)
        if length <= 0:
            continue
        logical = torch.arange(length)
        lblocks = table[logical // block_size]
        present = (lblocks >= 0) & (lblocks < num_blocks)
        safe = lblocks.clamp(0, num_blocks - 1)
        keys = kcache[safe, :, 0, logical % block_size, :].permute(1, 0, 2).float()  # [Hkv, L, D]
        values = vcache[safe, :, 0, logical % block_size, :].permute(1, 0, 2).float()
        scores = torch.einsum("hgqd,hld->hgql", q[b].float(), keys) * scale_f
        allowed = present.view(1, -1).expand(qlen, length).clone()
        if causal and not bidirectional:
            rows = torch.arange(start, start + qlen).view(-1, 1)
            allowed &= logical.view(1, -1) <= rows
        elif mask is not None:
            m = mask[b if mask.shape[0] > 1 else 0].reshape(-1, mask.shape[-1])[-qlen:, :length]
            allowed &= m.to(torch.bool) if m.shape[0] == qlen else m[-1:].to(torch.bool).expand(qlen, length)
        scores = scores.masked_fill(~allowed.view(1, 1, qlen, length), float("-inf"))
        probs = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
        out[b] = torch.einsum("hgql,hld->hgqd", probs, values).to(q.dtype)
    return out


def _cache_update(cache: Any, value: Any, position: Any, axis: int) -> Any:
    start = int(position.reshape(-1)[0]) if hasattr(position, "reshape") else int(position)
    cache.narrow(axis, start, value.shape[axis]).copy_(value)
    return cache.clone()
