"""``qvl infer`` end to end: requests -> artifact/plan -> vision report -> backend -> one result dict.

Order (nothing half-done): generation flags, then requests (flags or batch file), then every image/video
probed, then the artifact directory and its plan resolved and checked (Qwen3-VL, batch size), then the ViT
buckets of every input decided (oversize resize/error), and only then is a model loaded.

Which directory and which plan:

* ``DIR`` given and written by ``qvl compile`` (``qvl-rbln-config.json`` for backend torch,
  ``rbln_config.json`` for rbln): the backend is the artifact's; the preset is ``--preset`` or the one
  recorded in its ``qvl-manifest.json`` (else rebel100-1npu); batch size, decoder graphs and ViT buckets are
  read from the artifact's own config (the compiled truth). A preset whose batch_size or
  decoder_batch_sizes differ from the artifact's is an error.
* ``DIR`` given and a plain Hugging Face Qwen3-VL directory: the reference backend on it, with the preset's
  caps, batch size and buckets (default preset: cpu-tiny for the tiny model, else rebel100-1npu).
* no ``DIR``: the preset's ``output_dir`` (where ``qvl compile --preset P`` writes).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.paths import user_path

DEFAULT_PRESET = "rebel100-1npu"
TINY_PRESET = "cpu-tiny"  # default for a plain tiny-model directory (rebel100-1npu's 262144 tokens do not fit it)
TINY_NOTICE = "qvl tiny model (random weights): the generated text is meaningless; it exercises every code path"


@dataclass
class Target:
    directory: Path
    kind: str  # "torch" | "rbln" (qvl artifacts) | "hf" (a plain Hugging Face directory)
    backend: str  # "torch" | "rbln"
    plan: Any
    resolved: Any  # plan.ResolvedLM of what was compiled
    manifest: dict[str, Any] | None
    config: dict[str, Any] | None
    tiny: bool
    warnings: list[str] = field(default_factory=list)


@dataclass
class InferOptions:
    directory: Path | None = None
    preset: str | None = None
    sets: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)
    prompt: str | None = None
    system: str | None = None
    batch_file: Path | None = None
    max_new_tokens: int = 64
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    device: Any = None
    visual_device: Any = None
    on_oversize: str = "resize"
    torch_device: str | None = None


def _manifest_preset(manifest: dict[str, Any] | None) -> str | None:
    """The preset an artifact was compiled with: its name when that names the same file, else its path."""
    from qwenvl_rbln.presets import list_preset_files

    info = (manifest or {}).get("preset")
    if not isinstance(info, dict):
        return None
    name, path = info.get("name"), info.get("path")
    known = list_preset_files()
    if isinstance(name, str) and name in known and (not path or Path(path).resolve() == known[name].resolve()):
        return name
    stem = Path(name).stem if isinstance(name, str) else None
    if stem in known and isinstance(path, str) and Path(path).resolve() == known[stem].resolve():
        return stem
    if isinstance(path, str) and Path(path).is_file():
        return path
    return name if isinstance(name, str) and name else None


def _is_tiny(directory: Path, manifest: dict[str, Any] | None) -> bool:
    from qwenvl_rbln.modelinfo import TINY_MODEL_ID
    from qwenvl_rbln.tiny_model import is_tiny_model

    if is_tiny_model(directory):
        return True
    model = (manifest or {}).get("model") or {}
    if model.get("id") == TINY_MODEL_ID:
        return True
    local = model.get("local_path")
    return bool(local) and is_tiny_model(Path(local))


def _qwen3_vl_config(directory: Path) -> None:
    """InputError (one line) unless ``directory/config.json`` is a Qwen3-VL config."""
    from qwenvl_rbln.modelinfo import read_model_config

    try:
        read_model_config(directory)
    except InputError as exc:
        raise InputError(
            exc.message,
            "qvl infer runs Qwen3-VL: pass the directory `qvl compile` wrote, or a "
            "Hugging Face Qwen3-VL model directory",
        ) from None


def resolve_target(directory: Path | None, preset: str | None, sets: list[str] | None = None) -> Target:
    """The directory to run, its backend and the plan; InputError for anything that cannot run."""
    from qwenvl_rbln import artifacts
    from qwenvl_rbln.plan import build_plan

    sets = list(sets or [])
    last = artifacts.last_compile() if directory is None and preset is None else None
    if last is not None:  # `qvl compile --preset P` then `qvl infer ...` runs what was just compiled
        directory, preset = Path(last["output_dir"]), last["preset"]
    if directory is None:
        plan = build_plan(preset or DEFAULT_PRESET, sets)
        directory = user_path(plan.output_dir, "output_dir")
        if not directory.exists():
            raise InputError(
                f"no artifacts at {directory} (the output_dir of preset {plan.preset})",
                f"compile them first: `qvl compile --preset {plan.preset}`, or pass the artifact directory: "
                "`qvl infer DIR ...`",
            )
    directory = user_path(directory).absolute()
    if not directory.is_dir():
        what = "does not exist" if not directory.exists() else "is not a directory"
        raise InputError(f"{directory} {what}", "pass the directory `qvl compile` wrote, or a Qwen3-VL model directory")
    kind = artifacts.artifact_kind(directory)
    if kind is None:
        if not (directory / "config.json").is_file():
            raise InputError(
                f"{directory} is neither a qvl artifact nor a Hugging Face model directory "
                f"(no {artifacts.TORCH_CONFIG_NAME}, {artifacts.RBLN_CONFIG_NAME} or config.json)",
                "pass the directory `qvl compile` wrote, or a Qwen3-VL model directory",
            )
        _qwen3_vl_config(directory)  # not qwen3_vl -> one clear line
        tiny = _is_tiny(directory, None)
        plan = build_plan(preset or (TINY_PRESET if tiny else DEFAULT_PRESET), sets, model=str(directory))
        warnings = []
        if plan.backend == "rbln":
            warnings.append(
                f"{directory} is a Hugging Face directory, not compiled artifacts: running the torch reference "
                f"backend with preset {plan.preset}'s batch size, buckets and pixel caps"
            )
        return Target(directory, "hf", "torch", plan, plan.resolved, None, None, tiny, warnings)

    _, cfg = artifacts.read_artifact_config(directory)
    manifest = artifacts.read_manifest(directory)
    _qwen3_vl_config(directory)  # the artifact's config.json must be a Qwen3-VL config
    preset_ref = preset or _manifest_preset(manifest) or DEFAULT_PRESET
    plan = build_plan(preset_ref, sets, model=str(directory))
    source = directory / (artifacts.RBLN_CONFIG_NAME if kind == "rbln" else artifacts.TORCH_CONFIG_NAME)
    resolved = artifacts.resolved_from_rbln_config(cfg, source=str(source))
    pr = plan.resolved
    if resolved.batch_size != pr.batch_size or sorted(resolved.decoder_batch_sizes) != sorted(pr.decoder_batch_sizes):
        recorded = _manifest_preset(manifest)
        if recorded and recorded != preset_ref:
            hint = f"run it with the preset it was compiled with (--preset {recorded})"
        else:
            hint = "pass the preset it was compiled with (--preset P)"
        raise InputError(
            f"{directory} was compiled for batch_size {resolved.batch_size} (decoder graphs "
            f"{resolved.decoder_batch_sizes}) but preset {plan.preset} says batch_size {pr.batch_size} "
            f"(decoder graphs {pr.decoder_batch_sizes})",
            f"{hint}, or recompile: `qvl compile --preset {plan.preset} -o {directory} --force`",
        )
    warnings = []
    if sorted(resolved.vit_buckets) != sorted(pr.vit_buckets):
        warnings.append(
            f"{directory} was compiled with ViT buckets {resolved.vit_buckets}, preset {plan.preset} says "
            f"{pr.vit_buckets}: using the compiled ones"
        )
    layout = artifacts.check_layout(directory, kind, cfg, None)  # files present; hashes are load-check's job
    if layout["missing"] or layout["problems"]:
        raise InputError(
            f"{directory}: {artifacts.describe_layout_problem({**layout, 'unexpected': [], 'modified': []})}",
            "`qvl load-check DIR` lists every problem; recompile with `qvl compile --force`",
        )
    return Target(directory, kind, kind, plan, resolved, manifest, cfg, _is_tiny(directory, manifest), warnings)


def resolve_placement(target: Target, device: Any, visual_device: Any) -> dict[str, Any]:
    """The load placement for rbln: the flags, else the manifest's, else the preset's (as load-check)."""
    from qwenvl_rbln import artifacts
    from qwenvl_rbln.commands.load_check_cmd import check_placement

    fallback = {"preset": target.plan.preset, "placement": target.plan.placement}
    compiled = artifacts.compile_target(target.config or {}, target.manifest)
    placement = check_placement(device, visual_device, target.manifest, compiled, fallback)
    if not placement["ok"]:
        raise InputError(placement["problems"][0], "pass one device id per compiled device (num_devices)")
    return placement


def _decoder_info(real: int, resolved: Any) -> dict[str, Any]:
    from qwenvl_rbln.buckets import select_decoder_graph

    bs = resolved.batch_size
    vgraph, vpad = select_decoder_graph(real, resolved.decoder_batch_sizes)
    return {
        "decoder_graph": f"decoder_batch_{bs}",
        "graph_batch": bs,
        "real_rows": real,
        "padded_rows": bs - real,
        "vllm_rbln_graph": f"decoder_batch_{vgraph}",
        "vllm_rbln_padded_rows": vpad,
    }


def _memory(backend: Any, target: Target, placement: dict[str, Any] | None) -> dict[str, Any]:
    if target.backend == "torch":
        return backend.memory()
    from qwenvl_rbln import memory as planner

    try:
        report = planner.estimate(
            target.plan.geometry, target.resolved, target.plan.npu_spec, placement["requested"], dtype_bytes=2
        ).to_dict()
    except Exception as exc:  # noqa: BLE001 - memory figures must never fail a finished run
        return {"source": "unavailable", "reason": str(exc)}
    return {
        "source": "planner estimate",
        "fits": report.get("fits"),
        "devices": [
            {
                "device": d["device"],
                "total_bytes": d["total_bytes"],
                "usable_bytes": d["usable_bytes"],
                "fits": d["fits"],
            }
            for d in report.get("devices") or []
        ],
    }


def collect_requests(opts: InferOptions) -> list[Any]:
    from qwenvl_rbln.inference.requests import from_flags, parse_batch_file, validate_requests

    if opts.batch_file is not None:
        mixed = [f for f, v in (("--prompt", opts.prompt), ("--image", opts.images), ("--video", opts.videos)) if v]
        if mixed:
            raise InputError(
                f"--batch-file cannot be combined with {', '.join(mixed)}",
                "put every request in the batch file (keys prompt, images, video), or drop --batch-file",
            )
        requests = parse_batch_file(opts.batch_file, default_system=opts.system)
    else:
        requests = from_flags(opts.prompt, opts.images, opts.videos, opts.system)
    return validate_requests(requests)


def run_infer(
    opts: InferOptions,
    *,
    stream: Any = None,
    on_batch: Any = None,
    notify: Any = None,
    model_cls: Any = None,
) -> dict[str, Any]:
    """Run ``qvl infer``; returns the JSON-able result.

    ``stream``: where the text of a one-request batch is streamed (None: no streaming);
    ``on_batch(rows, batch)`` is called after each batch (human output); ``notify(line)`` gets the
    warnings known before the model loads (the tiny-model notice first), so they show before any text.
    """
    from qwenvl_rbln.inference.generation import GenerationOptions
    from qwenvl_rbln.inference.vision_report import check_grids, plan_vision

    t_start = time.perf_counter()
    gen = GenerationOptions(opts.max_new_tokens, opts.temperature, opts.top_p, opts.seed)
    requests = collect_requests(opts)
    target = resolve_target(opts.directory, opts.preset, opts.sets)
    warnings = list(target.warnings) + gen.warnings()
    vis = target.plan.geometry.vision
    vplan = plan_vision(
        requests,
        target.plan.processor,
        target.resolved.vit_buckets,
        on_oversize=opts.on_oversize,
        patch_size=vis.patch_size,
        merge_size=vis.spatial_merge_size,
        temporal_patch_size=vis.temporal_patch_size,
    )
    warnings.extend(vplan.notes)
    placement = None
    if target.backend == "rbln":
        placement = resolve_placement(target, opts.device, opts.visual_device)
    elif opts.device is not None or opts.visual_device is not None:
        warnings.append("--device/--visual-device place NPU graphs; the torch reference backend ignores them")
    if notify is not None:
        for line in ([TINY_NOTICE] if target.tiny else []) + list(dict.fromkeys(warnings)):
            notify(line)

    t_load = time.perf_counter()
    if target.backend == "torch":
        from qwenvl_rbln.inference.reference import ReferenceBackend

        backend: Any = ReferenceBackend(target.directory, vplan.caps, device=opts.torch_device)
    else:
        from qwenvl_rbln.inference.rbln_generate import RblnBackend

        req = placement["requested"]
        backend = RblnBackend(
            target.directory,
            vplan.caps,
            batch_size=target.resolved.batch_size,
            device=req["device"],
            visual_device=req["visual_device"],
            model_cls=model_cls,
        )
    load_s = time.perf_counter() - t_load

    bs = target.resolved.batch_size
    chunk = target.resolved.prefill_chunk_size
    out_requests: list[dict[str, Any]] = []
    batches: list[dict[str, Any]] = []
    try:
        for index, start in enumerate(range(0, len(requests), bs)):
            batch = requests[start : start + bs]
            prefix = f"[{batch[0].id}] " if len(requests) > 1 else ""
            result = backend.run_batch(
                batch, gen, sink=stream, max_seq_len=target.resolved.max_seq_len, stream_prefix=prefix
            )
            warnings.extend(result.warnings)
            items = [it for r in batch for it in vplan.items[r.id]]
            warnings.extend(
                check_grids(
                    items,
                    result.vision_grids["image"],
                    result.vision_grids["video"],
                    target.resolved.vit_buckets,
                    patch_size=vis.patch_size,
                    merge_size=vis.spatial_merge_size,
                )
            )
            dec = _decoder_info(len(batch), target.resolved)
            batches.append(
                {
                    "index": index,
                    "request_ids": [r.id for r in batch],
                    "input_rows": result.input_rows,
                    **dec,
                    "timings": result.timings,
                }
            )
            rows = []
            for req, row in zip(batch, result.rows, strict=True):
                entry = {
                    "id": req.id,
                    "source": req.source,
                    "prompt": req.prompt,
                    "system": req.system,
                    "text": row.text,
                    "token_ids": row.token_ids,
                    "num_tokens": len(row.token_ids),
                    "finish_reason": row.finish_reason,
                    "streamed": row.streamed,
                    "vision": [it.to_dict() for it in vplan.items[req.id]],
                    "prefill": {
                        "tokens": row.prompt_tokens,
                        "chunk_size": chunk,
                        "chunks": math.ceil(row.prompt_tokens / chunk),
                    },
                    "batch": index,
                    "decoder_graph": dec["decoder_graph"],
                    "padded_rows": dec["padded_rows"],
                    "timings": result.timings,
                }
                rows.append(entry)
            out_requests.extend(rows)
            if on_batch is not None:
                on_batch(rows, batches[-1])
        memory = _memory(backend, target, placement)
    finally:
        backend.close()

    data: dict[str, Any] = {
        "backend": target.backend,
        "artifact_dir": str(target.directory),
        "artifact_kind": target.kind,
        "preset": target.plan.preset,
        "tiny_model": target.tiny,
        "notice": TINY_NOTICE if target.tiny else None,
        "runtime": backend.describe(),
        "batch_size": bs,
        "decoder_batch_sizes": target.resolved.decoder_batch_sizes,
        "vit_buckets": target.resolved.vit_buckets,
        "max_seq_len": target.resolved.max_seq_len,
        "processor": vplan.caps.to_dict(),
        "oversize": {"policy": opts.on_oversize, "capped": vplan.capped, "notes": vplan.notes},
        "generation": gen.to_dict(),
        "requests": out_requests,
        "batches": batches,
        "timings": {"load_s": round(load_s, 4), "total_s": round(time.perf_counter() - t_start, 4)},
        "memory": memory,
        "warnings": list(dict.fromkeys(warnings)),
    }
    if placement is not None:
        data["placement"] = placement["requested"]
    return data


def default_stream(as_json: bool) -> Any:
    """Streamed tokens: stdout for people, stderr in --json mode (stdout stays one JSON document)."""
    return sys.stderr if as_json else sys.stdout
