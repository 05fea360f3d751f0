"""The modelled workspaces: activations of each LM graph and of the ViT's largest bucket, their formulas and
ranges, and the per-bucket figure bucket-plan shows.

Its own module because these are the hypotheses of the planner (not exact counts): what calibration replaces.
"""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.memory import calibration as cal
from qwenvl_rbln.memory.calibration import model_key
from qwenvl_rbln.memory.params import vision_params
from qwenvl_rbln.planning.catalogue.modelinfo import ModelGeometry

FP32 = 4  # attention scores and logits are accumulated in fp32 (modelled)


def lm_graph_workspace(
    geometry: ModelGeometry, rows: int, block: int, logits_rows: int, dtype_bytes: int = 2, prefill: bool = False
) -> dict[str, int]:
    """Activations of one LM graph with ``rows`` query rows (prefill: the chunk; decoder: the batch).

    attention = heads x rows x block x (4 + d)       fp32 scores + probs over one KV block (flash: one partition)
    linear    = rows x d x (3 H + (heads + 2 kv) hd + 3 I)   residual/normed/attn-out, q/k/v, gate/up/act
    io        = rows x d x H x (1 + deepstack if prefill) + 2 x rows x hd x d + logits_rows x vocab x 4
    """
    t, d = geometry.text, dtype_bytes
    attention = t.num_attention_heads * rows * block * (FP32 + d)
    # a Qwen3-VL-MoE layer without a dense MLP has none of its activations (its experts: memory/moe.py)
    dense_mlp = t.moe is None or t.moe.sparse_layers(t.num_hidden_layers) < t.num_hidden_layers
    linear = (
        rows
        * d
        * (
            3 * t.hidden_size
            + (t.num_attention_heads + 2 * t.num_key_value_heads) * t.head_dim
            + (3 * t.intermediate_size if dense_mlp else 0)
        )
    )
    inputs = rows * d * t.hidden_size * (1 + (geometry.vision.num_deepstack if prefill else 0))
    io = inputs + 2 * rows * t.head_dim * d + logits_rows * t.vocab_size * FP32
    return {"attention": attention, "linear": linear, "io": io, "total": attention + linear + io}


LM_WORKSPACE_FORMULA = (
    "per graph (prefill: rows = prefill_chunk_size, 1 logits row; decoder_batch_B: rows = B, B logits rows): "
    "heads x rows x block x (4 + d) [fp32 scores + probs over one KV block] "
    "+ rows x d x (3H + (heads + 2 kv_heads) x head_dim + 3I) [linear activations] "
    "+ inputs (inputs_embeds, deepstack embeds, position_emb) + logits_rows x vocab x 4; summed over graphs "
    "(each .rbln is its own runtime with its own buffers)"
)
LM_WORKSPACE_RANGE = "range: low = without the score block (attention tiled away), high = 2 x the estimate"


def visual_workspace(geometry: ModelGeometry, bucket: int, dtype_bytes: int = 2) -> dict[str, int]:
    """Peak ViT activations for one bucket S (hypothesis: attention scores are materialised, not tiled).

    attention = S^2 x (heads x (4 + d) + 2 d)     fp32 scores + probs for all heads + two S x S masks
                (= 100 S^2 bytes for 16 heads in bf16)
    linear    = S x d x (6 h + I)                 residual, normed, q/k/v, attention out, fc1
    io        = S x d x (h + 2 head_dim) + S/m^2 x out x d x (1 + deepstack)   inputs, cos/sin, outputs
    """
    parts = visual_workspace_parts(geometry, bucket, dtype_bytes, "mid")
    return {k: parts[k] for k in ("attention", "linear", "io", "total")}


def visual_workspace_parts(geometry: ModelGeometry, bucket: int, dtype_bytes: int, scenario: str) -> dict[str, Any]:
    """The ViT workspace in one scenario, split into single tensors (placed whole on one chiplet) and the rest.

    low:  attention tiled: only the S x S attn_mask input stays (S^2 x d)
    mid:  the hypothesis: fp32 scores [heads, S, S] + probs in d + the input mask and its additive copy
    high: scores and probs both fp32 + the two masks
    """
    v, d, s = geometry.vision, dtype_bytes, bucket
    head_dim = v.hidden_size // v.num_heads
    mask = s * s * d
    scores = v.num_heads * s * s * FP32
    probs = v.num_heads * s * s * (FP32 if scenario == "high" else d)
    whole = {"low": [mask], "mid": [scores, probs, mask, mask], "high": [scores, probs, mask, mask]}[scenario]
    linear = s * d * (6 * v.hidden_size + v.intermediate_size)
    merged = s // (v.spatial_merge_size**2)
    io = s * d * (v.hidden_size + 2 * head_dim) + merged * v.out_hidden_size * d * (1 + v.num_deepstack)
    attention = sum(whole)
    return {
        "attention": attention,
        "linear": linear,
        "io": io,
        "total": attention + linear + io,
        "whole": sorted(whole, reverse=True),
        "spread": linear + io,
    }


VISUAL_WORKSPACE_FORMULA = (
    "largest bucket S: S^2 x (heads x (4 + d) + 2d) [fp32 scores + probs of all heads + two S x S masks] "
    "+ S x d x (6h + I) [linear activations] + S x d x (h + 2 head_dim) + S/4 x out x d x (1 + deepstack) [io]"
)
VISUAL_WORKSPACE_RANGE = (
    "range: low = attention tiled (only the S x S mask input, S^2 x d), high = scores and probs both fp32 "
    "(S^2 x (heads x 8 + 2d)); the document's batch-4/262144 failure needs >= ~93 bytes x S^2 for Qwen3-VL-2B"
)


def estimate_for_bucket(
    geometry: ModelGeometry,
    bucket: int,
    dtype_bytes: int = 2,
    *,
    calibration: dict[str, Any] | None = None,
    npu: str | None = None,
) -> dict[str, Any]:
    """Visual workspace for one ViT bucket (bucket-plan's per-bucket column), with its low / high range."""
    ws = visual_workspace(geometry, bucket, dtype_bytes)
    low = visual_workspace_parts(geometry, bucket, dtype_bytes, "low")["total"]
    high = visual_workspace_parts(geometry, bucket, dtype_bytes, "high")["total"]
    weights = vision_params(geometry.vision)["device"] * dtype_bytes
    measured = None
    if calibration and npu:
        measured = cal.lookup(calibration, [model_key(geometry), geometry.name], npu, cal.visual_key(bucket))
    workspace = measured if measured is not None else ws["total"]
    return {
        "bucket": bucket,
        "workspace_bytes": workspace,
        "workspace_low_bytes": measured if measured is not None else low,
        "workspace_high_bytes": measured if measured is not None else high,
        "attention_bytes": ws["attention"],
        "linear_bytes": ws["linear"],
        "io_bytes": ws["io"],
        "weights_bytes": weights,
        "visual_total_bytes": weights + workspace,
        "exact": False,
        "calibrated": measured is not None,
        "formula": VISUAL_WORKSPACE_FORMULA,
        "range": VISUAL_WORKSPACE_RANGE,
    }
