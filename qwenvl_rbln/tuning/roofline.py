"""The cost model: a roofline bound from the NPU's published peak figures, labelled for what it is.

Each graph call takes ``max(FLOPs / peak FLOP/s, bytes read / peak HBM bandwidth)``: the time it could not beat
on this card (``planning.catalogue.devices.ComputeSpec``, cited there). Real calls are slower (launch overhead,
the compiler's tiling, DMA that sustains less than the peak: Rebellions quotes 2.7 TB/s effective against the
4.8 TB/s peak), so every figure is a bound, not a measurement, and is printed as one. Measured graphs (``qvl
profile``'s ``$QVL_HOME/timings.json``) come in through one subclass, ``tuning.measured_roofline.MeasuredRoofline``,
which uses them instead and says so.

- ViT call in bucket S: the executed FLOPs of S patches (``vision.buckets.vit_flops``, the cost ``--optimize``
  minimises) against the ViT weights and the S x S mask read once.
- Prefill chunk: 2 x (params - lm_head) x chunk rows + 2 x lm_head (optimum-rbln 0.12 computes the logits of one
  row per chunk: ``logits_to_keep`` 1) + attention over the context so far, against weights + KV read.
- Decode step on graph G with b real rows at context c: 2 x params x G + attention 4 x layers x heads x head_dim
  x b x c, against weights (MoE: the experts the rows route to) + b x c x KV bytes per token. Linear in b x c, so
  rows at their own contexts cost exactly b rows at their mean context (``tuning.device_time`` passes it).
- Sampler call (vllm-rbln's compiled sampler, one NPU call per engine step, ``VLLM_RBLN_SAMPLER`` on by default):
  an ASSUMPTION, not a bound of a known graph: reading the logits (rows x vocab x 2 bytes) at the peak bandwidth,
  plus ``SAMPLER_LAUNCH_S`` per call (``SAMPLER_ASSUMPTION`` says so wherever it is used).

A MoE model has two ends (``dense_experts``): the low one assumes ``custom_moe_glu`` computes and reads only the
routed experts; the high one that it computes every expert densely (it takes every expert's buffers and a dense
[E, T] mask, so nothing in its interface says it skips any). Which is true is the compiler's secret until measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from qwenvl_rbln.memory.params import lm_params, vision_params
from qwenvl_rbln.planning.catalogue.devices import ComputeSpec
from qwenvl_rbln.planning.catalogue.modelinfo import ModelGeometry
from qwenvl_rbln.vision.buckets import vit_flops

LABEL = "roofline bound, not measured"
# No Rebel100 sampler timing is published and qvl profile does not time it: an assumed fixed cost per call (the
# runtime's launch and the top-k/top-p kernel's fixed work), of the order of a device-call launch. Provisional.
SAMPLER_LAUNCH_S = 20e-6
SAMPLER_ASSUMPTION = (
    "assumed, not measured: one compiled-sampler call per engine step (vllm-rbln's VLLM_RBLN_SAMPLER, on by "
    "default; rbln_sampler.py) = reading its logits (rows x vocab x 2 bytes) at the card's peak HBM bandwidth + "
    f"{SAMPLER_LAUNCH_S * 1e6:g} us per call (an assumed launch cost: no Rebel100 sampler timing is published)"
)


@dataclass
class Roofline:
    geometry: ModelGeometry
    compute: ComputeSpec
    dtype_bytes: int = 2
    chunk: int = 512
    used_measured: set[str] = field(default_factory=set)  # graph keys a subclass answered from measurements
    dense_experts: bool = False  # a MoE's high end: custom_moe_glu computes and reads every expert

    def __post_init__(self) -> None:
        t = self.geometry.text
        self._lm_params = lm_params(t)["device"]
        self._lm_head = t.vocab_size * t.hidden_size
        self._vit_bytes = vision_params(self.geometry.vision)["device"] * self.dtype_bytes
        self._kv_per_token = 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * self.dtype_bytes
        self._attn = t.num_hidden_layers * t.num_attention_heads * t.head_dim
        self._cache: dict[Any, float] = {}
        self._high: Roofline | None = None

    # --- figures ---------------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        return self._kv_per_token

    @property
    def is_moe(self) -> bool:
        return self._experts()[0] > 0

    def high_end(self) -> Roofline:
        """The same cost model with every expert computed densely (a dense model's is itself). ``replace`` keeps a
        subclass and shares its fields (``MeasuredRoofline``'s measurements and the record of which were used), so a
        measured graph is the same figure at both ends."""
        if not self.is_moe or self.dense_experts:
            return self
        if self._high is None:
            self._high = replace(self, dense_experts=True)
        return self._high

    def _time(self, flops: float, nbytes: float) -> float:
        return max(flops / self.compute.fp16_flops, nbytes / self.compute.hbm_bytes_per_s)

    def _experts(self) -> tuple[int, float, float, int]:
        """(sparse layers, params per expert, experts per token, experts) of a MoE text model; zeros when dense."""
        t = self.geometry.text
        moe = getattr(t, "moe", None)
        if not moe:
            return 0, 0.0, 0.0, 0
        sparse = moe.sparse_layers(t.num_hidden_layers)
        return sparse, 3.0 * t.hidden_size * moe.moe_intermediate_size, moe.num_experts_per_tok, moe.num_experts

    def lm_params_read(self, rows: int) -> tuple[float, float]:
        """(params per token, params read per call) for ``rows`` rows: all of them for a dense model; a MoE model
        computes its top-k experts per token and reads the experts its rows route to (expected distinct ones); at
        its high end (``dense_experts``) it computes and reads every expert for every row."""
        sparse, expert, k, experts = self._experts()
        if not sparse or self.dense_experts:
            return float(self._lm_params), float(self._lm_params)
        shared = max(self._lm_params - sparse * experts * expert, 0.0)
        distinct = experts * (1 - (1 - k / experts) ** rows)
        return shared + sparse * k * expert, shared + sparse * distinct * expert

    # --- graphs ----------------------------------------------------------------------------------
    def vit_call(self, bucket: int) -> float:
        key = ("vit", bucket)
        if key not in self._cache:
            flops = vit_flops(bucket, self.geometry.vision)
            self._cache[key] = self._time(flops, self._vit_bytes + bucket * bucket * self.dtype_bytes)
        return self._cache[key]

    def prefill_chunk(self, before: int, block: int) -> float:
        """One prefill chunk (a full ``chunk`` of rows: the graph is compiled at that size) after ``before`` tokens.
        lm_head runs on one row: optimum-rbln 0.12's ``logits_to_keep`` is 1, so the graph takes ``query_position``
        and computes the logits of that row only (its weights are still read once)."""
        per_token, read = self.lm_params_read(self.chunk)
        ctx = before + self.chunk
        body = 2 * (per_token - self._lm_head) * self.chunk + 2 * self._lm_head
        flops = body + 4 * self._attn * self.chunk * (before + self.chunk / 2)
        return self._time(flops, read * self.dtype_bytes + ctx * self._kv_per_token)

    def prefill(self, tokens: int, block: int) -> float:
        """All chunks of one request's prompt."""
        chunks = max(1, math.ceil(tokens / self.chunk))
        key = ("prefill", chunks, block)
        if key not in self._cache:
            self._cache[key] = sum(self.prefill_chunk(i * self.chunk, block) for i in range(chunks))
        return self._cache[key]

    def decode_step(self, graph: int, rows: int, context: float, block: int) -> float:
        """One decode step of graph ``graph`` with ``rows`` real rows, each attending to ``context`` tokens."""
        per_token, read = self.lm_params_read(graph)
        flops = 2 * per_token * graph + 4 * self._attn * rows * context
        return self._time(flops, read * self.dtype_bytes + rows * context * self._kv_per_token)

    def sampler_call(self, rows: int) -> float:
        """One sampler call on ``rows`` rows of logits: ``SAMPLER_ASSUMPTION``."""
        logits = rows * self.geometry.text.vocab_size * self.dtype_bytes
        return SAMPLER_LAUNCH_S + logits / self.compute.hbm_bytes_per_s

    def label(self) -> str:
        if self.used_measured:
            return f"{LABEL}, except measured graphs: {', '.join(sorted(self.used_measured))}"
        return LABEL
