"""Preset -> Plan: the exact optimum-rbln rbln_config dicts, validated before anything slow runs.

Every rule of optimum-rbln 0.12.0 that can be checked without the compiler is checked here, with
the key, the value and the allowed range in the message, plus the cases optimum-rbln misses
(single ``decoder_batch_sizes`` entry != batch_size, duplicates, ViT buckets not a multiple of 4,
``max_seq_len`` above the model's ``max_position_embeddings``, negative device ids).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.devices import OPTIMUM_SIZE_SPELLINGS, NpuSpec, npu_spec, optimum_size_text, parse_optimum_byte_size
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.modelinfo import ModelGeometry, load_geometry, processor_defaults
from qwenvl_rbln.presets import LoadedPreset, closest, load_preset

# optimum-rbln 0.12 modeling_attention_utils.AttentionLimits
ATTENTION_LIMITS = {
    "REBEL": {"max_eager": 16384, "partition_min": 1024, "partition_max": 16384, "default_partition": 8192},
    "ATOM": {"max_eager": 32768, "partition_min": 1024, "partition_max": 32768, "default_partition": 16384},
}
MIN_FLASH_MAX_SEQ_LEN = 2048

# Keys optimum-rbln accepts (RBLNModelConfig + RBLNDecoderOnlyModelConfig + Qwen3-VL), by level.
BASE_KEYS = {
    "create_runtimes": bool,
    "device": "placement",
    "device_map": "device_map",
    "activate_profiler": bool,
    "npu": str,
    "num_devices": int,
    "timeout": int,
    "dtype": str,
    "optimize_host_memory": bool,
}
LM_KEYS = {
    **BASE_KEYS,
    "batch_size": int,
    "max_seq_len": int,
    "use_inputs_embeds": bool,
    "use_attention_mask": bool,
    "use_position_ids": bool,
    "attn_impl": str,
    "kvcache_partition_len": int,
    "kvcache_block_size": int,
    "prefill_chunk_size": int,
    "kvcache_num_blocks": int,
    "memory_budget": "budget",
    "decoder_batch_sizes": list,
    "quantization": dict,
    "lora_config": dict,
    "cache_impl": str,
    "sliding_window": int,
    "sliding_window_layers": list,
    "phases": list,
    "logits_to_keep": int,
    "output_hidden_states": bool,
    "visual": dict,
    "_load_visual_runtime": bool,
}
VISUAL_KEYS = {**BASE_KEYS, "max_seq_len": "buckets", "batch_size": int}
RUNTIME_ONLY_KEYS = ("create_runtimes", "device", "device_map", "activate_profiler", "timeout")

# Keys optimum-rbln 0.12 accepts in rbln_config but fills in itself (rbln_config.json): not settings.
WRITTEN_BY_OPTIMUM = {
    "optimum_rbln_version": "records the installed optimum-rbln version in rbln_config.json",
    "cls_name": "records the model class in rbln_config.json",
    "_compile_cfgs": "fills in the compiled graphs' shapes at compile time",
    "cache_metas": "computes the per-layer KV cache metadata at compile time",
    "kvcache_metas": "computes the per-layer KV cache metadata at compile time (kvcache_metas is the deprecated "
    "name of cache_metas)",
    "_requires_batch_sort": "resolves it at compile time from npu, attn_impl and use_attention_mask",
}
VISUAL_WRITTEN_BY_OPTIMUM = ("optimum_rbln_version", "cls_name", "_compile_cfgs")


@dataclass(frozen=True)
class ProcessorCaps:
    """Pixel caps handed to the Qwen3-VL processor (images per image, videos over all frames)."""

    min_pixels: int
    max_pixels: int
    video_min_pixels: int
    video_max_pixels: int
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


@dataclass
class Plan:
    preset: str
    preset_path: str
    preset_hash: str
    preset_chain: list[str]
    description: str
    backend: str
    model_id: str
    npu: str
    npu_spec: NpuSpec
    geometry: ModelGeometry
    rbln_config: dict[str, Any]
    load_rbln_config: dict[str, Any]
    placement: dict[str, Any]
    processor: ProcessorCaps
    resolved: ResolvedLM
    output_dir: str
    warnings: list[str] = field(default_factory=list)
    runtime: dict[str, Any] = field(default_factory=lambda: {"vit_packing": True})  # runtime: section

    @property
    def vit_buckets(self) -> list[int]:
        return self.resolved.vit_buckets

    @property
    def lm_device(self) -> int | list[int]:
        return self.placement["device"]

    @property
    def visual_device(self) -> int | list[int]:
        return self.placement["visual_device"]

    def cache_config(self) -> dict[str, Any]:
        """The compile rbln_config without runtime-only keys (what decides the compiled bytes)."""
        return strip_runtime_keys(self.rbln_config)

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "preset_path": self.preset_path,
            "preset_hash": self.preset_hash,
            "preset_chain": self.preset_chain,
            "description": self.description,
            "backend": self.backend,
            "model_id": self.model_id,
            "npu": self.npu,
            "device_spec": self.npu_spec.to_dict(),
            "model_geometry": self.geometry.to_dict(),
            "rbln_config": self.rbln_config,
            "load_rbln_config": self.load_rbln_config,
            "placement": self.placement,
            "processor": self.processor.to_dict(),
            "resolved": self.resolved.to_dict(),
            "output_dir": self.output_dir,
            "runtime": self.runtime,
            "warnings": self.warnings,
        }


def kv_block_counts(max_seq_len: int, block: int, batch_size: int, attn_impl: str) -> tuple[int, int]:
    """(num_full_blocks, num_min_blocks) exactly as optimum-rbln's RBLNDecoderOnlyModelConfig computes them."""
    full = (max_seq_len // block) * batch_size
    if attn_impl == "flash_attn":
        return full, min(max(max_seq_len // block, batch_size) + 1, full)
    return full, batch_size


def strip_runtime_keys(cfg: dict[str, Any]) -> dict[str, Any]:
    out = {k: copy.deepcopy(v) for k, v in cfg.items() if k not in RUNTIME_ONLY_KEYS}
    if isinstance(out.get("visual"), dict):
        out["visual"] = strip_runtime_keys(out["visual"])
    return out


class _Checker:
    """Raises InputError naming the preset file that gave the key."""

    def __init__(self, loaded: LoadedPreset):
        self.loaded = loaded

    def fail(self, key: str, message: str, hint: str) -> None:
        raise InputError(f"{self.origin(key, message)}: {message}", hint)

    def origin(self, key: str, message: str) -> str:
        """Where the problem comes from: the latest of the key's source and the sources of the other keys the
        message names, ``--set`` first, then the preset given (``--set kvcache_partition_len=3000`` breaks the
        base file's max_seq_len: that is --set's problem, not the base file's)."""
        import re

        from qwenvl_rbln.presets import display_path

        own = self.loaded.source_of(key)
        named = {own}
        for dotted, source in self.loaded.sources.items():
            name = dotted.removeprefix("rbln_config.")
            if re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message):
                named.add(source)
        for source in ("--set", display_path(self.loaded.path)):
            if source in named:
                return source
        return own

    def int_(self, key: str, value: Any, *, minimum: int | None = None, allowed: str = "") -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"{key}={value!r} must be an integer{allowed}", f"set {key} to an integer{allowed}")
        if minimum is not None and value < minimum:
            self.fail(key, f"{key}={value} is below the minimum {minimum}{allowed}", f"use {key} >= {minimum}")
        return value

    def bool_(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            self.fail(key, f"{key}={value!r} must be true or false", f"set {key}: true or {key}: false")
        return value

    def device(self, key: str, value: Any) -> int | list[int]:
        ok = (isinstance(value, int) and not isinstance(value, bool) and value >= 0) or (
            isinstance(value, list)
            and value
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        )
        if not ok:
            self.fail(
                key,
                f"{key}={value!r} is not a device id (non-negative integer or a list of them)",
                f"e.g. {key}: 0 (see `rbln-smi` for the ids on this host)",
            )
        if isinstance(value, list) and len(set(value)) != len(value):
            self.fail(key, f"{key}={value!r} repeats a device id", "list each NPU once")
        return value

    def keys(self, prefix: str, data: dict[str, Any], schema: dict[str, Any]) -> None:
        for key, value in data.items():
            dotted = f"{prefix}{key}"
            if key not in schema:
                self.unknown(prefix, str(key), schema)
            kind = schema[key]
            if value is None:
                continue
            if kind in ("placement", "device_map"):
                self.placement_key(dotted, value)
            if kind is int:
                self.int_(dotted, value)
            elif kind is bool:
                self.bool_(dotted, value)
            elif kind is str and not isinstance(value, str):
                self.fail(dotted, f"{dotted}={value!r} must be a string", f"quote the value of {dotted}")
            elif kind is dict and not isinstance(value, dict):
                self.fail(dotted, f"{dotted}={value!r} must be a mapping", f"write {dotted} as key: value pairs")
            elif kind is list and not isinstance(value, list):
                self.fail(dotted, f"{dotted}={value!r} must be a list", f"write {dotted} as [a, b, ...]")

    def unknown(self, prefix: str, key: str, schema: dict[str, Any]) -> None:
        """A key optimum-rbln fills in itself, or one it refuses: say which, and the closest valid key."""
        dotted = f"{prefix}{key}"
        written = WRITTEN_BY_OPTIMUM if prefix == "rbln_config." else VISUAL_WRITTEN_BY_OPTIMUM
        if key in written:
            self.fail(
                dotted,
                f"rbln_config key '{dotted}' is not a setting: optimum-rbln {WRITTEN_BY_OPTIMUM[key]}",
                f"remove {dotted} from the preset; optimum-rbln writes it into the compiled rbln_config.json",
            )
        near = closest(key, list(schema))
        valid = ", ".join(k for k in schema if k != "device")
        hint = f"did you mean '{prefix}{near}'?" if near else f"valid keys under {prefix.rstrip('.')}: {valid}"
        self.fail(dotted, f"unknown rbln_config key '{dotted}' (optimum-rbln 0.12 refuses it)", hint)

    def placement_key(self, dotted: str, value: Any = None) -> None:
        """``device`` / ``device_map`` are load-time choices: qvl keeps them in ``placement:``, where the planner
        and load see them (a per-graph device_map would put graphs where the memory planner does not look)."""
        target = "placement.visual_device" if ".visual." in dotted else "placement.device"
        self.fail(
            dotted,
            f"{dotted}={value!r} is not read from rbln_config: qvl takes device ids from the preset's placement "
            "section (placement.device for the LM graphs, placement.visual_device for the ViT)",
            f"remove {dotted} and set {target} instead (e.g. --set {target}=1)",
        )


def _runtime(chk: _Checker, data: dict[str, Any]) -> dict[str, Any]:
    """The runtime: section: choices that need no recompile (ViT packing; vLLM's items per prompt for qvl serve)."""
    runtime: dict[str, Any] = {"vit_packing": chk.bool_("runtime.vit_packing", data.get("vit_packing", True))}
    limits = data.get("limit_mm_per_prompt")
    if limits is None:
        return runtime
    key = "runtime.limit_mm_per_prompt"
    example = "e.g. runtime: {limit_mm_per_prompt: {image: 4, video: 1}}"
    if not isinstance(limits, dict) or not limits:
        chk.fail(key, f"{key}={limits!r} must be a mapping of image/video to a count", example)
    for name, count in limits.items():
        if name not in ("image", "video"):
            chk.fail(key, f"{key}.{name} is not a modality vLLM limits here (image, video)", example)
        chk.int_(f"{key}.{name}", count, minimum=0)
    runtime["limit_mm_per_prompt"] = dict(limits)
    return runtime


def build_plan(
    preset: str,
    sets: list[str] | None = None,
    *,
    model: str | None = None,
    output_dir: str | None = None,
) -> Plan:
    """Load, merge, validate and resolve a preset into a Plan."""
    loaded = load_preset(preset, sets)
    return plan_from_loaded(loaded, model=model, output_dir=output_dir)


def plan_from_loaded(loaded: LoadedPreset, *, model: str | None = None, output_dir: str | None = None) -> Plan:
    chk = _Checker(loaded)
    data = loaded.data
    warnings = list(loaded.warnings)

    description = data.get("description") or ""
    if not isinstance(description, str):
        chk.fail("description", f"description={description!r} must be a string", "write one line of text")
    backend = data.get("backend", "rbln")
    if backend not in ("rbln", "torch"):
        chk.fail("backend", f"backend={backend!r} is not one of rbln, torch", "set backend: rbln or backend: torch")
    if model is not None and not model.strip():
        raise InputError(
            f"--model {model!r} is empty", "pass a hub id or a local model directory, or leave --model out"
        )
    model_id = model if model is not None else data.get("model")
    if not isinstance(model_id, str) or not model_id.strip():
        chk.fail("model", f"model={model_id!r} must name a hub id or a local directory", "set model: or pass --model")

    rbln = data.get("rbln_config")
    if not isinstance(rbln, dict):
        chk.fail("rbln_config", f"rbln_config={rbln!r} must be a mapping", "add an rbln_config: section")
    rbln = copy.deepcopy(rbln)
    chk.keys("rbln_config.", rbln, LM_KEYS)
    visual = rbln.get("visual")
    if not isinstance(visual, dict):
        chk.fail("rbln_config.visual", "rbln_config.visual is missing", "add visual: {max_seq_len: 16384, ...}")
    chk.keys("rbln_config.visual.", visual, VISUAL_KEYS)

    # Target NPU: the preset's `npu`, or rbln_config.npu; both must agree.
    npu = data.get("npu") or rbln.get("npu")
    if rbln.get("npu") and data.get("npu") and rbln["npu"] != data["npu"]:
        chk.fail(
            "rbln_config.npu", f"npu={data['npu']!r} but rbln_config.npu={rbln['npu']!r}", "set the target NPU once"
        )
    if visual.get("npu") and npu and visual["npu"] != npu:
        chk.fail(
            "rbln_config.visual.npu",
            f"rbln_config.visual.npu={visual['npu']!r} but the target npu is {npu!r}; the ViT and the LM compile "
            "for one NPU",
            f"remove rbln_config.visual.npu (the ViT inherits npu {npu!r})",
        )
    if not npu:
        chk.fail("npu", "no target npu", "set npu: RBLN-CR13 (without it optimum-rbln falls back to ATOM limits)")
    try:
        spec = npu_spec(npu)
    except InputError as exc:
        chk.fail("npu", exc.message, exc.hint or "")
    limits = ATTENTION_LIMITS[spec.family]
    if spec.family == "REBEL" and npu not in ("RBLN-CR13",):
        warnings.append(f"npu {npu} is not Rebel100 (RBLN-CR13); limits follow optimum-rbln's RBLN-CR rules")

    try:
        geometry, geo_warnings = load_geometry(model_id, "--model" if model is not None else "model")
    except InputError as exc:
        if model is not None:
            raise
        chk.fail("model", exc.message, exc.hint or "")
    warnings.extend(geo_warnings)

    resolved = _resolve_lm(chk, rbln, visual, spec, limits, geometry, warnings)

    # Compile dict: the preset's rbln_config, exactly, plus the target NPU at the top level.
    compile_cfg = copy.deepcopy(rbln)
    compile_cfg["npu"] = npu

    placement = _placement(chk, data.get("placement") or {}, resolved, warnings)
    load_cfg: dict[str, Any] = {"visual": {"device": placement["visual_device"]}, "device": placement["device"]}

    processor = _processor(chk, data.get("processor") or {}, model_id, resolved, warnings)
    runtime = _runtime(chk, data.get("runtime") or {})

    out = output_dir or data.get("output_dir") or f"qvl-out/{Path(loaded.name).stem}"
    if not isinstance(out, str) or not out.strip() or "\x00" in out:
        chk.fail("output_dir", f"output_dir={out!r} must be a path", "e.g. output_dir: qvl-out/my-preset")
    if not output_dir and data.get("output_dir") and loaded.source_of("output_dir") != "--set":
        # A preset file is data someone else may have written: it may only name a directory below the working
        # directory. Anywhere else is chosen on the command line (-o, or --set output_dir=...).
        parts = Path(out).parts
        escapes = Path(out).is_absolute() or out.startswith("~") or ".." in parts
        if not escapes:  # a symlink on the way (``link/x`` with ``link -> /elsewhere``) leaves it as well
            cwd = Path.cwd().resolve()
            escapes = not (cwd / out).resolve().is_relative_to(cwd)
        if escapes:
            chk.fail(
                "output_dir",
                f"output_dir={out!r} points outside the working directory; a preset file may only name a "
                "relative directory below it",
                f"choose that directory on the command line with -o {out} (or --set output_dir=...), "
                "or write a relative path such as qvl-out/my-preset",
            )

    return Plan(
        preset=loaded.name,
        preset_path=str(loaded.path),
        preset_hash=loaded.content_hash(),
        preset_chain=loaded.chain,
        description=description,
        backend=backend,
        model_id=model_id,
        npu=npu,
        npu_spec=spec,
        geometry=geometry,
        rbln_config=compile_cfg,
        load_rbln_config=load_cfg,
        placement=placement,
        processor=processor,
        resolved=resolved,
        output_dir=out,
        warnings=warnings,
        runtime=runtime,
    )


def _resolve_lm(
    chk: _Checker,
    rbln: dict[str, Any],
    visual: dict[str, Any],
    spec: NpuSpec,
    limits: dict[str, int],
    geometry: ModelGeometry,
    warnings: list[str],
) -> ResolvedLM:
    fam = spec.family
    # --- ViT buckets
    buckets = visual.get("max_seq_len")
    if buckets is None:
        chk.fail(
            "rbln_config.visual.max_seq_len",
            "'max_seq_len' must be specified for visual",
            "e.g. 16384 or [1024, 3136, 16384]",
        )
    bucket_list = buckets if isinstance(buckets, list) else [buckets]
    if not bucket_list:
        chk.fail("rbln_config.visual.max_seq_len", "visual.max_seq_len is an empty list", "give at least one bucket")
    for b in bucket_list:
        chk.int_("rbln_config.visual.max_seq_len", b, minimum=4, allowed=" (ViT patches per image)")
        if b % 4:
            chk.fail(
                "rbln_config.visual.max_seq_len",
                f"visual.max_seq_len bucket {b} is not a multiple of 4 (spatial_merge_size**2)",
                f"use {b - b % 4} or {b - b % 4 + 4}",
            )
    if len(set(bucket_list)) != len(bucket_list):
        chk.fail(
            "rbln_config.visual.max_seq_len",
            f"visual.max_seq_len={bucket_list} has duplicates",
            "list each bucket once",
        )
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

    # --- LM basics
    batch = chk.int_("rbln_config.batch_size", rbln.get("batch_size", 1), minimum=1)
    num_devices = chk.int_("rbln_config.num_devices", rbln.get("num_devices", 1), minimum=1)
    if fam == "REBEL" and (num_devices > 1 or visual_num_devices > 1):
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

    # --- Attention method (optimum-rbln validate_attention_method)
    partition = rbln.get("kvcache_partition_len")
    attn = rbln.get("attn_impl")
    if attn is None:
        attn = "flash_attn" if partition is not None else "eager"
    if attn not in ("eager", "flash_attn"):
        chk.fail(
            "rbln_config.attn_impl", f"Unknown attn_impl: {attn!r} (Available: 'eager', 'flash_attn')", "use flash_attn"
        )
    if attn == "flash_attn":
        if partition is None:
            partition = limits["default_partition"]
        chk.int_("rbln_config.kvcache_partition_len", partition)
        lo, hi = limits["partition_min"], limits["partition_max"]
        if not lo <= partition <= hi:
            chk.fail(
                "rbln_config.kvcache_partition_len",
                f"kvcache_partition_len={partition} is out of the {fam} supported range for flash_attn "
                f"({lo} <= P <= {hi})",
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
                f"max_seq_len={max_seq_len} must be a multiple of kvcache_partition_len ({partition}) "
                "and at least 2x it",
                f"use max_seq_len={fix}",
            )
        block = rbln.get("kvcache_block_size", partition)
        if block != partition:
            chk.fail(
                "rbln_config.kvcache_block_size",
                f"kvcache_block_size={block} must equal kvcache_partition_len ({partition}) with flash attention",
                "remove kvcache_block_size",
            )
    else:
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
        block = rbln.get("kvcache_block_size", max_seq_len)
        if block != max_seq_len:
            chk.fail(
                "rbln_config.kvcache_block_size",
                f"kvcache_block_size={block} must equal max_seq_len ({max_seq_len}) with eager attention",
                "remove kvcache_block_size",
            )
    chunk = rbln.get("prefill_chunk_size", 512 if spec.family == "REBEL" else 128)
    chk.int_("rbln_config.prefill_chunk_size", chunk, minimum=64)
    if chunk % 64:
        chk.fail(
            "rbln_config.prefill_chunk_size",
            f"prefill_chunk_size={chunk} must be divisible by 64",
            f"use {chunk - chunk % 64 or 64}",
        )

    # --- Decoder graphs
    dbs = rbln.get("decoder_batch_sizes")
    if dbs is None:
        dbs = [batch]
    else:
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
    dbs = sorted(dbs, reverse=True)

    # --- KV blocks
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

    return ResolvedLM(
        batch_size=batch,
        max_seq_len=max_seq_len,
        attn_impl=attn,
        kvcache_partition_len=partition if attn == "flash_attn" else None,
        kvcache_block_size=block,
        prefill_chunk_size=chunk,
        kvcache_num_blocks=num_blocks,
        memory_budget=budget_value,
        decoder_batch_sizes=dbs,
        vit_buckets=sorted(bucket_list),
        num_full_blocks=num_full,
        num_min_blocks=num_min,
        num_devices=num_devices,
        visual_num_devices=visual_num_devices,
        quantization=_quantization(chk, rbln.get("quantization")),
        use_attention_mask=bool(rbln.get("use_attention_mask")),
        use_position_ids=bool(rbln.get("use_position_ids")),
    )


# optimum-rbln 0.12 transformers/utils/rbln_quantization.py::RBLNQuantizationConfig
QUANT_SUPPORTED = {
    "format": ["rbln"],
    "weights": ["int4", "int8", "fp8", "fp16"],
    "activations": ["int8", "fp8", "fp16"],
    "kv_caches": ["fp8", "fp16"],
}
QUANT_KEYS = ("format", "weights", "activations", "kv_caches", "dynamic", "precision")


def _quantization(chk: _Checker, quant: Any) -> dict[str, Any] | None:
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
    weights, activations = quant.get("weights"), quant.get("activations")
    precision = quant.get("precision")
    if precision is not None:
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
        weights, activations = "int4", "fp16"
    resolved = {
        "format": quant.get("format") or "rbln",
        "weights": weights or "fp16",
        "activations": activations or "fp16",
        "kv_caches": quant.get("kv_caches") or "fp16",
    }
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
    return {**resolved, "dynamic": bool(dynamic)}


def _memory_budget(chk: _Checker, budget: Any, spec: NpuSpec) -> float | int | None:
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


def _placement(chk: _Checker, placement: dict[str, Any], resolved: ResolvedLM, warnings: list[str]) -> dict[str, Any]:
    """Device ids per submodule, one per compiled device (num_devices), so load and the planner agree."""
    device = chk.device("placement.device", placement.get("device", 0))
    own_visual = placement.get("visual_device") is not None
    visual_device = chk.device("placement.visual_device", placement["visual_device"] if own_visual else device)
    lm_count = ("rbln_config.num_devices", resolved.num_devices)
    device = _devices_for(chk, "placement.device", device, lm_count, warnings)
    visual_count = ("rbln_config.visual.num_devices", resolved.visual_num_devices)
    note = "" if own_visual else " (defaults to placement.device)"
    visual_device = _devices_for(chk, "placement.visual_device", visual_device, visual_count, warnings, note)
    return {"device": device, "visual_device": visual_device}


def _devices_for(
    chk: _Checker,
    key: str,
    dev: int | list[int],
    count: tuple[str, int],
    warnings: list[str],
    note: str = "",
) -> int | list[int]:
    """A list must name num_devices ids; an int d with num_devices n > 1 becomes [d, ..., d+n-1].

    optimum-rbln length-checks only a list ``device``; an int is handed to the runtime as is, and which
    devices the n shards then use is not documented. qvl pins them to n consecutive ids and says so.
    """
    count_key, n = count
    if isinstance(dev, list):
        if len(dev) != n:
            chk.fail(
                key,
                f"{key}{note}={dev} lists {len(dev)} device(s) but {count_key} is {n}",
                f"set {key} to a list of {n} device id(s), one per compiled device",
            )
        return dev
    if n == 1:
        return dev
    expanded = list(range(dev, dev + n))
    warnings.append(
        f"{key}{note}={dev} with {count_key}={n}: placed on devices {expanded} ({n} consecutive ids from {dev}); "
        f"list the ids to choose others, e.g. {key}: {expanded}"
    )
    return expanded


def _processor(
    chk: _Checker, proc: dict[str, Any], model_id: str, resolved: ResolvedLM, warnings: list[str]
) -> ProcessorCaps:
    defaults = processor_defaults(model_id)
    largest = resolved.vit_buckets[-1]
    bucket_cap = largest * 256  # smart_resize keeps h*w <= max_pixels, so patches <= largest bucket
    values: dict[str, Any] = {}
    for key in ("min_pixels", "max_pixels", "video_min_pixels", "video_max_pixels", "min_frames", "max_frames"):
        if key in proc and proc[key] is not None:
            values[key] = chk.int_(f"processor.{key}", proc[key], minimum=1)
    min_px = values.get("min_pixels", defaults["min_pixels"])
    max_px = values.get("max_pixels", min(defaults["max_pixels"], bucket_cap))
    if "max_pixels" in values and max_px > bucket_cap:
        warnings.append(
            f"processor.max_pixels={max_px} lets images exceed the largest ViT bucket {largest} "
            f"(needs <= {bucket_cap}); such images fail at run time"
        )
    if min_px > max_px and "max_pixels" not in values and max_px == bucket_cap:
        _bucket_below_min_pixels(chk, resolved.vit_buckets, min_px, "min_pixels" in values)
    if min_px > max_px:
        chk.fail(
            "processor.min_pixels", f"processor.min_pixels={min_px} is above max_pixels={max_px}", "lower min_pixels"
        )
    fps = proc.get("fps", 2.0)
    if isinstance(fps, bool) or not isinstance(fps, int | float) or fps <= 0:
        chk.fail("processor.fps", f"processor.fps={fps!r} must be a positive number", "e.g. fps: 2")
    vmin = values.get("video_min_pixels", defaults["video_min_pixels"])
    vmax = values.get("video_max_pixels", defaults["video_max_pixels"])
    fmin = values.get("min_frames", 4)
    fmax = values.get("max_frames", 768)
    if fmin > fmax:
        chk.fail("processor.min_frames", f"processor.min_frames={fmin} is above max_frames={fmax}", "lower min_frames")
    return ProcessorCaps(min_px, max_px, vmin, vmax, float(fps), fmin, fmax)


def _bucket_below_min_pixels(chk: _Checker, buckets: list[int], min_px: int, min_from_preset: bool) -> None:
    """max_pixels was derived from the largest ViT bucket: that bucket is what to raise, so name it."""
    largest = buckets[-1]
    shown = largest if len(buckets) == 1 else buckets
    need = -(-min_px // 256)
    need += -need % 4  # patches come in 2x2 merge groups
    where = "the model's processor default"
    if min_from_preset:
        where = f"from {chk.loaded.source_of('processor.min_pixels')}"
    chk.fail(
        "rbln_config.visual.max_seq_len",
        f"visual.max_seq_len={shown}: the largest ViT bucket {largest} caps processor.max_pixels at "
        f"{largest * 256} ({largest} x 256), below processor.min_pixels={min_px} ({where}), so no image fits",
        f"make the largest bucket at least {need} patches (min_pixels / 256, rounded up to a multiple of 4), "
        f"e.g. --set visual.max_seq_len={need}, or lower processor.min_pixels",
    )
