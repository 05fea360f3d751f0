"""The steps of ``ResolvedLM.from_preset``: a preset's rbln_config checked against optimum-rbln 0.12.0's rules, in
its order (ViT buckets, LM sizes and switches, attention, prefill chunk, decoder graphs, KV blocks, quantization,
memory budget); each failure names the preset file, key and fix through the plan's checker.

Its own module: these are the rules a preset is validated by, apart from the derivation they feed
(``lm.resolved``) and from the reading of a compiled config (``lm.saved``).
"""

from __future__ import annotations

from typing import Any, Protocol

from qwenvl_rbln.planning.catalogue.devices import (
    OPTIMUM_SIZE_SPELLINGS,
    GiB,
    NpuSpec,
    optimum_size_text,
    parse_optimum_byte_size,
)
from qwenvl_rbln.planning.catalogue.modelinfo import ModelGeometry
from qwenvl_rbln.planning.catalogue.params import (
    QUANT_WEIGHT_BYTES,
    RBLN_DTYPE_BYTES,
    lm_params,
    quantized_lm_weight_bytes,
)
from qwenvl_rbln.planning.lm.rules import (
    ATTENTION_LIMITS,
    MIN_FLASH_MAX_SEQ_LEN,
    QUANT_KEYS,
    QUANT_SUPPORTED,
    default_attn_impl,
    default_block_size,
    default_prefill_chunk,
    kv_block_counts,
    quant_with_defaults,
)


class Checker(Protocol):
    """What ``from_preset`` needs of plan's checker: fail naming the preset file that gave the key."""

    def fail(self, key: str, message: str, hint: str) -> None: ...

    def int_(self, key: str, value: Any, *, minimum: int | None = None, allowed: str = "") -> int: ...


def vit_buckets(
    chk: Checker, rbln: dict[str, Any], visual: dict[str, Any], warnings: list[str]
) -> tuple[list[int], int]:
    """visual.max_seq_len (the ViT buckets), visual.batch_size and the ViT's num_devices."""
    key = "rbln_config.visual.max_seq_len"
    buckets = visual.get("max_seq_len")
    if buckets is None:
        chk.fail(key, "'max_seq_len' must be specified for visual", "e.g. 16384 or [1024, 3136, 16384]")
    bucket_list = buckets if isinstance(buckets, list) else [buckets]
    if not bucket_list:
        chk.fail(key, "visual.max_seq_len is an empty list", "give at least one bucket")
    for b in bucket_list:
        chk.int_(key, b, minimum=4, allowed=" (ViT patches per image)")
        if b % 4:
            chk.fail(
                key,
                f"visual.max_seq_len bucket {b} is not a multiple of 4 (spatial_merge_size**2)",
                f"use {b - b % 4} or {b - b % 4 + 4}",
            )
    if len(set(bucket_list)) != len(bucket_list):
        chk.fail(key, f"visual.max_seq_len={bucket_list} has duplicates", "list each bucket once")
    small = [b for b in bucket_list if b < 256]
    if small:
        warnings.append(
            f"visual.max_seq_len buckets {small} are below 256 patches, the smallest image the processor makes"
        )
    vbatch = visual.get("batch_size", 1)
    if vbatch != 1:
        chk.fail(
            "rbln_config.visual.batch_size",
            f"visual.batch_size={vbatch!r}: the Qwen3-VL vision encoder only supports batch_size=1",
            "remove visual.batch_size",
        )
    visual_num_devices = chk.int_(
        "rbln_config.visual.num_devices", visual.get("num_devices", rbln.get("num_devices", 1)), minimum=1
    )
    return bucket_list, visual_num_devices


def lm_sizes(
    chk: Checker,
    rbln: dict[str, Any],
    spec: NpuSpec,
    geometry: ModelGeometry,
    visual_num_devices: int,
    warnings: list[str],
) -> tuple[int, int, int]:
    """batch_size, num_devices and max_seq_len (the model's max_position_embeddings when unset, never above)."""
    batch = chk.int_("rbln_config.batch_size", rbln.get("batch_size", 1), minimum=1)
    num_devices = chk.int_("rbln_config.num_devices", rbln.get("num_devices", 1), minimum=1)
    if spec.family == "REBEL" and (num_devices > 1 or visual_num_devices > 1):
        warnings.append(
            "num_devices > 1 on a REBEL NPU: optimum-rbln 0.12 accepts it, but its v0.12 support matrix lists RSD "
            "(one submodule over several NPUs) as not supported on Rebel100 and its Rebel100 Qwen3-VL tutorial uses "
            "num_devices 1 for both submodules (docs.rbln.ai/v0.12.0/supports/version_matrix.html); whether the "
            "compiler accepts it is unverified"
        )
    max_pos = geometry.text.max_position_embeddings
    max_seq_len = rbln.get("max_seq_len")
    if max_seq_len is None:
        max_seq_len = max_pos
        warnings.append(f"rbln_config.max_seq_len not set: optimum-rbln uses max_position_embeddings ({max_pos})")
    chk.int_("rbln_config.max_seq_len", max_seq_len, minimum=1)
    if max_seq_len > max_pos:
        chk.fail(
            "rbln_config.max_seq_len",
            f"max_seq_len={max_seq_len} exceeds the model's max_position_embeddings ({max_pos})",
            f"use max_seq_len <= {max_pos}",
        )
    return batch, num_devices, max_seq_len


def lm_switches(chk: Checker, rbln: dict[str, Any]) -> None:
    """Settings Qwen3-VL allows one value of (or one combination): inputs embeds, position ids, logits,
    cache_impl, phases."""
    if rbln.get("use_inputs_embeds") is False:
        chk.fail(
            "rbln_config.use_inputs_embeds",
            "RBLNQwen3VLForConditionalGenerationConfig requires use_inputs_embeds=True",
            "remove use_inputs_embeds",
        )
    if rbln.get("use_position_ids") and not rbln.get("use_attention_mask"):
        chk.fail(
            "rbln_config.use_position_ids",
            "Position IDs should be used with attention mask",
            "also set use_attention_mask: true",
        )
    if rbln.get("logits_to_keep", 1) not in (None, 0, 1):
        chk.fail(
            "rbln_config.logits_to_keep",
            f"logits_to_keep={rbln['logits_to_keep']} > 1 is not supported by RBLN models",
            "remove it",
        )
    cache_impl = rbln.get("cache_impl", "static")
    if cache_impl != "static":
        chk.fail(
            "rbln_config.cache_impl",
            f"cache_impl={cache_impl!r}: Qwen3-VL text has no sliding window",
            "use cache_impl: static",
        )
    phases = rbln.get("phases")
    if phases is not None:
        bad = [p for p in phases if p not in ("prefill", "decode")]
        if bad:
            chk.fail(
                "rbln_config.phases",
                f"phases={phases} contains {bad} (Qwen3-VL uses prefill and decode)",
                "remove phases",
            )


def attention(chk: Checker, rbln: dict[str, Any], spec: NpuSpec, max_seq_len: int) -> tuple[str, Any, Any]:
    """(attn_impl, kvcache_partition_len, kvcache_block_size) as optimum-rbln's validate_attention_method
    resolves and checks them."""
    partition = rbln.get("kvcache_partition_len")
    attn = rbln.get("attn_impl")
    if attn is None:
        attn = default_attn_impl(partition)
    if attn not in ("eager", "flash_attn"):
        chk.fail(
            "rbln_config.attn_impl", f"Unknown attn_impl: {attn!r} (Available: 'eager', 'flash_attn')", "use flash_attn"
        )
    limits = ATTENTION_LIMITS[spec.family]
    if attn == "flash_attn":
        if partition is None:
            partition = limits["default_partition"]
        _flash_limits(chk, spec.family, limits, partition, max_seq_len)
    else:
        _eager_limits(chk, spec.family, limits, partition, max_seq_len)
    block = rbln.get("kvcache_block_size", default_block_size(attn, partition, max_seq_len))
    if block != default_block_size(attn, partition, max_seq_len):
        if attn == "flash_attn":
            message = f"kvcache_block_size={block} must equal kvcache_partition_len ({partition}) with flash attention"
        else:
            message = f"kvcache_block_size={block} must equal max_seq_len ({max_seq_len}) with eager attention"
        chk.fail("rbln_config.kvcache_block_size", message, "remove kvcache_block_size")
    return attn, partition, block


def _flash_limits(chk: Checker, fam: str, limits: dict[str, int], partition: Any, max_seq_len: int) -> None:
    """Flash attention: the partition in the family's range, max_seq_len a multiple of it, at least twice."""
    chk.int_("rbln_config.kvcache_partition_len", partition)
    lo, hi = limits["partition_min"], limits["partition_max"]
    if not lo <= partition <= hi:
        chk.fail(
            "rbln_config.kvcache_partition_len",
            f"kvcache_partition_len={partition} is out of the {fam} supported range for flash_attn ({lo} <= P <= {hi})",
            f"use a partition between {lo} and {hi}, e.g. {limits['default_partition']}",
        )
    if max_seq_len < MIN_FLASH_MAX_SEQ_LEN:
        chk.fail(
            "rbln_config.max_seq_len",
            f"max_seq_len={max_seq_len} is too small for flash_attn (minimum {MIN_FLASH_MAX_SEQ_LEN})",
            f"use max_seq_len >= {MIN_FLASH_MAX_SEQ_LEN}",
        )
    if max_seq_len % partition or max_seq_len // partition < 2:
        fix = max(2, round(max_seq_len / partition)) * partition
        chk.fail(
            "rbln_config.max_seq_len",
            f"max_seq_len={max_seq_len} must be a multiple of kvcache_partition_len ({partition}) and at least 2x it",
            f"use max_seq_len={fix}",
        )


def _eager_limits(chk: Checker, fam: str, limits: dict[str, int], partition: Any, max_seq_len: int) -> None:
    """Eager attention: no partition, max_seq_len within the family's eager limit."""
    if partition is not None:
        chk.fail(
            "rbln_config.kvcache_partition_len",
            "kvcache_partition_len is only used with flash_attn",
            "remove it or use flash_attn",
        )
    if max_seq_len > limits["max_eager"]:
        chk.fail(
            "rbln_config.max_seq_len",
            f"max_seq_len={max_seq_len} exceeds the {fam} limit of {limits['max_eager']} for eager attention",
            f"reduce max_seq_len to {limits['max_eager']} or set kvcache_partition_len (flash_attn)",
        )


def prefill_chunk(chk: Checker, rbln: dict[str, Any], spec: NpuSpec) -> int:
    """prefill_chunk_size: at least 64 and a multiple of 64."""
    chunk = rbln.get("prefill_chunk_size", default_prefill_chunk(spec.sku))
    chk.int_("rbln_config.prefill_chunk_size", chunk, minimum=64)
    if chunk % 64:
        chk.fail(
            "rbln_config.prefill_chunk_size",
            f"prefill_chunk_size={chunk} must be divisible by 64",
            f"use {chunk - chunk % 64 or 64}",
        )
    return chunk


def decoder_batch_sizes(chk: Checker, rbln: dict[str, Any], batch: int, warnings: list[str]) -> list[int]:
    """decoder_batch_sizes (one decoder graph each), with the batch size appended when optimum-rbln appends it;
    unsorted (``_derive`` sorts)."""
    dbs = rbln.get("decoder_batch_sizes")
    if dbs is None:
        return [batch]
    key = "rbln_config.decoder_batch_sizes"
    if not dbs:
        chk.fail(key, "decoder_batch_sizes is empty", f"remove it, or include the batch size {batch}")
    for b in dbs:
        chk.int_(key, b, minimum=1)
    if len(set(dbs)) != len(dbs):
        chk.fail(
            key,
            f"decoder_batch_sizes={dbs} has duplicates (they would compile duplicate graph names)",
            "list each size once",
        )
    if max(dbs) > batch:
        chk.fail(
            key,
            f"decoder batch size {max(dbs)} must be <= batch_size ({batch}); decoder_batch_sizes={dbs}",
            f"drop entries above {batch} or raise batch_size",
        )
    if len(dbs) == 1 and dbs[0] != batch:
        chk.fail(
            key,
            f"decoder_batch_sizes={dbs} has a single entry different from batch_size ({batch}); "
            "load would fail with KeyError",
            f"use decoder_batch_sizes: [{batch}] or [{dbs[0]}, {batch}]",
        )
    if max(dbs) < batch:
        warnings.append(
            f"Maximum decoder batch size ({max(dbs)}) is less than the model's batch size ({batch}); "
            f"optimum-rbln appends {batch}"
        )
        dbs = [*dbs, batch]
    return dbs


def kv_blocks(
    chk: Checker,
    rbln: dict[str, Any],
    spec: NpuSpec,
    shape: tuple[int, Any, int, str],
    warnings: list[str],
) -> tuple[int, float | int | None]:
    """kvcache_num_blocks (0: automatic) against optimum-rbln's minimum, and memory_budget; ``shape`` is
    (max_seq_len, block, batch, attn_impl)."""
    max_seq_len, block, batch, attn = shape
    num_full, num_min = kv_block_counts(max_seq_len, block, batch, attn)
    num_blocks = rbln.get("kvcache_num_blocks") or 0
    chk.int_("rbln_config.kvcache_num_blocks", num_blocks, minimum=0)
    budget = rbln.get("memory_budget")
    if budget is not None and num_blocks:
        chk.fail(
            "rbln_config.memory_budget",
            "memory_budget and an explicit kvcache_num_blocks are mutually exclusive",
            "keep one of them",
        )
    if num_blocks and attn != "flash_attn" and num_blocks < num_min:
        chk.fail(
            "rbln_config.kvcache_num_blocks",
            f"kvcache_num_blocks={num_blocks} is below one block per sequence (eager attention: a block holds a "
            f"whole max_seq_len sequence, and optimum-rbln's num_min_blocks is batch_size {batch}); optimum-rbln "
            "0.12 compiles such an eager pool without checking it, but a full batch then waits for blocks, and "
            "with 1 block vLLM keeps it as its null block and has none left (qvl serve refuses that artifact)",
            f"use kvcache_num_blocks >= {num_min} or leave it automatic",
        )
    if num_blocks and attn == "flash_attn":
        if num_blocks < num_min:
            chk.fail(
                "rbln_config.kvcache_num_blocks",
                f"kvcache_num_blocks={num_blocks} is less than the minimum number of blocks ({num_min})",
                f"use kvcache_num_blocks >= {num_min} or leave it automatic",
            )
        if num_blocks > num_full:
            warnings.append(
                f"kvcache_num_blocks ({num_blocks}) is greater than the required number of blocks ({num_full}); "
                "this can cause a failure during model compilation"
            )
    budget_value = _memory_budget(chk, budget, spec)
    if budget_value is not None and attn != "flash_attn":
        warnings.append("memory_budget only applies to flash attention; it is ignored with eager")
    return num_blocks, budget_value


def quantization(chk: Checker, quant: Any) -> dict[str, Any] | None:
    """RBLNQuantizationConfig(**quantization) as optimum-rbln 0.12 runs it at config time (same rules, same
    order), plus the compile-time refusal of fp16 weights in QuantizedLayerFactory.create_linear. None: no
    quantization (an empty mapping is what optimum-rbln treats as none, too)."""
    key = "rbln_config.quantization"
    if not quant:
        return None
    spell = "; ".join(f"{k}: {' | '.join(v)}" for k, v in QUANT_SUPPORTED.items())
    for name in quant:
        if name not in QUANT_KEYS:
            chk.fail(
                f"{key}.{name}",
                f"{key}.{name} is not a quantization setting (RBLNQuantizationConfig refuses it)",
                f"use only {', '.join(QUANT_KEYS[:5])} ({spell}; dynamic: true | false)",
            )
    weights, activations = _quant_precision(chk, quant)
    resolved = quant_with_defaults(
        {
            "format": quant.get("format"),
            "weights": weights,
            "activations": activations,
            "kv_caches": quant.get("kv_caches"),
        }
    )
    for name, value in resolved.items():
        if value not in QUANT_SUPPORTED[name]:
            chk.fail(
                f"{key}.{name}",
                f"{key}.{name}={value!r}: invalid {name}, supported are {', '.join(QUANT_SUPPORTED[name])}",
                f"set {key}.{name} to one of {', '.join(QUANT_SUPPORTED[name])}",
            )
    dynamic = quant.get("dynamic")
    if dynamic is not None and not isinstance(dynamic, bool):
        chk.fail(f"{key}.dynamic", f"{key}.dynamic={dynamic!r} must be true or false", "set dynamic: true or false")
    _refuse_fp16_weights(chk, quant, resolved)
    return {**resolved, "dynamic": bool(dynamic)}


def moe_quantization(chk: Checker, quant: dict[str, Any] | None, geometry: ModelGeometry) -> None:
    """Refuse a quantized Qwen3-VL-MoE before anything compiles: optimum-rbln 0.12 cannot load it, and if it
    could, the float32 load would grow the LM weights, not shrink them (the experts are never quantized)."""
    t = geometry.text
    if not quant or t.moe is None:
        return
    bf16 = lm_params(t)["device"] * RBLN_DTYPE_BYTES
    fp32 = quantized_lm_weight_bytes(t, QUANT_WEIGHT_BYTES[quant["weights"]])
    chk.fail(
        "rbln_config.quantization",
        f"rbln_config.quantization (weights={quant['weights']}) on {geometry.name}, a Qwen3-VL-MoE: optimum-rbln "
        "0.12 cannot compile it. (1) get_quantized_model copies the checkpoint's fused experts as they are, "
        "without the transpose transformers applies when it loads them (Qwen's checkpoints store gate_up_proj "
        "[E, H, 2I] and down_proj [E, I, H], the model wants [E, 2I, H] and [E, H, I]), so the load stops with a "
        "size mismatch. (2) It loads the model in float32 and never quantizes the experts, so the LM weights would "
        f"grow from {bf16 / GiB:.2f} GiB in bf16 to {fp32 / GiB:.2f} GiB",
        "remove the quantization (--set quantization=null) and compile the bf16 weights",
    )


def _quant_precision(chk: Checker, quant: dict[str, Any]) -> tuple[Any, Any]:
    """(weights, activations), with the deprecated ``precision: w4a16`` spelled out (never beside them)."""
    key = "rbln_config.quantization"
    weights, activations = quant.get("weights"), quant.get("activations")
    precision = quant.get("precision")
    if precision is None:
        return weights, activations
    if weights is not None or activations is not None:
        chk.fail(
            f"{key}.precision",
            "quantization.precision and weights or activations cannot be set at the same time",
            "drop precision (deprecated) and keep weights/activations",
        )
    if precision != "w4a16":
        chk.fail(
            f"{key}.precision",
            f"{key}.precision={precision!r} is not a precision optimum-rbln knows (only 'w4a16', deprecated)",
            "write weights: int4 and activations: fp16 instead",
        )
    return "int4", "fp16"


def _refuse_fp16_weights(chk: Checker, quant: dict[str, Any], resolved: dict[str, Any]) -> None:
    """fp16 weights: with fp16 activations RBLNQuantizationConfig refuses it; otherwise the compile does."""
    key = "rbln_config.quantization"
    if resolved["weights"] == "fp16" and resolved["activations"] == "fp16":
        chk.fail(
            key,
            f"{key}={quant!r}: weights and activations of QuantizationConfig cannot be both fp16 (optimum-rbln: "
            "'It is meaningless')",
            "set weights to int4, int8 or fp8 (e.g. {weights: int8, kv_caches: fp8}), or remove quantization",
        )
    if resolved["weights"] == "fp16":
        chk.fail(
            f"{key}.weights",
            f"{key}.weights=fp16 with activations={resolved['activations']}: optimum-rbln's compile replaces every "
            "q/k/v/o/gate/up/down projection with a quantized linear and stops with 'Invalid quantization weights: "
            "fp16'",
            "set weights to int4, int8 or fp8",
        )


def _memory_budget(chk: Checker, budget: Any, spec: NpuSpec) -> float | int | None:
    """optimum-rbln 0.12 _resolve_memory_budget: a float fraction in (0, 1], an 'N%' string, or bytes through its
    parse_byte_size (an int, or a whole number with B/KB/MB/GB/TB, binary). Anything else is refused here, before
    the compile: optimum-rbln reads it only after every LM graph has compiled. The budget is per device (it is
    resolved against one device's DRAM even with num_devices > 1)."""
    key = "rbln_config.memory_budget"
    accepted = f"a fraction such as 0.8, a percent such as '80%', or {OPTIMUM_SIZE_SPELLINGS}"
    if budget is None:
        return None
    if isinstance(budget, bool):
        chk.fail(key, f"memory_budget={budget!r} is not a fraction or size", f"write {accepted}")
    if isinstance(budget, str) and budget.strip().endswith("%"):
        try:
            budget = float(budget.strip()[:-1]) / 100
        except ValueError:
            chk.fail(key, f"memory_budget={budget!r} is not a percentage", f"write {accepted}")
    if isinstance(budget, float):
        if not 0 < budget <= 1:
            chk.fail(
                key, f"memory_budget fraction must be in (0, 1] (or (0%, 100%]), got {budget}", f"write {accepted}"
            )
        return budget
    nbytes = parse_optimum_byte_size(budget)
    if nbytes is None:
        chk.fail(
            key,
            f"memory_budget={budget!r} is not a size optimum-rbln's parse_byte_size reads (it would stop after every "
            "LM graph compiled)",
            f"write {accepted}",
        )
    if nbytes < 1 << 20:  # `memory_budget: 1` means 1 byte to optimum-rbln: never what was meant
        if nbytes == 1:
            meant = "write 1.0 for all of it, a fraction such as 0.8, or a size such as '100GB'"
        elif nbytes <= 100:
            meant = f"write '{nbytes}%' (or {nbytes / 100:g}) for a share, or a size such as '100GB'"
        else:
            meant = "write a size with its unit, such as '100GB' (binary), or a fraction such as 0.8"
        what = f"memory_budget={budget!r} is {nbytes} byte(s): optimum-rbln reads a whole number as bytes"
        chk.fail(key, what, meant)
    if nbytes > spec.usable_bytes:
        chk.fail(
            key,
            f"memory_budget ({nbytes} bytes) exceeds the target NPU's available DRAM ({spec.usable_bytes} bytes, "
            "per device)",
            f"use at most '{optimum_size_text(spec.usable_bytes)}', or a fraction such as 0.9",
        )
    return nbytes
