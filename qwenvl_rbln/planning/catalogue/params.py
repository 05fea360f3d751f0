"""Exact parameter counts of the Qwen3-VL LM and ViT, and the dtype sizes their weights take on the NPU.

Its own module because the counts are pure geometry (no plan, no NPU): the weight items, bucket-plan's
per-bucket column, load-check's emulated allocations and the plan's quantization checks all read them.
"""

from __future__ import annotations

from qwenvl_rbln.planning.catalogue.modelinfo import TextGeometry, VisionGeometry

RBLN_DTYPE_BYTES = 2  # optimum-rbln artifacts of Qwen3-VL are bf16
QUANT_MODEL_DTYPE = 4  # optimum-rbln get_quantized_model loads the model in float32 (its FIXME: no bf16 yet)
QUANT_WEIGHT_BYTES = {"int8": 1.0, "fp8": 1.0, "int4": 0.5}


# --- exact parameter counts (transformers 5.15.1 Qwen3-VL module shapes) ---------------------------


def text_layer_params(t: TextGeometry) -> int:
    """One Qwen3VLTextDecoderLayer: q/k/v/o without bias, q_norm/k_norm of head_dim, gate/up/down, 2 RMSNorms."""
    return quantizable_layer_params(t) + 2 * t.head_dim + 2 * t.hidden_size


def quantizable_layer_params(t: TextGeometry) -> int:
    """The q/k/v/o/gate/up/down weights of one layer: what optimum-rbln's quantization replaces."""
    q = t.hidden_size * t.num_attention_heads * t.head_dim
    kv = 2 * t.hidden_size * t.num_key_value_heads * t.head_dim
    o = t.num_attention_heads * t.head_dim * t.hidden_size
    mlp = 3 * t.hidden_size * t.intermediate_size
    return q + kv + o + mlp


def quantized_out_features(t: TextGeometry) -> int:
    """Output channels of the 7 quantized linears of one layer (one fp32 weight_scale each)."""
    return (
        t.num_attention_heads * t.head_dim
        + 2 * t.num_key_value_heads * t.head_dim
        + t.hidden_size
        + 2 * t.intermediate_size
        + t.hidden_size
    )


def lm_params(t: TextGeometry) -> dict[str, int]:
    """LM parameters by where they live: layers + norm + lm_head on the device, embed_tokens on the host.

    Qwen3-VL-MoE (``t.moe``): its layers are counted apart (attention in every layer,
    router + experts in the sparse ones, a dense MLP in the others: ``moe_counts``), with its extra keys."""
    if t.moe is not None:
        attn = (
            quantizable_layer_params(t) - 3 * t.hidden_size * t.intermediate_size + 2 * t.head_dim + 2 * t.hidden_size
        )
        moe = moe_counts(t, attention_layer=attn)
        return {
            **moe,
            "norm": t.hidden_size,
            "lm_head": t.vocab_size * t.hidden_size,
            "device": moe["layers"] + t.hidden_size + t.vocab_size * t.hidden_size,
            "embed_tokens_host": t.vocab_size * t.hidden_size,
        }
    layers = t.num_hidden_layers * text_layer_params(t)
    norm = t.hidden_size
    lm_head = t.vocab_size * t.hidden_size  # a copy in the graph even when tied to embed_tokens
    embed = t.vocab_size * t.hidden_size
    return {
        "layer": text_layer_params(t),
        "layers": layers,
        "quantizable": t.num_hidden_layers * quantizable_layer_params(t),
        "norm": norm,
        "lm_head": lm_head,
        "device": layers + norm + lm_head,
        "embed_tokens_host": embed,
        "scale_channels": t.num_hidden_layers * quantized_out_features(t),
    }


def quantized_lm_weight_bytes(t: TextGeometry, weight_bytes: float, rest_bytes: int = QUANT_MODEL_DTYPE) -> int:
    """LM weights on the device once quantized as optimum-rbln 0.12 does it: the q/k/v/o/gate/up/down at
    ``weight_bytes`` per param (QUANT_WEIGHT_BYTES), an fp32 weight_scale per output channel, and the rest (norms,
    lm_head, an MoE's experts and router) at ``rest_bytes`` (float32: get_quantized_model loads the model in it)."""
    lp = lm_params(t)
    rest = lp["device"] - lp["quantizable"]
    scales = lp["scale_channels"] * QUANT_MODEL_DTYPE
    return int(lp["quantizable"] * weight_bytes) + scales + rest * rest_bytes


def vision_block_params(v: VisionGeometry) -> int:
    """One Qwen3VLVisionBlock: 2 LayerNorms with bias, qkv + proj with bias, fc1 + fc2 with bias."""
    h, i = v.hidden_size, v.intermediate_size
    norms = 2 * 2 * h
    qkv = h * 3 * h + 3 * h
    proj = h * h + h
    fc1 = h * i + i
    fc2 = i * h + h
    return norms + qkv + proj + fc1 + fc2


def merger_params(v: VisionGeometry, *, postshuffle_norm: bool) -> int:
    """Qwen3VLVisionPatchMerger: LayerNorm (hidden, or hidden*m^2 after the shuffle) + fc1 + fc2 with bias."""
    merged = v.hidden_size * v.spatial_merge_size**2
    norm = 2 * (merged if postshuffle_norm else v.hidden_size)
    fc1 = merged * merged + merged
    fc2 = merged * v.out_hidden_size + v.out_hidden_size
    return norm + fc1 + fc2


def vision_params(v: VisionGeometry) -> dict[str, int]:
    """ViT parameters by where they live: blocks + mergers on the device, patch/pos embeddings on the host."""
    blocks = v.depth * vision_block_params(v)
    merger = merger_params(v, postshuffle_norm=False)
    deepstack = v.num_deepstack * merger_params(v, postshuffle_norm=True)
    patch = v.in_channels * v.temporal_patch_size * v.patch_size**2 * v.hidden_size + v.hidden_size
    pos = v.num_position_embeddings * v.hidden_size
    return {
        "block": vision_block_params(v),
        "blocks": blocks,
        "merger": merger,
        "deepstack_mergers": deepstack,
        "device": blocks + merger + deepstack,
        "patch_embed_host": patch,
        "pos_embed_host": pos,
    }


def moe_counts(t: TextGeometry, *, attention_layer: int) -> dict[str, int]:
    """Qwen3-VL-MoE text layers as optimum-rbln 0.12 places them (memory/moe.py says how): ``attention_layer`` is
    the attention + norms every layer has; experts and router in the sparse layers, a dense MLP in the others."""
    m = t.moe
    assert m is not None
    sparse = m.sparse_layers(t.num_hidden_layers)
    dense = t.num_hidden_layers - sparse
    experts_layer = m.num_experts * 3 * m.moe_intermediate_size * t.hidden_size
    router_layer = m.num_experts * t.hidden_size
    dense_mlp_layer = 3 * t.hidden_size * t.intermediate_size
    attn_linears = attention_layer - 2 * t.head_dim - 2 * t.hidden_size  # q/k/v/o only
    return {
        "layer": attention_layer,  # the part every layer has
        "layers": t.num_hidden_layers * attention_layer
        + sparse * (experts_layer + router_layer)
        + dense * dense_mlp_layer,
        "sparse_layers": sparse,
        "dense_layers": dense,
        "experts": sparse * experts_layer,
        "experts_layer": experts_layer,
        "router": sparse * router_layer,
        "dense_mlp": dense * dense_mlp_layer,
        "active_experts": sparse * m.num_experts_per_tok * 3 * m.moe_intermediate_size * t.hidden_size,
        # what rbln_quantization replaces: q/k/v/o everywhere, gate/up/down of the dense MLP layers
        "quantizable": t.num_hidden_layers * attn_linears + dense * dense_mlp_layer,
        "scale_channels": t.num_hidden_layers
        * (t.num_attention_heads * t.head_dim + 2 * t.num_key_value_heads * t.head_dim + t.hidden_size)
        + dense * (2 * t.intermediate_size + t.hidden_size),
    }
