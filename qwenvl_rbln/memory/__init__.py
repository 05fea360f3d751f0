"""Memory planner: will ViT + LM + KV cache fit on each NPU, decided from the plan alone, with honest margins.

Per device, the items below are summed and compared with the usable DRAM (docs/memory-model.md):

* ``lm.weights``        exact: decoder layers + final norm + lm_head (the token embedding stays on the host);
                        with ``quantization``, the q/k/v/o/gate/up/down weights at 8 or 4 bits + fp32 scales and
                        the rest in fp32 (optimum-rbln loads quantized models in float32)
* ``lm.kv_cache``       exact for a given block count: 2 x layers tensors [blocks, kv_heads, block, head_dim],
                        each aligned up to 2 MiB (fp8 KV: 1 byte); the block count is what optimum-rbln 0.12 chooses
* ``lm.attention_mask`` exact (``use_attention_mask``): the prefill [1, 1, chunk, max_seq_len] and decoder
                        [B, 1, 1, max_seq_len] mask inputs
* ``lm.workspace``      modelled: activations of the prefill graph and of every decoder graph
* ``visual.weights``    exact: ViT blocks + merger + deepstack mergers (patch/pos embeddings stay on the host)
* ``visual.workspace``  modelled: attention over the largest bucket S, ~(heads x (4 + 2) + 2 x 2) x S^2 bytes

Every modelled item has a low / high range besides its estimate. The planner runs three scenarios (every
modelled item at its low end, at its estimate, at its high end; automatic KV sizing re-run in each) and a
device's verdict is ``fits`` when it fits in all three, ``does_not_fit`` when it fits in none, ``uncertain``
otherwise. A configuration the product document observed keeps the observed verdict and cites it.

Automatic KV sizing (flash attention, ``kvcache_num_blocks`` 0) is modelled the way optimum-rbln 0.12
does it: after compiling the LM *alone*, against the nominal DRAM of one device (x ``memory_budget``),
fullest chiplet deciding. The ViT that shares the card is not counted there, which is why a shared card
can be filled by the KV pool and the ViT then fails to load.

Pure Python: no torch, no transformers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from qwenvl_rbln.errors import DoesNotFit, InputError
from qwenvl_rbln.memory import calibration as cal
from qwenvl_rbln.memory.calibration import model_key  # re-exported: memory.model_key stays valid
from qwenvl_rbln.planning.devices import MAX_CARD_BYTES, SIZE_SPELLINGS, GiB, MiB, NpuSpec, parse_byte_size
from qwenvl_rbln.planning.modelinfo import QWEN3_VL_2B, ModelGeometry, TextGeometry, VisionGeometry
from qwenvl_rbln.planning.resolved_lm import kv_block_counts

KV_ALIGN = 2 * MiB  # optimum-rbln aligns every KV tensor to 2 MiB
FP32 = 4  # attention scores and logits are accumulated in fp32 (modelled)
RBLN_DTYPE_BYTES = 2  # optimum-rbln artifacts of Qwen3-VL are bf16
QUANT_MODEL_DTYPE = 4  # optimum-rbln get_quantized_model loads the model in float32 (its FIXME: no bf16 yet)
QUANT_WEIGHT_BYTES = {"int8": 1.0, "fp8": 1.0, "int4": 0.5}
SOURCE_SPEC = "optimum-rbln 0.12 DRAM spec"
SOURCE_OVERRIDE = "--device-memory"
SCENARIOS = ("low", "mid", "high")
FITS, DOES_NOT_FIT, UNCERTAIN = "fits", "does_not_fit", "uncertain"

# optimum-rbln 0.12 attention limits (resolved_lm.ATTENTION_LIMITS), for the max_seq_len suggestion.
_EAGER_MAX = {"REBEL": 16384, "ATOM": 32768}
_MIN_FLASH_LEN = 2048

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


def gib(n: float) -> float:
    return n / GiB


def align_up(n: int, a: int = KV_ALIGN) -> int:
    return -(-n // a) * a


def _fmt_gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def _devices(value: int | list[int]) -> list[int]:
    return list(value) if isinstance(value, list) else [value]


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
    """LM parameters by where they live: layers + norm + lm_head on the device, embed_tokens on the host."""
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
    }


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


# --- KV cache --------------------------------------------------------------------------------------


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


# --- modelled workspaces ---------------------------------------------------------------------------


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
    linear = (
        rows
        * d
        * (
            3 * t.hidden_size
            + (t.num_attention_heads + 2 * t.num_key_value_heads) * t.head_dim
            + 3 * t.intermediate_size
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


# --- report ----------------------------------------------------------------------------------------


@dataclass
class MemoryItem:
    name: str
    bytes: int
    exact: bool
    formula: str
    note: str = ""
    calibrated: bool = False
    low_bytes: int | None = None  # filled from the low / high scenarios (exact items: = bytes)
    high_bytes: int | None = None
    whole: list[int] = field(default_factory=list)  # single tensors the chiplet view places whole

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("whole")
        return d


@dataclass
class DeviceMemory:
    device: int
    usable_bytes: int
    items: list[MemoryItem]
    chiplets: dict[str, Any]
    fits: bool | None
    notes: list[str] = field(default_factory=list)
    verdict: str = FITS
    verdict_source: str = "planner"
    total_low_bytes: int | None = None
    total_high_bytes: int | None = None
    ok: bool = True  # this scenario alone: pooled and fullest chiplet within usable, KV search not insufficient

    @property
    def total_bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    @property
    def free_bytes(self) -> int:
        return self.usable_bytes - self.total_bytes

    def to_dict(self) -> dict[str, Any]:
        low = self.total_low_bytes if self.total_low_bytes is not None else self.total_bytes
        high = self.total_high_bytes if self.total_high_bytes is not None else self.total_bytes
        return {
            "device": self.device,
            "usable_bytes": self.usable_bytes,
            "items": [i.to_dict() for i in self.items],
            "total_bytes": self.total_bytes,
            "total_low_bytes": low,
            "total_high_bytes": high,
            "free_bytes": self.free_bytes,
            "free_low_bytes": self.usable_bytes - high,
            "free_high_bytes": self.usable_bytes - low,
            "verdict": self.verdict,
            "verdict_source": self.verdict_source,
            "fits": self.fits,
            "chiplets": self.chiplets,
            "notes": self.notes,
        }


@dataclass
class MemoryReport:
    npu: str
    usable_bytes: int
    usable_source: str
    devices: list[DeviceMemory]
    kv: dict[str, Any]
    suggestions: list[dict[str, Any]]
    assumptions: list[str]
    notes: list[str]

    @property
    def verdict(self) -> str:
        verdicts = {d.verdict for d in self.devices}
        if DOES_NOT_FIT in verdicts:
            return DOES_NOT_FIT
        return UNCERTAIN if UNCERTAIN in verdicts else FITS

    @property
    def fits(self) -> bool | None:
        """True: fits in every scenario; False: does not fit; None: uncertain (the margin is inside the range)."""
        return {FITS: True, DOES_NOT_FIT: False, UNCERTAIN: None}[self.verdict]

    @property
    def margin_bytes(self) -> int:
        return min(d.free_bytes for d in self.devices)

    @property
    def margin_low_bytes(self) -> int:
        """The worst-case margin: every modelled item at its high end."""
        return min(d.usable_bytes - (d.total_high_bytes or d.total_bytes) for d in self.devices)

    def device(self, device_id: int) -> DeviceMemory:
        for d in self.devices:
            if d.device == device_id:
                return d
        raise KeyError(device_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "npu": self.npu,
            "usable_bytes": self.usable_bytes,
            "usable_source": self.usable_source,
            "devices": [d.to_dict() for d in self.devices],
            "verdict": self.verdict,
            "fits": self.fits,
            "margin_bytes": self.margin_bytes,
            "margin_low_bytes": self.margin_low_bytes,
            "kv": self.kv,
            "notes": self.notes,
            "suggestions": self.suggestions,
            "assumptions": self.assumptions,
        }


ASSUMPTIONS = [
    "verdict: each device is estimated three times, every modelled item at its low end, at its estimate and at its "
    "high end (automatic KV sizing re-run each time); 'fits' when the device fits in all three, 'does_not_fit' "
    "when in none, 'uncertain' otherwise; a device fits a scenario when the sum of its items <= its usable bytes "
    "AND the fullest chiplet fits its share",
    "observed: a configuration the product document describes (Qwen3-VL-2B, RBLN-CR13, ViT bucket 16384, flash "
    "partition 8192, automatic KV blocks, bf16) keeps the verdict the document reports, cited in verdict_source",
    "chiplets: KV tensors whole, round-robin over the chiplets; single ViT workspace tensors (the S x S score and "
    "probability buffers, the masks) placed whole on the least-filled chiplet, largest first; weights and the rest "
    "split evenly",
    "usable bytes: chiplets x (DRAM / chiplets - reserve) as optimum-rbln 0.12 computes it (Rebel100: "
    "4 x (36 - 1) GiB = 140 GiB), unless --device-memory gives a measured figure",
    "weights: exact parameter counts x dtype bytes (bf16 = 2 for RBLN artifacts); token embedding, ViT patch "
    "and position embeddings run on the host; with rbln_config.quantization the q/k/v/o/gate/up/down weights take "
    "1 byte (int8, fp8) or 0.5 (int4) + an fp32 scale per output channel and everything else fp32 (optimum-rbln "
    "0.12 get_quantized_model loads quantized models in float32), range low = the rest in bf16",
    "KV cache: 2 x layers tensors [blocks, kv_heads, block, head_dim] in the model dtype (fp8 kv_caches: 1 byte; "
    "a quantized model without fp8 KV: fp32), each aligned up to 2 MiB; one pool shared by prefill and all "
    "decoder graphs",
    "automatic KV blocks (flash, kvcache_num_blocks 0): optimum-rbln 0.12 sizes the pool for the LM graphs alone "
    "(the ViT is not counted), against one device's nominal DRAM x memory_budget (a byte budget is per device), "
    "fullest chiplet deciding",
    "lm.workspace (modelled): " + LM_WORKSPACE_FORMULA + "; " + LM_WORKSPACE_RANGE,
    "visual.workspace (modelled, hypothesis): " + VISUAL_WORKSPACE_FORMULA + "; bucket graphs share one .rbln "
    "and one buffer region, so the largest bucket decides; " + VISUAL_WORKSPACE_RANGE,
    "not counted: host memory, other processes on the NPU, runtime overhead beyond the per-chiplet reserve, "
    "profiler buffers, LoRA adapters",
]


# --- the estimate ----------------------------------------------------------------------------------


def parse_device_memory(device_memory: int | str | None, spec: NpuSpec | None = None) -> int | None:
    """--device-memory as bytes (None when not given); one-line input errors for anything unusable: no unit,
    not positive, or more than the card's physical DRAM (``spec``; without it, the largest card qvl knows)."""
    if device_memory is None:
        return None
    try:
        nbytes = parse_byte_size(device_memory, "--device-memory")
    except InputError as exc:
        raise InputError(exc.message, f"pass --device-memory as the usable bytes per NPU, {SIZE_SPELLINGS}") from None
    if nbytes <= 0:
        raise InputError(f"--device-memory={device_memory!r} must be positive", f"write {SIZE_SPELLINGS}")
    limit = spec.total_bytes if spec is not None else MAX_CARD_BYTES
    if nbytes > limit:
        card = f"one {spec.product} ({spec.sku})" if spec is not None else "any NPU qvl knows (Rebel100)"
        raise InputError(
            f"--device-memory={device_memory!r} is more than the {_fmt_gib(limit)} of DRAM on {card}",
            f"pass at most {limit // GiB}GiB (the usable bytes you measured, e.g. with rbln-smi)",
        )
    return nbytes


_parse_device_memory = parse_device_memory


def _resolve_budget(budget: float | int | None, available_total: int) -> int:
    """optimum-rbln _resolve_memory_budget: None -> all, fraction (0, 1] -> share, int -> bytes."""
    if budget is None:
        return available_total
    if isinstance(budget, float):
        return int(available_total * budget)
    return min(int(budget), available_total)


@dataclass
class _Ctx:
    geometry: ModelGeometry
    spec: NpuSpec
    usable: int
    usable_source: str
    calibration: dict[str, Any]
    dtype_bytes: int
    scenario: str = "mid"


def _quant(resolved: Any) -> dict[str, Any] | None:
    return getattr(resolved, "quantization", None) or None


def _model_dtype(ctx: _Ctx, resolved: Any) -> int:
    """Bytes per element of the compiled model: fp32 for a quantized one (optimum-rbln loads it in float32)."""
    return QUANT_MODEL_DTYPE if _quant(resolved) else ctx.dtype_bytes


def _kv_dtype(ctx: _Ctx, resolved: Any) -> int:
    """optimum-rbln get_input_info: the KV dtype is the model dtype, float8_e4m3fn with kv_caches fp8."""
    q = _quant(resolved)
    if q and q.get("kv_caches") == "fp8":
        return 1
    return _model_dtype(ctx, resolved)


def _lm_weights_item(ctx: _Ctx, resolved: Any, n_lm: int) -> MemoryItem:
    g = ctx.geometry
    lp = lm_params(g.text)
    q = _quant(resolved)
    if not q:
        d = ctx.dtype_bytes
        return MemoryItem(
            "lm.weights",
            -(-lp["device"] * d // n_lm),
            True,
            f"(layers {g.text.num_hidden_layers} x {lp['layer']:,} + norm {lp['norm']:,} + lm_head {lp['lm_head']:,}) "
            f"params x {d} B" + (f" / {n_lm} devices" if n_lm > 1 else ""),
            f"{lp['device']:,} params; embed_tokens ({lp['embed_tokens_host']:,} params) stays on the host",
        )
    wbytes = QUANT_WEIGHT_BYTES[q["weights"]]
    if ctx.scenario == "high" and q["weights"] == "int4":
        wbytes = 1.0  # if the compiler kept int4 weights in int8 containers
    rest_d = 2 if ctx.scenario == "low" else QUANT_MODEL_DTYPE
    scales = g.text.num_hidden_layers * quantized_out_features(g.text) * QUANT_MODEL_DTYPE
    rest = lp["device"] - lp["quantizable"]
    total = int(lp["quantizable"] * wbytes) + scales + rest * rest_d
    return MemoryItem(
        "lm.weights",
        -(-total // n_lm),
        False,
        f"quantized q/k/v/o/gate/up/down {lp['quantizable']:,} params x {wbytes:g} B ({q['weights']}) + fp32 "
        f"weight_scale per output channel ({scales:,} B) + the rest ({rest:,} params: norms, lm_head) x {rest_d} B"
        + (f" / {n_lm} devices" if n_lm > 1 else ""),
        "quantization (optimum-rbln 0.12 rbln_quantization.py: QUANTIZED_WEIGHTS, get_quantized_model loads the "
        "model in float32); modelled from the source, not measured",
    )


def _lm_workspace_item(ctx: _Ctx, resolved: Any) -> tuple[int, MemoryItem]:
    g, d = ctx.geometry, _model_dtype(ctx, resolved)
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


def _attention_mask_item(ctx: _Ctx, resolved: Any, n_lm: int) -> MemoryItem | None:
    """optimum-rbln get_input_info with use_attention_mask: prefill [1, 1, chunk, max_seq_len] and each decoder
    [B, 1, 1, max_seq_len] in the model dtype ([B, max_seq_len] with use_position_ids)."""
    if not getattr(resolved, "use_attention_mask", False):
        return None
    d, L = _model_dtype(ctx, resolved), resolved.max_seq_len
    rows = 1 if getattr(resolved, "use_position_ids", False) else resolved.prefill_chunk_size
    prefill = rows * L * d
    decoders = sum(b * L * d for b in resolved.decoder_batch_sizes)
    total = prefill + decoders
    return MemoryItem(
        "lm.attention_mask",
        -(-total // n_lm),
        True,
        f"prefill attention_mask [1, 1, {rows}, {L}] x {d} B + decoder masks [B, 1, 1, {L}] x {d} B for B in "
        f"{resolved.decoder_batch_sizes}",
        f"use_attention_mask: prefill input {prefill / MiB:.0f} MiB, decoder inputs {decoders / MiB:.1f} MiB",
        whole=[prefill],
    )


def _visual_workspace_item(ctx: _Ctx, resolved: Any) -> MemoryItem:
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
    parts = visual_workspace_parts(g, largest, _model_dtype(ctx, resolved), ctx.scenario)
    mid = visual_workspace(g, largest, _model_dtype(ctx, resolved))
    return MemoryItem(
        "visual.workspace",
        parts["total"],
        False,
        VISUAL_WORKSPACE_FORMULA,
        f"estimate for the largest bucket S={largest}: attention {_fmt_gib(mid['attention'])} "
        f"(hypothesis: scores materialised, not tiled; the fp32 score buffer is one "
        f"{_fmt_gib(g.vision.num_heads * largest * largest * FP32)} tensor) + linear {mid['linear'] / MiB:.0f} MiB "
        f"+ io {mid['io'] / MiB:.0f} MiB; {VISUAL_WORKSPACE_RANGE}",
        whole=parts["whole"],
    )


def _kv_blocks(ctx: _Ctx, resolved: Any, lm_nonkv_per_device: int, shards: int) -> dict[str, Any]:
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


def _chiplet_loads(chiplets: int, kv_tensors: int, kv_tensor: int, whole: list[int], spread: int) -> list[int]:
    """Bytes per chiplet: KV tensors round-robin, single tensors whole (largest first, least-filled chiplet),
    the rest split evenly."""
    loads = [(kv_tensors // chiplets + (1 if i < kv_tensors % chiplets else 0)) * kv_tensor for i in range(chiplets)]
    for size in sorted(whole, reverse=True):
        i = loads.index(min(loads))
        loads[i] += size
    share = -(-spread // chiplets)
    return [x + share for x in loads]


def estimate(
    geometry: ModelGeometry,
    resolved: Any,
    spec: NpuSpec,
    placement: dict[str, Any],
    *,
    device_memory: int | str | None = None,
    calibration: dict[str, Any] | None = None,
    dtype_bytes: int | None = None,
    suggest: bool = True,
) -> MemoryReport:
    """Per-device memory of a resolved LM + ViT placement; ``calibration`` None reads the default file."""
    override = parse_device_memory(device_memory, spec)
    ctx = _Ctx(
        geometry=geometry,
        spec=spec,
        usable=override if override is not None else spec.usable_bytes,
        usable_source=SOURCE_OVERRIDE if override is not None else SOURCE_SPEC,
        calibration=cal.load_calibration() if calibration is None else calibration,
        dtype_bytes=dtype_bytes or geometry.dtype_bytes,
    )
    report = _evaluate(ctx, resolved, placement)
    if suggest:
        report.suggestions = _suggestions(ctx, resolved, placement, report)
    return report


def observed_case(ctx: _Ctx, resolved: Any, placement: dict[str, Any]) -> tuple[str, str] | None:
    """(verdict, citation) when the product document's observations decide the configuration, else None.

    The document's cases: Qwen3-VL-2B in bf16 on RBLN-CR13 with its nominal DRAM, ViT bucket 16384, flash
    attention with partition 8192 and prefill chunk 512, automatic (or the full) KV blocks, no memory_budget,
    num_devices 1 (OBSERVED). A configuration of the same kind that needs no more memory than one observed to
    fit (batch, context, largest ViT bucket and decoder graphs all at most its) fits; one that needs at least as
    much as the one observed to fail (batch >= 4 at the full 262144 context beside a ViT bucket >= 16384) fails.
    Smaller ViT buckets beside the largest add no buffer (one .rbln, the largest decides)."""
    r = resolved
    lm_devs, vis_devs = _devices(placement["device"]), _devices(placement.get("visual_device", placement["device"]))
    if (
        ctx.usable_source != SOURCE_SPEC
        or ctx.spec.sku != "RBLN-CR13"
        or ctx.dtype_bytes != 2
        or model_key(ctx.geometry) != model_key(QWEN3_VL_2B)
        or _quant(r)
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


def _evaluate(ctx: _Ctx, resolved: Any, placement: dict[str, Any]) -> MemoryReport:
    """The estimate, its low / high ranges from the two other scenarios, and a verdict per device."""
    runs = {s: _estimate(replace(ctx, scenario=s), resolved, placement) for s in SCENARIOS}
    report = runs["mid"]
    observed = observed_case(ctx, resolved, placement)
    for dev in report.devices:
        others = [run.device(dev.device) for run in runs.values()]
        for item in dev.items:
            sizes = [next((i.bytes for i in o.items if i.name == item.name), item.bytes) for o in others]
            item.low_bytes, item.high_bytes = min(sizes), max(sizes)
        totals = [o.total_bytes for o in others]
        dev.total_low_bytes, dev.total_high_bytes = min(totals), max(totals)
        oks = [o.ok for o in others]
        dev.verdict = FITS if all(oks) else DOES_NOT_FIT if not any(oks) else UNCERTAIN
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
        elif dev.verdict == UNCERTAIN:
            dev.notes.append(
                f"uncertain: the margin is {(dev.usable_bytes - dev.total_high_bytes) / GiB:+.2f} GiB with every "
                f"modelled item at its high end and {(dev.usable_bytes - dev.total_low_bytes) / GiB:+.2f} GiB at its "
                "low end; calibrate with `qvl load-check` on the NPU host, or take a suggestion that fits"
            )
        dev.fits = {FITS: True, DOES_NOT_FIT: False, UNCERTAIN: None}[dev.verdict]
    low_kv, high_kv = runs["low"].kv["num_blocks"], runs["high"].kv["num_blocks"]
    report.kv["num_blocks_range"] = [min(low_kv, high_kv, report.kv["num_blocks"]), max(low_kv, high_kv)]
    return report


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
        "eager": f"eager: {n_blocks} blocks of max_seq_len (= batch_size)",
    }[kv["outcome"]]


def _kv_cache_item(ctx: _Ctx, resolved: Any, kv: dict[str, Any], n_lm: int) -> tuple[MemoryItem, int]:
    """The KV pool item per LM device and the bytes of one KV tensor; records the pool's bytes in ``kv``."""
    g = ctx.geometry
    kv_d = kv["dtype_bytes"]
    shown_blocks = resolved.num_min_blocks if kv["outcome"] == "insufficient" else kv["num_blocks"]
    tensor_bytes = kv_tensor_bytes(g, kv["block_size"], shown_blocks, kv_d, n_lm)
    kv_total = kv["tensors"] * tensor_bytes
    kv["bytes"] = kv_total
    per_block = kv_block_bytes_per_tensor(g, kv["block_size"], kv_d, n_lm)
    dtype_note = {1: "fp8 (kv_caches: fp8)", 2: "bf16", 4: "fp32"}.get(kv_d, f"{kv_d} B")
    if _quant(resolved) and kv_d == 4:
        dtype_note += " (a quantized model compiles in float32 and its KV follows the model dtype without fp8)"
    item = MemoryItem(
        "lm.kv_cache",
        kv_total,
        kv["outcome"] != "partial",
        f"2 x {g.text.num_hidden_layers} layers x align_2MiB({shown_blocks} blocks x "
        f"{-(-g.text.num_key_value_heads // n_lm)} kv_heads x {kv['block_size']} x {g.text.head_dim} x {kv_d} B) "
        f"= {kv['tensors']} x {tensor_bytes / MiB:.0f} MiB",
        _kv_note(resolved, kv) + f"; {per_block * kv['tensors'] / MiB:.0f} MiB per block; {dtype_note}",
    )
    return item, tensor_bytes


def _lm_items(ctx: _Ctx, resolved: Any, n_lm: int) -> tuple[list[MemoryItem], dict[str, Any], int]:
    """The LM's items per device (sharded over n_lm devices when num_devices > 1), the KV sizing, the KV tensor
    bytes."""
    lm_weights = _lm_weights_item(ctx, resolved, n_lm)
    lm_ws_total, lm_ws = _lm_workspace_item(ctx, resolved)
    lm_ws.bytes = -(-lm_ws_total // n_lm)
    mask = _attention_mask_item(ctx, resolved, n_lm)
    lm_nonkv = lm_weights.bytes + lm_ws.bytes + (mask.bytes if mask else 0)
    kv = _kv_blocks(ctx, resolved, lm_nonkv, n_lm)
    lm_kv, tensor_bytes = _kv_cache_item(ctx, resolved, kv, n_lm)
    return [lm_weights, lm_kv, lm_ws] + ([mask] if mask else []), kv, tensor_bytes


def _visual_items(ctx: _Ctx, resolved: Any, n_vis: int) -> list[MemoryItem]:
    """The ViT's weights and workspace per device (split over n_vis devices)."""
    g, d = ctx.geometry, _model_dtype(ctx, resolved)
    vp = vision_params(g.vision)
    vis_w = vp["device"] * d
    vis_weights = MemoryItem(
        "visual.weights",
        -(-vis_w // n_vis),
        not _quant(resolved),
        f"({g.vision.depth} blocks x {vp['block']:,} + merger {vp['merger']:,} + {g.vision.num_deepstack} deepstack "
        f"mergers {vp['deepstack_mergers']:,}) params x {d} B" + (f" / {n_vis} devices" if n_vis > 1 else ""),
        f"{vp['device']:,} params; patch_embed ({vp['patch_embed_host']:,}) and pos_embed "
        f"({vp['pos_embed_host']:,}) stay on the host"
        + ("; fp32: a quantized model is loaded in float32 and the ViT is not quantized" if _quant(resolved) else ""),
    )
    if _quant(resolved) and ctx.scenario == "low":
        vis_weights.bytes = -(-vp["device"] * 2 // n_vis)
    vis_ws = _visual_workspace_item(ctx, resolved)
    vis_ws.bytes = -(-vis_ws.bytes // n_vis)
    return [vis_weights, vis_ws]


def _items_by_device(
    lm_items: list[MemoryItem], vis_items: list[MemoryItem], lm_devs: list[int], vis_devs: list[int]
) -> dict[int, list[MemoryItem]]:
    """Each device's own copies of the items placed on it (LM first, then the ViT on a shared device)."""
    by_dev: dict[int, list[MemoryItem]] = {}
    for dev in lm_devs:
        by_dev.setdefault(dev, []).extend(replace(i) for i in lm_items)
    for dev in vis_devs:
        by_dev.setdefault(dev, []).extend(replace(i) for i in vis_items)
    return by_dev


def _chiplet_view(ctx: _Ctx, items: list[MemoryItem], kv: dict[str, Any], tensor_bytes: int) -> dict[str, Any]:
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
        "usable_per_chiplet_bytes": usable_chiplet,
        "fullest_bytes": fullest,
        "free_bytes": usable_chiplet - fullest,
        "fits": fullest <= usable_chiplet,
        "assumption": f"KV tensors whole and round-robin ({per_chiplet_tensors} of {kv['tensors']} on the fullest "
        "chiplet); single ViT workspace tensors whole (largest first, least-filled chiplet); weights and the "
        "rest split evenly",
    }


def _failure_note(
    ctx: _Ctx, resolved: Any, items: list[MemoryItem], kv: dict[str, Any], chip: dict[str, Any], has: tuple[bool, bool]
) -> str:
    """Why a device that does not fit fails; ``has`` = (LM here, ViT here)."""
    has_lm, has_vis = has
    n_blocks, total = kv["num_blocks"], sum(i.bytes for i in items)
    if has_lm and kv["outcome"] == "insufficient":
        return (
            f"optimum-rbln's compile fails: 'Insufficient memory for the required KV cache: only {n_blocks} "
            f"blocks can be allocated, but at least {resolved.num_min_blocks} blocks are required'"
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
            f"({n_blocks} blocks, {_fmt_gib(kv['bytes'])}) for the LM alone ({_fmt_gib(lm_only)} of "
            f"{_fmt_gib(kv.get('budget_bytes', ctx.usable))} budget); the ViT on the same device needs "
            f"{_fmt_gib(vis_only)} more, so loading fails with 'Failed to create RBLN runtime ... "
            "Lack of device memory'"
        )
    if has_lm and kv["mode"] == "auto" and ctx.usable_source == SOURCE_OVERRIDE:
        return (
            f"auto KV sizing aims at optimum-rbln's nominal {_fmt_gib(ctx.spec.usable_bytes)}, not the "
            f"{_fmt_gib(ctx.usable)} given with --device-memory"
        )
    return (
        f"needs {_fmt_gib(total)} of {_fmt_gib(ctx.usable)} usable (fullest chiplet {_fmt_gib(chip['fullest_bytes'])} "
        f"of {_fmt_gib(chip['usable_per_chiplet_bytes'])}): loading fails with 'Failed to create RBLN runtime ... "
        "Lack of device memory'"
    )


def _device_memory(
    ctx: _Ctx,
    resolved: Any,
    dev: int,
    items: list[MemoryItem],
    kv: dict[str, Any],
    tensor_bytes: int,
    has: tuple[bool, bool],
) -> DeviceMemory:
    """One device in one scenario: its chiplet view, whether it fits (``ok``) and the notes that say why."""
    chip = _chiplet_view(ctx, items, kv, tensor_bytes)
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
    if total <= ctx.usable and not chip["fits"]:
        notes.append(
            f"the fullest chiplet is over ({_fmt_gib(chip['fullest_bytes'])} of "
            f"{_fmt_gib(chip['usable_per_chiplet_bytes'])}) although the card total fits: a single tensor is placed "
            "whole on one chiplet"
        )
    return DeviceMemory(dev, ctx.usable, items, chip, ok, notes, ok=ok)


def _report_notes(ctx: _Ctx, resolved: Any) -> list[str]:
    """Notes on the whole report: a --device-memory override, a quantized model."""
    notes: list[str] = []
    if ctx.usable_source == SOURCE_OVERRIDE:
        notes.append(
            f"usable bytes per device from --device-memory ({_fmt_gib(ctx.usable)}); optimum-rbln's own auto KV "
            f"sizing still assumes {_fmt_gib(ctx.spec.usable_bytes)}"
        )
    q = _quant(resolved)
    if q:
        notes.append(
            f"quantization weights={q['weights']} activations={q['activations']} kv_caches={q['kv_caches']}: "
            "optimum-rbln 0.12 loads a quantized model in float32 (rbln_quantization.get_quantized_model), so the "
            "unquantized parts, the ViT and a non-fp8 KV cache are fp32; modelled from the source, not measured"
        )
    return notes


def _estimate(ctx: _Ctx, resolved: Any, placement: dict[str, Any]) -> MemoryReport:
    """One scenario: the items per device and whether each device fits (``ok``); no verdict, no ranges."""
    lm_devs = _devices(placement["device"])
    vis_devs = _devices(placement.get("visual_device", placement["device"]))
    lm_items, kv, tensor_bytes = _lm_items(ctx, resolved, len(lm_devs))
    vis_items = _visual_items(ctx, resolved, len(vis_devs))
    by_dev = _items_by_device(lm_items, vis_items, lm_devs, vis_devs)
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
        notes=_report_notes(ctx, resolved),
    )


def estimate_plan(
    plan: Any,
    device_memory: int | str | None = None,
    calibration: dict[str, Any] | None = None,
    *,
    largest_vit_bucket: int | None = None,
    suggest: bool = True,
) -> MemoryReport:
    """estimate() for a Plan (bf16 for the rbln backend, the model's dtype for the torch reference);
    ``largest_vit_bucket`` answers "would it fit if this were the largest ViT bucket" for bucket-plan."""
    dtype = RBLN_DTYPE_BYTES if plan.backend == "rbln" else plan.geometry.dtype_bytes
    resolved = plan.resolved
    if largest_vit_bucket is not None:
        kept = [b for b in resolved.vit_buckets if b < largest_vit_bucket]
        resolved = replace(resolved, vit_buckets=[*kept, largest_vit_bucket])
    return estimate(
        plan.geometry,
        resolved,
        plan.npu_spec,
        plan.placement,
        device_memory=device_memory,
        calibration=calibration,
        dtype_bytes=dtype,
        suggest=suggest,
    )


def verdict_of(report: MemoryReport | dict[str, Any]) -> str:
    data = report.to_dict() if isinstance(report, MemoryReport) else report
    if data.get("verdict") in (FITS, DOES_NOT_FIT, UNCERTAIN):
        return data["verdict"]
    return {True: FITS, False: DOES_NOT_FIT}.get(data.get("fits"), UNCERTAIN)


def gate_stops(verdict: str | None, uncertain_ok: bool = False) -> bool:
    """The one memory gate every command applies (compile, its dry run, bucket-plan): stop when the planner
    predicts a failure, or cannot tell (``uncertain``) unless ``uncertain_ok``."""
    return verdict == DOES_NOT_FIT or (verdict == UNCERTAIN and not uncertain_ok)


def ensure_fits(report: MemoryReport | dict[str, Any], *, force: bool = False, uncertain_ok: bool = False) -> None:
    """Raise DoesNotFit (exit 4) when the gate stops (``gate_stops``); never with ``force``."""
    data = report.to_dict() if isinstance(report, MemoryReport) else report
    if force or not gate_stops(verdict_of(data), uncertain_ok):
        return
    raise DoesNotFit(gate_message(data), fit_hint(data))


def gate_message(data: dict[str, Any], lead: str = "the memory planner") -> str:
    """The one-line reason a gate stops: which devices do not fit, or which are uncertain and by how much."""
    if verdict_of(data) == DOES_NOT_FIT:
        over = [d for d in data["devices"] if d.get("verdict", "fits" if d.get("fits") else "") == DOES_NOT_FIT]
        where = "; ".join(
            f"device {d['device']} needs {_fmt_gib(d['total_bytes'])} of {_fmt_gib(d['usable_bytes'])}" for d in over
        )
        return f"{lead} predicts this will not fit: {where}"
    unsure = [d for d in data["devices"] if d.get("verdict") == UNCERTAIN]
    where = "; ".join(
        f"device {d['device']} margin {(d['usable_bytes'] - d['total_high_bytes']) / GiB:+.2f} .. "
        f"{(d['usable_bytes'] - d['total_low_bytes']) / GiB:+.2f} GiB"
        for d in unsure
    )
    return (
        f"{lead} cannot tell whether this fits (verdict uncertain: {where}, the modelled items' range straddles "
        "the limit); --uncertain-ok accepts it"
    )


def fit_hint(data: dict[str, Any], more_where: str = "in `qvl compile --dry-run`") -> str:
    """The fix for a configuration that does not fit: the planner's first ready --set, or, when no single change
    it tries fits, what is too large and what is left to change."""
    hints = [" ".join(f"--set {x}" for x in sug["set"]) for sug in data.get("suggestions") or []]
    if hints:
        more = f" ({len(hints) - 1} more {more_where})" if len(hints) > 1 else ""
        return f"try {hints[0]}{more}, or pass --force to compile anyway"
    return (
        "no single change the planner tries fits with margin to spare (context, batch, ViT bucket, ViT placement, "
        "memory_budget): see the items per device in `qvl compile --dry-run`, combine changes, or pass "
        "--device-memory if the card really has more; --force compiles anyway"
    )


# --- suggestions -----------------------------------------------------------------------------------


def _with(resolved: Any, **changes: Any) -> Any:
    """A ResolvedLM with the derived fields (block, full/min blocks, decoder graphs) recomputed."""
    new = replace(resolved, **changes)
    block = new.max_seq_len if new.attn_impl != "flash_attn" else new.kvcache_block_size
    full, minimum = kv_block_counts(new.max_seq_len, block, new.batch_size, new.attn_impl)
    return replace(new, kvcache_block_size=block, num_full_blocks=full, num_min_blocks=minimum)


def _summary(report: MemoryReport) -> dict[str, Any]:
    return {
        "verdict": report.verdict,
        "fits": report.fits,
        "margin_bytes": report.margin_bytes,
        "margin_low_bytes": report.margin_low_bytes,
        "devices": [
            {
                "device": d.device,
                "verdict": d.verdict,
                "total_bytes": d.total_bytes,
                "total_high_bytes": d.total_high_bytes,
                "free_bytes": d.free_bytes,
                "free_low_bytes": d.usable_bytes - (d.total_high_bytes or d.total_bytes),
            }
            for d in report.devices
        ],
        "chiplet_margin_low_bytes": min(
            d.chiplets["usable_per_chiplet_bytes"] - d.chiplets.get("fullest_high_bytes", d.chiplets["fullest_bytes"])
            for d in report.devices
        ),
        "kv_blocks": report.kv["num_blocks"],
    }


def _sug(kind: str, text: str, sets: list[str], report: MemoryReport, **extra: Any) -> dict[str, Any]:
    """A fix is offered only when its own estimate fits in every scenario (margin to spare at the high end)."""
    return {
        "kind": kind,
        "text": text,
        "set": sets,
        "cli": " ".join(f"--set {s}" for s in sets),
        **_summary(report),
        **extra,
    }


def _suggestions(ctx: _Ctx, resolved: Any, placement: dict[str, Any], report: MemoryReport) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    lm_devs = _devices(placement["device"])
    vis_devs = _devices(placement.get("visual_device", placement["device"]))
    shared = bool(set(lm_devs) & set(vis_devs))
    flash = resolved.attn_impl == "flash_attn"
    auto = flash and not resolved.kvcache_num_blocks

    def run(res: Any = resolved, pl: dict[str, Any] = placement) -> MemoryReport:
        return _evaluate(ctx, res, pl)

    if report.verdict == FITS:
        if shared and auto and report.kv["outcome"] == "partial":
            sug = _memory_budget_suggestion(ctx, resolved, placement, report, run, vis_devs)
            if sug:
                out.append(sug)
        return out

    # 1. the largest max_seq_len (a multiple of the partition) that fits at this batch
    found = _largest_context(ctx, resolved, run)
    if found:
        out.append(_context_suggestion(resolved, *found))

    # 2. the largest batch that fits at this context
    for batch in range(resolved.batch_size - 1, 0, -1):
        dbs = sorted({b for b in resolved.decoder_batch_sizes if b <= batch} | {batch})
        res, block_sets = _explicit_blocks_follow(
            _with(resolved, batch_size=batch, decoder_batch_sizes=sorted(dbs, reverse=True)), resolved, flash
        )
        if res is None:
            continue
        rep = run(res)
        if rep.fits:
            out.append(
                _sug(
                    "batch_size",
                    f"batch_size={batch}: the largest batch that fits with max_seq_len {resolved.max_seq_len} "
                    f"(decoder graphs {dbs})",
                    [
                        f"batch_size={batch}",
                        "decoder_batch_sizes=" + "[" + ",".join(str(b) for b in dbs) + "]",
                        *block_sets,
                    ],
                    rep,
                )
            )
            break

    # 3. the ViT on its own NPU
    if shared:
        free_ids = [i for i in range(max(lm_devs + vis_devs) + len(vis_devs) + 1) if i not in lm_devs][: len(vis_devs)]
        new_vis: int | list[int] = free_ids if isinstance(placement.get("visual_device"), list) else free_ids[0]
        rep = run(pl={**placement, "visual_device": new_vis})
        if rep.fits:
            value = "[" + ",".join(map(str, new_vis)) + "]" if isinstance(new_vis, list) else str(new_vis)
            out.append(
                _sug(
                    "visual_device",
                    f"move the ViT to its own NPU (device {value}); the LM and its KV cache keep device "
                    f"{placement['device']} (the documented remedy for large batches at full context)",
                    [f"placement.visual_device={value}"],
                    rep,
                )
            )

    # 3b. a smaller largest ViT bucket (its workspace grows with S^2)
    sug = _vit_bucket_suggestion(resolved, placement, run)
    if sug:
        out.append(sug)

    # 4. a memory_budget that leaves room for the ViT (or for what --device-memory says is really there)
    if auto:
        sug = _memory_budget_suggestion(ctx, resolved, placement, report, run, vis_devs if shared else [])
        if sug:
            out.append(sug)

    # 5. an explicit block count that fits
    if flash and resolved.kvcache_num_blocks:
        for n in range(resolved.kvcache_num_blocks - 1, resolved.num_min_blocks - 1, -1):
            rep = run(replace(resolved, kvcache_num_blocks=n))
            if rep.fits:
                out.append(
                    _sug(
                        "kvcache_num_blocks",
                        f"kvcache_num_blocks={n}: the most KV blocks that fit (full {resolved.num_full_blocks}); fewer "
                        "than full means optimum-rbln's own generate() can run out of blocks on long batches",
                        [f"kvcache_num_blocks={n}"],
                        rep,
                    )
                )
                break

    # 6. nothing fits alone: a smaller top ViT bucket together with the largest context that then fits
    if not out:
        sug = _bucket_and_context_suggestion(ctx, resolved, placement, run)
        if sug:
            out.append(sug)
    return out


def _largest_context(ctx: _Ctx, resolved: Any, run: Any) -> tuple[int, Any, MemoryReport, list[str]] | None:
    """(length, resolved, report, extra --sets) for the largest shorter max_seq_len that fits, else None."""
    flash = resolved.attn_impl == "flash_attn"
    if flash:
        step = resolved.kvcache_block_size
        candidates = [k * step for k in range(resolved.max_seq_len // step - 1, 1, -1)]
        candidates = [c for c in candidates if c >= _MIN_FLASH_LEN]
    else:
        top = min(resolved.max_seq_len - 1, _EAGER_MAX.get(ctx.spec.family, 16384))
        candidates = [c for c in range(top - top % 1024, 1023, -1024)]
    for length in candidates:
        res, block_sets = _explicit_blocks_follow(_with(resolved, max_seq_len=length), resolved, flash)
        if res is None:
            continue
        rep = run(res)
        if rep.fits:
            return length, res, rep, block_sets
    return None


def _context_suggestion(
    before: Any, length: int, res: Any, rep: MemoryReport, block_sets: list[str], also: list[str] | None = None
) -> dict[str, Any]:
    flash = before.attn_impl == "flash_attn"
    step = before.kvcache_block_size
    unit = f"{length // step} partitions of {step}" if flash else "eager"
    return _sug(
        "max_seq_len",
        f"max_seq_len={length}: the largest context ({unit}) that fits at batch {before.batch_size} "
        f"(KV {_fmt_gib(rep.kv['bytes'])})",
        [f"max_seq_len={length}", *block_sets, *(also or [])],
        rep,
    )


def _bucket_and_context_suggestion(
    ctx: _Ctx, resolved: Any, placement: dict[str, Any], run: Any
) -> dict[str, Any] | None:
    """When no single change fits: the largest top ViT bucket that fits beside the shortest context, then the
    largest context that fits beside that bucket (two --sets applied together)."""
    flash = resolved.attn_impl == "flash_attn"
    shortest = max(_MIN_FLASH_LEN, 2 * resolved.kvcache_block_size) if flash else 1024
    if shortest >= resolved.max_seq_len:
        return None
    small, _ = _explicit_blocks_follow(_with(resolved, max_seq_len=shortest), resolved, flash)
    if small is None:
        return None
    bucket = _vit_bucket_suggestion(small, placement, run)
    if bucket is None:
        return None
    vit = replace(resolved, vit_buckets=bucket["vit_buckets"])
    found = _largest_context(ctx, vit, run)
    if not found:
        return None
    length, res, rep, block_sets = found
    sug = _context_suggestion(resolved, length, res, rep, block_sets, also=bucket["set"])
    sug["kind"] = "max_seq_len+visual.max_seq_len"
    sug["text"] += f", together with {bucket['text']}"
    return sug


def _explicit_blocks_follow(res: Any, before: Any, flash: bool) -> tuple[Any | None, list[str]]:
    """With an explicit ``kvcache_num_blocks``, a smaller context or batch needs fewer blocks: keep the count
    at most the new full count (and say so as a --set); None when the count falls below the new minimum."""
    if not (flash and before.kvcache_num_blocks):
        return res, []
    n = min(before.kvcache_num_blocks, res.num_full_blocks)
    if n < res.num_min_blocks:
        return None, []
    if n == before.kvcache_num_blocks:
        return res, []
    return replace(res, kvcache_num_blocks=n), [f"kvcache_num_blocks={n}"]


def _vit_bucket_suggestion(resolved: Any, placement: dict[str, Any], run: Any) -> dict[str, Any] | None:
    """The largest top ViT bucket (a multiple of 4, at least 256 patches) that makes the plan fit: images above
    it are resized down to it by the processor's max_pixels, so it trades image detail for memory."""
    buckets = sorted(resolved.vit_buckets)
    top = buckets[-1]

    def with_top(size: int) -> Any:
        return replace(resolved, vit_buckets=sorted({b for b in buckets[:-1] if b < size} | {size}))

    lo, hi, best = 64, top // 4 - 1, None  # in units of 4 patches
    if hi < lo or not run(with_top(lo * 4)).fits:
        return None
    while lo <= hi:
        mid = (lo + hi) // 2
        if run(with_top(mid * 4)).fits:
            best, lo = mid * 4, mid + 1
        else:
            hi = mid - 1
    if best is None:
        return None
    new = with_top(best)
    rep = run(new)
    value = "[" + ",".join(str(b) for b in new.vit_buckets) + "]"
    return _sug(
        "visual.max_seq_len",
        f"visual.max_seq_len={value}: the largest top ViT bucket that fits ({best} patches, down from {top}); "
        f"images above {best * 256:,} pixels are resized down to it (processor max_pixels)",
        [f"visual.max_seq_len={value}"],
        rep,
        vit_buckets=new.vit_buckets,
    )


def _memory_budget_suggestion(
    ctx: _Ctx, resolved: Any, placement: dict[str, Any], report: MemoryReport, run: Any, vis_devs: list[int]
) -> dict[str, Any] | None:
    lm_devs = _devices(placement["device"])
    dev = report.device(lm_devs[0])
    residents = sum(i.bytes for i in dev.items if not i.name.startswith("lm."))
    nominal = ctx.spec.usable_bytes
    ideal = (ctx.usable - residents) / nominal
    if ideal <= 0:
        return None
    coarse = [k / 20 for k in range(min(20, math.floor(ideal * 20)), 0, -1)]
    fine = [k / 100 for k in range(min(100, math.floor(ideal * 100)), 0, -1)]
    for fraction in coarse + fine:
        res = replace(resolved, memory_budget=round(fraction, 2))
        rep = run(res)
        if rep.fits and rep.kv["outcome"] in ("full", "partial"):
            n, full = rep.kv["num_blocks"], resolved.num_full_blocks
            why = (
                f"the ViT ({_fmt_gib(residents)}) fits beside it"
                if vis_devs
                else f"it stays within the {_fmt_gib(ctx.usable)} given with --device-memory"
            )
            trade = (
                f"it leaves {n} of {full} full KV blocks: fine for vllm-rbln (it pages blocks), but optimum-rbln's own "
                "generate() can run out of blocks ('No memory blocks are available for allocation') when all "
                f"{resolved.batch_size} rows run long"
                if n < full
                else f"all {full} full KV blocks still fit"
            )
            return _sug(
                "memory_budget",
                f"memory_budget={fraction:.2f}: optimum-rbln sizes the KV pool within {fraction:.0%} of "
                f"{_fmt_gib(nominal)} ({_fmt_gib(int(nominal * fraction))}) so {why}; trade: {trade}",
                [f"memory_budget={fraction:.2f}"],
                rep,
                full_blocks=full,
            )
    return None
