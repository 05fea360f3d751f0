"""Preset -> Plan: the exact optimum-rbln rbln_config dicts, validated before anything slow runs.

Every rule of optimum-rbln 0.12.0 that can be checked without the compiler is checked here, with
the key, the value and the allowed range in the message, plus the cases optimum-rbln misses
(single ``decoder_batch_sizes`` entry != batch_size, duplicates, ViT buckets not a multiple of 4,
``max_seq_len`` above the model's ``max_position_embeddings``, negative device ids). The LM's own rules
(buckets, attention, KV blocks, quantization, memory budget) are ``ResolvedLM.from_preset`` in lm/resolved.py
(its steps in lm/checks.py); this module checks the rest of the preset (keys, target NPU, placement, processor,
runtime, output_dir).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.catalogue.devices import NpuSpec, npu_spec
from qwenvl_rbln.planning.catalogue.modelinfo import (
    ModelGeometry,
    load_geometry,
    model_directory,
    processor_defaults,
)
from qwenvl_rbln.planning.checkpoint_scales import check_scales
from qwenvl_rbln.planning.lm.resolved import ResolvedLM
from qwenvl_rbln.planning.presets import LoadedPreset, closest, load_preset

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
ON_OVERSIZE = ("resize", "error")  # runtime.on_oversize / --on-oversize: one policy for infer, bucket-plan, serve
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
    """Pixel caps handed to the Qwen3-VL processor (images per image, videos over all frames and per frame)."""

    min_pixels: int
    max_pixels: int
    video_min_pixels: int
    video_max_pixels: int
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    video_max_frame_pixels: int | None = None  # qvl's per-frame cap (vision/frame_cap.py); None: none

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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

        from qwenvl_rbln.planning.presets import display_path

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
    policy = data.get("on_oversize")
    if policy is not None:
        if policy not in ON_OVERSIZE:
            chk.fail(
                "runtime.on_oversize",
                f"runtime.on_oversize={policy!r} is not one of {', '.join(ON_OVERSIZE)}",
                "runtime: {on_oversize: resize} (the default) or {on_oversize: error}",
            )
        runtime["on_oversize"] = policy
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
    """Validate a merged preset step by step (each step raises naming the file and key) and resolve it."""
    chk = _Checker(loaded)
    data = loaded.data
    warnings = list(loaded.warnings)
    description, backend, model_id = _identity(chk, data, model)
    rbln, visual = _rbln_sections(chk, data)
    npu, spec = _target_npu(chk, data, rbln, visual, warnings)
    try:
        geometry, geo_warnings = load_geometry(model_id, "--model" if model is not None else "model")
    except InputError as exc:
        if model is not None:
            raise
        chk.fail("model", exc.message, exc.hint or "")
    warnings.extend(geo_warnings)

    resolved = ResolvedLM.from_preset(chk, rbln, visual, spec, geometry, warnings)
    warnings.extend(check_scales(model_directory(model_id), resolved.quantization, model_id))

    # Compile dict: the preset's rbln_config, exactly, plus the target NPU at the top level.
    compile_cfg = copy.deepcopy(rbln)
    compile_cfg["npu"] = npu

    placement = _placement(chk, data.get("placement") or {}, resolved, warnings)
    load_cfg: dict[str, Any] = {"visual": {"device": placement["visual_device"]}, "device": placement["device"]}

    processor = _processor(chk, data.get("processor") or {}, model_id, resolved, warnings, geometry.vision)
    runtime = _runtime(chk, data.get("runtime") or {})
    out = _output_dir(chk, loaded, output_dir)

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


def _identity(chk: _Checker, data: dict[str, Any], model: str | None) -> tuple[str, str, str]:
    """(description, backend, model id): --model wins over the preset's model."""
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
    return description, backend, model_id


def _rbln_sections(chk: _Checker, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A copy of rbln_config and its visual section, every key known to optimum-rbln and of the right type."""
    rbln = data.get("rbln_config")
    if not isinstance(rbln, dict):
        chk.fail("rbln_config", f"rbln_config={rbln!r} must be a mapping", "add an rbln_config: section")
    rbln = copy.deepcopy(rbln)
    chk.keys("rbln_config.", rbln, LM_KEYS)
    visual = rbln.get("visual")
    if not isinstance(visual, dict):
        chk.fail("rbln_config.visual", "rbln_config.visual is missing", "add visual: {max_seq_len: 16384, ...}")
    chk.keys("rbln_config.visual.", visual, VISUAL_KEYS)
    return rbln, visual


def _target_npu(
    chk: _Checker, data: dict[str, Any], rbln: dict[str, Any], visual: dict[str, Any], warnings: list[str]
) -> tuple[str, NpuSpec]:
    """The target NPU: the preset's `npu`, or rbln_config.npu; both (and visual.npu) must agree."""
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
    if spec.family == "REBEL" and npu not in ("RBLN-CR13",):
        warnings.append(f"npu {npu} is not Rebel100 (RBLN-CR13); limits follow optimum-rbln's RBLN-CR rules")
    return npu, spec


def _output_dir(chk: _Checker, loaded: LoadedPreset, output_dir: str | None) -> str:
    """-o, else the preset's output_dir (which may only name a directory below the working directory), else
    qvl-out/<preset>."""
    data = loaded.data
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
    return out


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
    chk: _Checker, proc: dict[str, Any], model_id: str, resolved: ResolvedLM, warnings: list[str], vision: Any
) -> ProcessorCaps:
    defaults = processor_defaults(model_id)
    largest = resolved.vit_buckets[-1]
    bucket_cap = largest * 256  # smart_resize keeps h*w <= max_pixels, so patches <= largest bucket
    values: dict[str, Any] = {}
    keys = ("min_pixels", "max_pixels", "video_min_pixels", "video_max_pixels", "min_frames", "max_frames")
    for key in (*keys, "video_max_frame_pixels"):
        if key in proc and proc[key] is not None:
            values[key] = chk.int_(f"processor.{key}", proc[key], minimum=1)
    min_px = values.get("min_pixels", defaults["min_pixels"])
    max_px = values.get("max_pixels", min(defaults["max_pixels"], bucket_cap))
    if "max_pixels" in values and max_px > bucket_cap:
        warnings.append(
            f"processor.max_pixels={max_px} lets images exceed the largest ViT bucket {largest} "
            f"(needs <= {bucket_cap}); such images are resized for their request (runtime.on_oversize resize) or "
            "refused (error)"
        )
    frame_px = values.get("video_max_frame_pixels", bucket_cap)
    if frame_px > bucket_cap:
        warnings.append(
            f"processor.video_max_frame_pixels={frame_px} lets video frames exceed the largest ViT bucket {largest} "
            f"(needs <= {bucket_cap}); such videos are resized for their request (runtime.on_oversize resize) or "
            "refused (error)"
        )
    if min_px > max_px and "max_pixels" not in values and max_px == bucket_cap:
        _bucket_below_min_pixels(chk, resolved.vit_buckets, min_px, "min_pixels" in values, vision)
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
    return ProcessorCaps(min_px, max_px, vmin, vmax, float(fps), fmin, fmax, frame_px)


def _bucket_below_min_pixels(
    chk: _Checker, buckets: list[int], min_px: int, min_from_preset: bool, vision: Any
) -> None:
    """max_pixels was derived from the largest ViT bucket: that bucket is what to raise, so name it. The floor is
    the model's own patch geometry (tuning/workload.py's bucket choice asks the same)."""
    from qwenvl_rbln.planning.catalogue import modelinfo

    largest = buckets[-1]
    shown = largest if len(buckets) == 1 else buckets
    patch, merge = vision.patch_size, vision.spatial_merge_size
    need = modelinfo.min_pixels_bucket(min_px, patch, merge)  # whole merge groups of patches
    where = "the model's processor default"
    if min_from_preset:
        where = f"from {chk.loaded.source_of('processor.min_pixels')}"
    chk.fail(
        "rbln_config.visual.max_seq_len",
        f"visual.max_seq_len={shown}: the largest ViT bucket {largest} caps processor.max_pixels at "
        f"{largest * 256} ({largest} x 256), below processor.min_pixels={min_px} ({where}), so no image fits",
        f"make the largest bucket at least {need} patches (min_pixels / {patch * patch}, rounded up to a multiple "
        f"of {merge * merge}), "
        f"e.g. --set visual.max_seq_len={need}, or lower processor.min_pixels",
    )
