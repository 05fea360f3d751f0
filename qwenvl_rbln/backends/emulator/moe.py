"""``torch.ops.rbln_custom_ops.custom_moe_glu`` on CPU: the expert block of optimum-rbln 0.12's MoE graphs.

Call site (``optimum/rbln/transformers/models/qwen3_vl_moe/qwen3_vl_moe_architecture.py``,
``Qwen3VLMoeMLP.forward``; the same call in ``qwen3_moe``, ``qwen2_moe``, ``mixtral`` and ``gemma4``)::

    masked_routing_weight = compute_masked_routing_weight_softmax_first(   # transformers/utils/moe.py
        router_logits, top_k=self.top_k, renormalize=self.norm_topk_prob)  # [E, T]: top-k, softmax, scatter
    torch.ops.rbln_custom_ops.custom_moe_glu(
        hidden_states=x,                        # [T, H]
        gate_proj_weight=self.gate_proj_weight, # [E, I, H]: gate half of HF's fused gate_up_proj [E, 2I, H]
        up_proj_weight=self.up_proj_weight,     # [E, I, H]: its up half (split_fused_experts)
        down_proj_weight=self.down_proj_weight, # [E, H, I]: HF's down_proj as is
        masked_routing_weight=masked_routing_weight,
        hidden_act="silu")

Semantics (inferred from that call site and from the transformers experts module it replaces,
``Qwen3VLMoeTextExperts.forward``; never from NPU documentation): for every token ``t``,
``out[t] = sum_e w[e, t] * down_e(act(gate_e x_t) * up_e x_t)`` with ``down_e(y) = y @ down[e].T`` and
``gate_e(x) = x @ gate[e].T``. The weights of the experts a token did not pick are exactly zero in
``masked_routing_weight``, so only picked experts contribute. Output ``[T, H]`` in the input's dtype. Only
``hidden_act="silu"`` (what Qwen3-VL-MoE passes) is emulated; another activation raises.
"""

from __future__ import annotations

from typing import Any

SCHEMA = (
    "custom_moe_glu(Tensor hidden_states, Tensor gate_proj_weight, Tensor up_proj_weight, "
    'Tensor down_proj_weight, Tensor masked_routing_weight, str hidden_act="silu") -> Tensor'
)


def register(lib: Any) -> None:
    """Define the op in the emulator's ``rbln_custom_ops`` library fragment."""
    lib.define(SCHEMA)
    lib.impl("custom_moe_glu", custom_moe_glu, "CPU")
    lib.impl("custom_moe_glu", _meta, "Meta")


def _meta(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
    return hidden_states.new_empty(hidden_states.shape)


def custom_moe_glu(
    hidden_states: Any,
    gate_proj_weight: Any,
    up_proj_weight: Any,
    down_proj_weight: Any,
    masked_routing_weight: Any,
    hidden_act: str = "silu",
) -> Any:
    """Sum over experts of routing weight x GLU expert output (see the module docstring)."""
    import torch

    if hidden_act != "silu":
        raise NotImplementedError(f"qvl emulator: custom_moe_glu with hidden_act={hidden_act!r} is not emulated")
    x = hidden_states.reshape(-1, hidden_states.shape[-1])
    weights = masked_routing_weight.reshape(gate_proj_weight.shape[0], x.shape[0])
    out = torch.zeros_like(x, dtype=torch.float32)
    for e in torch.nonzero(weights.ne(0).any(dim=1)).flatten().tolist():  # experts some token picked
        rows = torch.nonzero(weights[e].ne(0)).flatten()
        xe = x[rows].float()
        act = torch.nn.functional.silu(xe @ gate_proj_weight[e].float().T) * (xe @ up_proj_weight[e].float().T)
        out.index_add_(0, rows, (act @ down_proj_weight[e].float().T) * weights[e, rows].float().unsqueeze(1))
    return out.to(hidden_states.dtype).reshape(hidden_states.shape)
