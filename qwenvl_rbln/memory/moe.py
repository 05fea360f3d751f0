"""Qwen3-VL-MoE on the NPU as optimum-rbln 0.12 places it: expert, router and dense-MLP weights, the
``custom_moe_glu`` workspace range, and why quantization saves nothing here (the plan refuses it).

Its own module because the MoE layer differs from the dense one in every count, and a dense plan never reaches
here. How 0.12 builds the layer (``transformers/models/qwen3_vl_moe/qwen3_vl_moe_architecture.py``,
``transformers/utils/moe.py``):

* ``Qwen3VLMoeLayer`` keeps transformers' dense ``Qwen3VLMoeTextMLP`` (gate/up/down of ``intermediate_size``) in a
  layer in ``mlp_only_layers`` or off ``decoder_sparse_step``; every other layer gets ``Qwen3VLMoeSparseMoeBlock``.
* The router ``mlp.gate`` becomes an ``nn.Linear(H, E)`` (E x H params); it is not named ``*_proj``, so
  ``rbln_quantization`` (``QUANTIZED_WEIGHTS``) never replaces it.
* ``split_fused_experts`` turns the fused ``gate_up_proj [E, 2I, H]`` into contiguous ``gate [E, I, H]`` and
  ``up [E, I, H]`` and keeps ``down_proj [E, H, I]``; all three are registered **buffers** of the graph, so every
  expert's weights sit on the device (E x 3 x I x H params per sparse layer) and, not being ``nn.Linear``, are
  never quantized: they stay in the model dtype (bf16; float32 when a quantized model is loaded, as
  ``get_quantized_model`` does).
* The attention, norms, ``lm_head`` and the host-side ``embed_tokens`` are as in the dense model.
"""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.memory.context import Ctx, model_dtype
from qwenvl_rbln.memory.params import QUANT_WEIGHT_BYTES, lm_params, quantized_lm_weight_bytes
from qwenvl_rbln.memory.report import MemoryItem, fmt_gib
from qwenvl_rbln.planning.catalogue.devices import MiB
from qwenvl_rbln.planning.catalogue.modelinfo import ModelGeometry, TextGeometry
from qwenvl_rbln.units import fmt_bytes

FP32 = 4
WEIGHTS_ALONE = "the LM weights alone"  # starts the note of a model that cannot fit one card (verdicts.fit_hint)
TOO_LARGE_HINT = (
    "the LM weights alone exceed one card (see the notes of `qvl compile --dry-run`): no rbln_config change fits "
    "this model on one Rebel100 with optimum-rbln 0.12; plan Qwen3-VL-30B-A3B instead (--preset rebel100-30b-a3b)"
)
GLU_WORKSPACE_FORMULA = (
    "per LM graph (prefill: T = prefill_chunk_size; decoder_batch_B: T = B), summed over graphs: "
    "low/estimate = T x top_k x 3 x moe_intermediate x d [gate, up, act of the experts each token picked] "
    "+ T x H x 4 [fp32 sum over experts]; high = T x num_experts x (3 x moe_intermediate + H) x d [every expert "
    "computed for every token, then masked]"
)
GLU_WORKSPACE_SOURCE = (
    "assumption: rebel-compiler decides custom_moe_glu's workspace and optimum-rbln 0.12 does not show it; the op "
    "takes a dense [E, T] routing mask and every expert's [E, I, H] weights (qwen3_vl_moe_architecture.py "
    "Qwen3VLMoeMLP.forward), so the range runs from computing only the picked experts to computing all of them"
)


def weights_formula(g: ModelGeometry, lp: dict[str, int], d: int) -> str:
    """The lm.weights formula of an MoE model in bf16 (or the model dtype)."""
    t, m = g.text, g.text.moe
    assert m is not None
    dense = (
        f" + dense MLP {lp['dense_layers']} x {3 * t.hidden_size * t.intermediate_size:,}" if lp["dense_layers"] else ""
    )
    return (
        f"(attention {t.num_hidden_layers} x {lp['layer']:,} + experts {lp['sparse_layers']} layers x "
        f"{m.num_experts} x 3 x {m.moe_intermediate_size} x {t.hidden_size} + router {lp['sparse_layers']} x "
        f"{m.num_experts} x {t.hidden_size}{dense} + norm {lp['norm']:,} + lm_head {lp['lm_head']:,}) params x {d} B"
    )


def moe_weight_shards(ctx: Ctx, n_lm: int) -> int:
    """Over how many devices the MoE weights are split: ``num_devices`` on an ATOM; 1 on a Rebel100. optimum-rbln
    0.12 itself would hand ``num_devices`` to the compiler (``_tp_support`` for every decoder-only model), but
    Rebellions' v0.12 support matrix lists RSD (one submodule over several NPUs) as not supported on Rebel100
    (as ``planning/lm/checks.py`` warns), and how the compiler would shard custom_moe_glu's expert buffers is
    unknown, so every device is planned with all of them."""
    return 1 if ctx.spec.family == "REBEL" else n_lm


def weights_note(lp: dict[str, int]) -> str:
    return (
        f"{lp['device']:,} params, of which experts {lp['experts']:,} (every expert on the device as dense "
        f"custom_moe_glu buffers, {lp['active_experts']:,} active per token), router {lp['router']:,}, dense MLP "
        f"{lp['dense_mlp']:,}; embed_tokens ({lp['embed_tokens_host']:,} params) stays on the host"
    )


def glu_workspace(g: ModelGeometry, rows: int, dtype_bytes: int, scenario: str) -> int:
    """custom_moe_glu's activations for one graph of ``rows`` tokens in one scenario (see GLU_WORKSPACE_FORMULA)."""
    t, m = g.text, g.text.moe
    assert m is not None
    if scenario == "high":
        return rows * m.num_experts * (3 * m.moe_intermediate_size + t.hidden_size) * dtype_bytes
    return rows * m.num_experts_per_tok * 3 * m.moe_intermediate_size * dtype_bytes + rows * t.hidden_size * FP32


def glu_workspace_item(ctx: Ctx, resolved: Any, n_lm: int) -> MemoryItem | None:
    """``lm.moe_workspace``: custom_moe_glu's workspace per LM device (None for a dense model)."""
    g = ctx.geometry
    if g.text.moe is None or g.text.moe.sparse_layers(g.text.num_hidden_layers) == 0:
        return None
    d = model_dtype(ctx, resolved)
    rows = [resolved.prefill_chunk_size, *resolved.decoder_batch_sizes]
    total = sum(glu_workspace(g, r, d, ctx.scenario) for r in rows)
    low = sum(glu_workspace(g, r, d, "mid") for r in rows)
    high = sum(glu_workspace(g, r, d, "high") for r in rows)
    return MemoryItem(
        "lm.moe_workspace",
        -(-total // n_lm),
        False,
        GLU_WORKSPACE_FORMULA,
        f"estimate {low / MiB:.0f} MiB, up to {high / MiB:.0f} MiB; {GLU_WORKSPACE_SOURCE}",
    )


def quantization_saving(t: TextGeometry, lp: dict[str, int], weight_bytes: float = 1.0) -> int:
    """What quantizing the weights (to ``weight_bytes`` per param, with fp32 per-channel scales) would save against
    bf16 if the rest stayed bf16: only the quantizable linears shrink; experts and router stay as they are. An
    upper bound 0.12 never reaches: it loads a quantized model in float32."""
    return int(lp["quantizable"] * (2 - weight_bytes)) - lp["scale_channels"] * FP32


def params_text(n: int) -> str:
    """A parameter count people read: 28.99 B, 2.10 M, or the count itself for a tiny test model."""
    if n >= 10**9:
        return f"{n / 1e9:.2f} B"
    if n >= 10**6:
        return f"{n / 1e6:.2f} M"
    return f"{n:,}"


def moe_notes(ctx: Ctx, resolved: Any, n_lm: int) -> list[str]:
    """What the report says about an MoE model: the experts stay unquantized, quantization grows the weights in
    0.12 (and does not load Qwen's checkpoints), and a model whose weights alone exceed the card is named as
    such, with what it would take."""
    t = ctx.geometry.text
    if t.moe is None:
        return []
    lp = lm_params(t)
    bf16 = lp["device"] * 2
    saving = quantization_saving(t, lp)
    int4 = quantization_saving(t, lp, QUANT_WEIGHT_BYTES["int4"])
    fp32 = quantized_lm_weight_bytes(t, QUANT_WEIGHT_BYTES["int8"])
    notes = [
        f"Qwen3-VL-MoE: the {params_text(lp['experts'])} expert parameters ({fmt_bytes(lp['experts'] * 2)} in bf16) "
        "and the router stay unquantized in optimum-rbln 0.12 (custom_moe_glu's buffers are not nn.Linear); "
        f"quantization replaces only {params_text(lp['quantizable'])} params, which in bf16 terms would save at "
        f"most {fmt_bytes(saving)} with int8/fp8 weights or {fmt_bytes(int4)} with int4 of the {fmt_bytes(bf16)} "
        f"LM weights ({100 * saving / bf16:.1f} %). In 0.12 it saves nothing: a quantized model is loaded in "
        f"float32, so the LM weights grow to {fmt_bytes(fp32)} (int8), and its loader copies Qwen's fused experts "
        "without transformers' transpose, so the load fails; qvl refuses quantization on this model"
    ]
    weights = bf16 // moe_weight_shards(ctx, n_lm)
    if weights > ctx.usable:
        cards = -(-bf16 // ctx.usable)
        notes.append(
            f"{WEIGHTS_ALONE} ({fmt_gib(bf16)} in bf16, {fmt_gib(lp['experts'] * 2)} of it experts) exceed one "
            f"{ctx.spec.sku}'s {fmt_gib(ctx.usable)} usable, before any KV cache or ViT; quantization cannot close "
            f"the gap (see above), and one model spans one Rebel100. It would need the memory of at least {cards} "
            "cards for the weights alone, split across cards, and Rebellions' v0.12 support matrix lists RSD (one "
            "submodule over several NPUs) as not supported on Rebel100; on one Rebel100, plan Qwen3-VL-30B-A3B "
            "instead (preset rebel100-30b-a3b)"
        )
    return notes
