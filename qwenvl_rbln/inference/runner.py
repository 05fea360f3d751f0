"""``qvl infer`` end to end: requests -> artifact/plan -> vision report -> backend -> one result dict.

Order (nothing half-done): generation flags, then requests (flags or batch file), then every image/video
probed, then the artifact directory and its plan resolved and checked (Qwen3-VL, batch size, tokenizer
files), then the ViT buckets of every input decided (oversize resize/error), prompt lengths bounded,
every image and sampled video frame decoded, the torch device checked, and only then is a model loaded.

Which directory and which plan run (the artifact's compiled values, ``--preset``/``--set``, conflicts,
placement) is ``inference.target``.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError, raise_all
from qwenvl_rbln.inference import work
from qwenvl_rbln.inference.target import Target, resolve_placement, resolve_target

TINY_NOTICE = "qvl tiny model (random weights): the generated text is meaningless; it exercises every code path"


def oversize_policy(opts: Any, target: Any) -> str:
    """--on-oversize, else the preset's runtime.on_oversize, else the compile's (its manifest), else resize:
    the one policy bucket-plan and serve follow too."""
    if opts.on_oversize:
        return opts.on_oversize
    compiled = (target.manifest or {}).get("runtime")
    compiled = compiled.get("on_oversize") if isinstance(compiled, dict) else None
    return target.plan.runtime.get("on_oversize") or compiled or "resize"


def _compiled_packing(target: Any) -> bool:
    """A compile's own runtime.vit_packing (recorded in its manifest, e.g. from --set) still holds at infer."""
    runtime = (target.manifest or {}).get("runtime")
    return not (isinstance(runtime, dict) and runtime.get("vit_packing") is False)


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
    on_oversize: str | None = None  # --on-oversize; None: the preset's / compile's runtime.on_oversize, else resize
    torch_device: str | None = None
    emulate: bool = False  # --emulate: rbln artifacts run on qvl's CPU emulator of rebel (also QVL_EMULATE_NPU=1)
    vit_packing: bool = True  # --no-vit-packing; the preset's runtime.vit_packing: false also turns it off


def decoder_info(real: int, resolved: Any) -> dict[str, Any]:
    from qwenvl_rbln.vision.buckets import select_decoder_graph

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
    from qwenvl_rbln.memory import planner

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
        problems: list[InputError] = []  # every bad line of the file, in line order, reported at once
        parsed = parse_batch_file(opts.batch_file, default_system=opts.system, problems=problems)
        requests = validate_requests(parsed, problems)
        fix = "correct each line listed; nothing ran"
        raise_all(sorted(problems, key=_line_number), f"bad lines in {opts.batch_file}", fix)
        return requests
    return validate_requests(from_flags(opts.prompt, opts.images, opts.videos, opts.system))


def _line_number(exc: InputError) -> int:
    """The line a batch-file problem names (``file:12: ...``), for reporting them in file order."""
    import re

    match = re.search(r":(\d+): ", exc.message)
    return int(match.group(1)) if match else 0


def check_prompt_room(requests: list[Any], vplan: Any, max_new_tokens: int, max_seq_len: int, processor: Any) -> None:
    """Refuse, before any model loads, a request whose prompt + ``max_new_tokens`` exceeds ``max_seq_len``.

    ``processor`` (tokenizer and chat template: no weights) counts each prompt exactly as
    ``inputs.build_inputs`` will (``inputs.prompt_tokens``, with the vision plan's token counts), so the
    limit the refusal names is the real one. ``generation.check_lengths`` checks the processor's own count
    again per batch, before generate.
    """
    from qwenvl_rbln.inference.generation import length_error
    from qwenvl_rbln.inference.inputs import prompt_tokens
    from qwenvl_rbln.inference.requests import FLAGS_SOURCE

    problems: list[InputError] = []  # every request that does not fit, reported together
    for req in requests:
        items = vplan.items[req.id]
        try:
            n = prompt_tokens(processor, req, items, req.caps or vplan.caps)
        except InputError as exc:
            prefix = "" if req.source == FLAGS_SOURCE else f"{req.source}: "
            problems.append(InputError(prefix + exc.message, exc.hint))
            continue
        if n + max_new_tokens > max_seq_len:
            problems.append(length_error(req, n, max_new_tokens, max_seq_len, sum(it.lm_tokens for it in items)))
    raise_all(problems, "requests do not fit max_seq_len", "correct each one listed; nothing ran")


_OWN_CHECK = object()  # vision_plan builds its own bucket_memory_check


def vision_plan(opts: InferOptions, target: Target, requests: list[Any], bucket_memory: Any = _OWN_CHECK) -> Any:
    """The ViT buckets of every image/video of ``requests`` (probed), each request's caps, oversize handling.

    ``bucket_memory``: a ``bucket_memory_check(target.plan)`` a caller keeps across calls (a batch worker plans one
    request at a time, and its answers per bucket are the same for every request); by default one is built here."""
    from qwenvl_rbln.inference.vision_report import bucket_memory_check, plan_vision
    from qwenvl_rbln.planning.catalogue.modelinfo import processor_defaults

    vis = target.plan.geometry.vision
    return plan_vision(
        requests,
        target.plan.processor,
        target.resolved.vit_buckets,
        on_oversize=oversize_policy(opts, target),
        patch_size=vis.patch_size,
        merge_size=vis.spatial_merge_size,
        temporal_patch_size=vis.temporal_patch_size,
        recompile=None if target.kind == "hf" else target.recompile,
        stock=processor_defaults(target.plan.model_id),
        bucket_memory=bucket_memory_check(target.plan) if bucket_memory is _OWN_CHECK else bucket_memory,
    )


def _prepare(
    opts: InferOptions, target: Target, requests: list[Any], gen: Any, bucket_memory: Any = _OWN_CHECK
) -> tuple[Any, list[str]]:
    """Everything decided before a model loads: the vision plan, per-request caps, decodable media, lengths.

    The prompt lengths are counted with the directory's processor (tokenizer and chat template, no weights),
    so a --max-new-tokens that does not fit is refused with the exact limit before a model loads.
    """
    from qwenvl_rbln.inference.inputs import check_media, check_prompt_texts, load_processor

    vplan = vision_plan(opts, target, requests, bucket_memory)
    for req in requests:
        req.caps = vplan.request_caps[req.id]
    check_media(requests, vplan.caps)
    processor = load_processor(target.directory, vplan.caps)
    check_prompt_texts(requests, processor)  # no vision placeholder typed into a prompt (it breaks generate)
    check_prompt_room(requests, vplan, gen.max_new_tokens, target.resolved.max_seq_len, processor)
    warnings = list(target.warnings) + gen.warnings() + vplan.notes
    return vplan, warnings


def _torch_device(opts: InferOptions, target: Target, warnings: list[str]) -> str | None:
    """The torch device, checked against the machine before loading (None on rbln, where it is ignored)."""
    if target.backend != "torch":
        if opts.torch_device is not None:
            warnings.append("--torch-device applies to the torch reference backend; the rbln backend ignores it")
        return None
    from qwenvl_rbln.inference.reference import torch_device

    return torch_device(opts.torch_device)


def emulation(opts: InferOptions, target: Target) -> bool:
    """Activate qvl's CPU emulator for an rbln artifact when asked; refuse what it cannot or must not run."""
    from qwenvl_rbln.backends.rbln import optimum as rbln_backend

    if target.backend != "rbln":
        if opts.emulate:
            raise InputError(
                f"--emulate emulates the NPU backend, but {target.directory} runs on the torch reference backend "
                f"(preset {target.plan.preset}; nothing to emulate)",
                "drop --emulate, or run an artifact compiled with `qvl compile --preset cpu-tiny-rbln --emulate`",
            )
        return False
    emulated = rbln_backend.use_emulator(opts.emulate)
    graphs = artifacts_graphs(target)
    problem = rbln_backend.artifact_problem(target.directory, target.config or {}, target.manifest, graphs)
    if problem is not None:
        raise problem
    return emulated


def artifacts_graphs(target: Target) -> dict[str, dict[str, str]]:
    from qwenvl_rbln.artifacts.layout import graph_files

    return graph_files(target.config or {})


@dataclass
class _Run:
    """Everything ``run_infer`` decided before a model loads (``warnings`` grows as batches run)."""

    gen: Any  # generation.GenerationOptions
    requests: list[Any]
    target: Target
    emulated: bool
    vplan: Any  # vision_report.VisionPlan
    warnings: list[str]
    placement: dict[str, Any] | None
    torch_dev: str | None
    bucket_memory: Any = None  # vision_report.bucket_memory_check of the plan: one answer per bucket, kept


def _plan_run(opts: InferOptions, requests: list[Any] | None = None) -> _Run:
    """Flags, requests, directory and plan, emulation, vision plan and lengths, placement, torch device:
    every refusal, in this order, before any model loads.

    ``requests``: already read (a batch worker plans with none: its requests come one at a time, each through the
    same checks, with the run's ``bucket_memory``)."""
    from qwenvl_rbln.inference.generation import GenerationOptions
    from qwenvl_rbln.inference.reference import device_spelling
    from qwenvl_rbln.inference.vision_report import bucket_memory_check

    gen = GenerationOptions(opts.max_new_tokens, opts.temperature, opts.top_p, opts.seed)
    device_spelling(opts.torch_device)
    requests = collect_requests(opts) if requests is None else requests
    target = resolve_target(opts.directory, opts.preset, opts.sets)
    emulated = emulation(opts, target)
    bucket_memory = bucket_memory_check(target.plan)
    vplan, warnings = _prepare(opts, target, requests, gen, bucket_memory)
    placement, torch_dev = place(opts, target, warnings)
    return _Run(gen, requests, target, emulated, vplan, warnings, placement, torch_dev, bucket_memory)


def place(opts: InferOptions, target: Target, warnings: list[str]) -> tuple[dict[str, Any] | None, str | None]:
    """(the NPU placement on rbln, the checked torch device on torch); a flag the backend ignores is a warning."""
    placement = None
    if target.backend == "rbln":
        placement = resolve_placement(target, opts.device, opts.visual_device)
    elif opts.device is not None or opts.visual_device is not None:
        warnings.append("--device/--visual-device place NPU graphs; the torch reference backend ignores them")
    return placement, _torch_device(opts, target, warnings)


def _announce(run: _Run, notify: Any) -> None:
    """The warnings known before the model loads, the tiny-model notice first."""
    if notify is None:
        return
    for line in ([TINY_NOTICE] if run.target.tiny else []) + list(dict.fromkeys(run.warnings)):
        notify(line)


def load_backend(
    opts: InferOptions,
    target: Target,
    caps: Any,
    placement: dict[str, Any] | None,
    torch_dev: str | None,
    model_cls: Any = None,
) -> Any:
    """The torch reference model, or the compiled rbln artifact on its placement (loaded once; reused per batch)."""
    if target.backend == "torch":
        from qwenvl_rbln.inference.reference import ReferenceBackend

        return ReferenceBackend(target.directory, caps, device=torch_dev)
    from qwenvl_rbln.inference.rbln_generate import RblnBackend

    req = placement["requested"]
    return RblnBackend(
        target.directory,
        caps,
        batch_size=target.resolved.batch_size,
        device=req["device"],
        visual_device=req["visual_device"],
        model_cls=model_cls,
        vit_packing=opts.vit_packing and target.plan.runtime.get("vit_packing", True) and _compiled_packing(target),
    )


def _grid_warnings(run: _Run, batch: list[Any], result: Any) -> list[str]:
    """The processor's real vision grids of a batch checked against the planned ViT buckets."""
    from qwenvl_rbln.inference.vision_report import check_grids

    vis = run.target.plan.geometry.vision
    items = [it for r in batch for it in run.vplan.items[r.id]]
    return check_grids(
        items,
        result.vision_grids["image"],
        result.vision_grids["video"],
        run.target.resolved.vit_buckets,
        patch_size=vis.patch_size,
        merge_size=vis.spatial_merge_size,
    )


def _request_entry(run: _Run, req: Any, row: Any, index: int, dec: dict[str, Any], result: Any) -> dict[str, Any]:
    """One request's row of the result: its text, tokens, vision items, caps, prefill and batch."""
    chunk = run.target.resolved.prefill_chunk_size
    return {
        "id": req.id,
        "source": req.source,
        "prompt": req.prompt,
        "system": req.system,
        "text": row.text,
        "token_ids": row.token_ids,
        "num_tokens": len(row.token_ids),
        "finish_reason": row.finish_reason,
        "streamed": row.streamed,
        "vision": [it.to_dict() for it in run.vplan.items[req.id]],
        "processor": run.vplan.request_caps[req.id].to_dict(),
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


def _run_batches(backend: Any, run: _Run, stream: Any, on_batch: Any) -> tuple[list[dict[str, Any]], list[dict]]:
    """Generate batch by batch: (one entry per request, one per batch); ``on_batch`` after each."""
    requests, resolved = run.requests, run.target.resolved
    bs = resolved.batch_size
    out_requests: list[dict[str, Any]] = []
    batches: list[dict[str, Any]] = []
    tokens = 0
    work.report("requests.start", total=len(requests))
    for index, start in enumerate(range(0, len(requests), bs)):
        batch = requests[start : start + bs]
        prefix = f"[{batch[0].id}] " if len(requests) > 1 else ""
        result = backend.run_batch(batch, run.gen, sink=stream, max_seq_len=resolved.max_seq_len, stream_prefix=prefix)
        run.warnings.extend(result.warnings)
        run.warnings.extend(_grid_warnings(run, batch, result))
        dec = decoder_info(len(batch), resolved)
        batches.append(
            {
                "index": index,
                "request_ids": [r.id for r in batch],
                "input_rows": result.input_rows,
                **dec,
                "timings": result.timings,
                "vit": getattr(backend, "last_vit", None),  # rbln: graph calls and packs of this batch
            }
        )
        rows = [_request_entry(run, req, row, index, dec, result) for req, row in zip(batch, result.rows, strict=True)]
        out_requests.extend(rows)
        tokens += sum(r["num_tokens"] for r in rows)
        if on_batch is not None:
            on_batch(rows, batches[-1])
        work.report("requests.batch", done=len(out_requests), tokens=tokens)
    return out_requests, batches


def _report(opts: InferOptions, run: _Run, backend: Any, ran: dict[str, Any]) -> dict[str, Any]:
    """The JSON-able result (``ran``: requests, batches, memory, load time and start of the finished run)."""
    target, vplan = run.target, run.vplan
    data: dict[str, Any] = {
        "backend": target.backend,
        "emulated": run.emulated,
        "artifact_dir": str(target.directory),
        "artifact_kind": target.kind,
        "preset": target.plan.preset,
        "tiny_model": target.tiny,
        "notice": TINY_NOTICE if target.tiny else None,
        "runtime": backend.describe(),
        "batch_size": target.resolved.batch_size,
        "decoder_batch_sizes": target.resolved.decoder_batch_sizes,
        "vit_buckets": target.resolved.vit_buckets,
        "max_seq_len": target.resolved.max_seq_len,
        "processor": vplan.caps.to_dict(),
        "oversize": {"policy": vplan.on_oversize, "capped": vplan.capped, "notes": vplan.notes},
        "generation": run.gen.to_dict(),
        "requests": ran["requests"],
        "batches": ran["batches"],
        "timings": {"load_s": round(ran["load_s"], 4), "total_s": round(time.perf_counter() - ran["t_start"], 4)},
        "memory": ran["memory"],
        "warnings": list(dict.fromkeys(run.warnings)),
    }
    if run.placement is not None:
        data["placement"] = run.placement["requested"]
    return data


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
    t_start = time.perf_counter()
    run = _plan_run(opts)
    _announce(run, notify)
    t_load = time.perf_counter()
    backend = load_backend(opts, run.target, run.vplan.caps, run.placement, run.torch_dev, model_cls)
    load_s = time.perf_counter() - t_load
    try:
        out_requests, batches = _run_batches(backend, run, stream, on_batch)
        memory = _memory(backend, run.target, run.placement)
    finally:
        backend.close()
    ran = {"requests": out_requests, "batches": batches, "memory": memory, "load_s": load_s, "t_start": t_start}
    return _report(opts, run, backend, ran)


def default_stream(as_json: bool) -> Any:
    """Streamed tokens: stdout for people, stderr in --json mode (stdout stays one JSON document)."""
    return sys.stderr if as_json else sys.stdout
