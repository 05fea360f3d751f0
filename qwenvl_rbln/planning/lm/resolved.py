"""ResolvedLM: what optimum-rbln resolves the LM config to, built from a preset or from a compiled rbln_config.json.

Two sources, one derivation. ``ResolvedLM.from_preset`` checks a preset's rbln_config against every rule of
optimum-rbln 0.12.0 that can be checked without the compiler (each failure names the preset file, key and fix);
``ResolvedLM.from_rbln_config`` reads back what a compile saved (each failure names the artifact file). Both hand
their values to ``_derive``, which applies the rules optimum-rbln applies after validation (the partition only
with flash attention, the KV block counts, the order it sorts graphs and buckets in), so a plan and the artifact
compiled from it resolve to equal values. The defaults both sources fill in are the ``default_*`` functions of
``lm.rules``; the preset's checks are ``lm.checks``, the reading of a compiled config is ``lm.saved``.

Plain Python (no torch): ``compile --dry-run`` and ``load-check --no-runtime`` build these.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.catalogue.devices import NpuSpec
from qwenvl_rbln.planning.catalogue.modelinfo import ModelGeometry
from qwenvl_rbln.planning.lm import checks as lm_checks
from qwenvl_rbln.planning.lm import saved as lm_saved
from qwenvl_rbln.planning.lm.rules import default_prefill_chunk, kv_block_counts


@dataclass(frozen=True)
class ResolvedLM:
    """What optimum-rbln will resolve the LM config to (the values it computes, not just what was typed)."""

    batch_size: int
    max_seq_len: int
    attn_impl: str
    kvcache_partition_len: int | None
    kvcache_block_size: int
    prefill_chunk_size: int
    kvcache_num_blocks: int  # 0 = automatic
    memory_budget: float | int | None  # fraction (0, 1] or bytes
    decoder_batch_sizes: list[int]  # descending, as optimum-rbln sorts them
    vit_buckets: list[int]  # ascending, as optimum-rbln's searchsorted uses them
    num_full_blocks: int
    num_min_blocks: int
    num_devices: int
    visual_num_devices: int
    quantization: dict[str, Any] | None = None  # RBLNQuantizationConfig as optimum-rbln resolves it; None: bf16
    use_attention_mask: bool = False
    use_position_ids: bool = False

    @property
    def graph_names(self) -> list[str]:
        return ["prefill"] + [f"decoder_batch_{b}" for b in self.decoder_batch_sizes]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "graph_names": self.graph_names}

    @classmethod
    def from_preset(
        cls,
        chk: lm_checks.Checker,
        rbln: dict[str, Any],
        visual: dict[str, Any],
        spec: NpuSpec,
        geometry: ModelGeometry,
        warnings: list[str],
    ) -> ResolvedLM:
        """A preset's rbln_config (keys already type-checked), validated in optimum-rbln's order; notes go to
        ``warnings``."""
        buckets, visual_num_devices = lm_checks.vit_buckets(chk, rbln, visual, warnings)
        batch, num_devices, max_seq_len = lm_checks.lm_sizes(chk, rbln, spec, geometry, visual_num_devices, warnings)
        lm_checks.lm_switches(chk, rbln)
        attn, partition, block = lm_checks.attention(chk, rbln, spec, max_seq_len)
        chunk = lm_checks.prefill_chunk(chk, rbln, spec)
        dbs = lm_checks.decoder_batch_sizes(chk, rbln, batch, warnings)
        num_blocks, budget = lm_checks.kv_blocks(chk, rbln, spec, (max_seq_len, block, batch, attn), warnings)
        quantization = lm_checks.quantization(chk, rbln.get("quantization"))
        lm_checks.moe_quantization(chk, quantization, geometry)
        return _derive(
            batch_size=batch,
            max_seq_len=max_seq_len,
            attn_impl=attn,
            partition=partition,
            block=block,
            chunk=chunk,
            num_blocks=num_blocks,
            memory_budget=budget,
            decoder_batch_sizes=dbs,
            vit_buckets=buckets,
            num_devices=num_devices,
            visual_num_devices=visual_num_devices,
            quantization=quantization,
            use_attention_mask=bool(rbln.get("use_attention_mask")),
            use_position_ids=bool(rbln.get("use_position_ids")),
        )

    @classmethod
    def from_rbln_config(cls, cfg: dict[str, Any], target: dict[str, Any], *, source: str) -> ResolvedLM:
        """A compiled rbln_config.json, so the memory planner runs without a preset. ``target`` is
        ``artifacts.layout.compile_target(cfg)`` (npu and num_devices as compiled); ``source`` names the file in
        errors."""
        batch = cfg.get("batch_size", 1)  # absent means optimum-rbln's default; 0 is not a batch
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise InputError(f"{source}: batch_size={batch!r} is not a positive integer", "recompile the artifact")
        max_seq_len = lm_saved.need(cfg, "max_seq_len", source)
        attn, partition, block = lm_saved.saved_attention(cfg, max_seq_len, source)
        chunk = cfg.get("prefill_chunk_size") or default_prefill_chunk(target["npu"] or "")
        num_blocks = cfg.get("kvcache_num_blocks") or 0
        if type(num_blocks) is not int or num_blocks < 0:
            raise InputError(f"{source}: kvcache_num_blocks={num_blocks!r} is not a count", "recompile the artifact")
        dbs = cfg.get("decoder_batch_sizes") or [batch]
        if not isinstance(dbs, list) or not all(type(b) is int and b > 0 for b in dbs):
            raise InputError(
                f"{source}: decoder_batch_sizes={dbs!r} is not a list of integers", "recompile the artifact"
            )
        return _derive(
            batch_size=batch,
            max_seq_len=max_seq_len,
            attn_impl=attn,
            partition=partition,
            block=block,
            chunk=chunk,
            num_blocks=num_blocks,
            memory_budget=None,  # never saved (subclass_non_save_attributes)
            decoder_batch_sizes=dbs,
            vit_buckets=lm_saved.saved_vit_buckets(cfg, source),
            num_devices=target["num_devices"],
            visual_num_devices=target["visual_num_devices"],
            quantization=lm_saved.saved_quantization(cfg, source),
            use_attention_mask=bool(cfg.get("use_attention_mask")),
            use_position_ids=bool(cfg.get("use_position_ids")),
        )


def _derive(
    *,
    batch_size: int,
    max_seq_len: int,
    attn_impl: str,
    partition: int | None,
    block: int,
    chunk: int,
    num_blocks: int,
    memory_budget: float | int | None,
    decoder_batch_sizes: list[int],
    vit_buckets: list[int],
    num_devices: int,
    visual_num_devices: int,
    quantization: dict[str, Any] | None,
    use_attention_mask: bool,
    use_position_ids: bool,
) -> ResolvedLM:
    """The values optimum-rbln computes from validated settings, whichever source they came from."""
    num_full, num_min = kv_block_counts(max_seq_len, block, batch_size, attn_impl)
    return ResolvedLM(
        batch_size=batch_size,
        max_seq_len=max_seq_len,
        attn_impl=attn_impl,
        kvcache_partition_len=partition if attn_impl == "flash_attn" else None,
        kvcache_block_size=block,
        prefill_chunk_size=chunk,
        kvcache_num_blocks=num_blocks,
        memory_budget=memory_budget,
        decoder_batch_sizes=sorted(decoder_batch_sizes, reverse=True),
        vit_buckets=sorted(vit_buckets),
        num_full_blocks=num_full,
        num_min_blocks=num_min,
        num_devices=num_devices,
        visual_num_devices=visual_num_devices,
        quantization=quantization,
        use_attention_mask=use_attention_mask,
        use_position_ids=use_position_ids,
    )
