"""The numbers a pod spec needs that qvl can derive: how long a start may take, the CPU and host memory a replica
asks for, and (for llm-d's router) the prefill throughput. Each comes back with the reason the manifests print.

Only the load time can be measured here (``qvl load-check --json`` on the NPU host records the seconds its runtime
creation took); the rest are estimates and are labelled so in every comment that carries them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError

# Stated figures (not measured; the comments say so where they are used).
STORAGE_BYTES_PER_S = 100 * 2**20  # a network volume's sustained read; local NVMe is 10-30x faster
START_S = 600  # vLLM start-up, runtime creation on the NPU and warm-up around the read
PULL_S = 600  # the serving image is pulled before the startup probe starts counting
PROBE_DELAY_S = 15
PROBE_PERIOD_S = 10
SHM_GIB = 8  # vLLM's processes pass decoded images and video frames through /dev/shm
CACHE_GIB = 20  # vLLM's cache root (compiled graphs vllm-rbln writes, torch.compile artefacts)
BASE_HOST_GIB = 6  # the API server and the engine core (Python, torch, transformers, the tokenizer and processor)


def _round_up(seconds: float, step: int = 60) -> int:
    return int(math.ceil(seconds / step) * step)


def measured_load_s(load_check: Path | None, artifact: Path, graph_hash: str | None = None) -> tuple[float | None, str]:
    """(seconds, where it came from): the --load-check report when given, else the load ``qvl load-check``
    recorded for this artifact's graphs on this machine ($QVL_HOME/load-times.json), else (None, "").
    ``graph_hash``: the artifact's, when the caller computed it (``manifest.graph_hash``)."""
    if load_check is not None:
        from qwenvl_rbln.deploy.load_report import read_load_check

        return read_load_check(load_check, artifact, graph_hash=graph_hash), f"the report {load_check}"
    from qwenvl_rbln.artifacts.load_times import measured_load

    entry = measured_load(artifact, key=graph_hash)
    if entry is None:
        return None, ""
    return float(entry["seconds"]), f"recorded {str(entry.get('date'))[:10]} in {entry['file']}"


def load_budget(measured_s: float | None, size_bytes: int, source: str = "") -> dict[str, Any]:
    """The startup probe's budget and the Deployment's progress deadline, with the reasoning."""
    if measured_s is not None:
        budget = max(300, _round_up(3 * measured_s))
        why = (
            f"qvl load-check measured a load of {measured_s:.0f} s on the NPU host ({source}); the budget is 3x that "
            f"({budget} s, at least 300 s) for a busier node, a cold page cache and slower storage."
        )
    else:
        read_s = size_bytes / STORAGE_BYTES_PER_S
        budget = max(900, _round_up(2 * (read_s + START_S)))
        why = (
            f"A stated conservative figure, not measured (load-check recorded no load of these graphs here, and no "
            f"--load-check report was given): reading the "
            f"{size_bytes / 2**30:.1f} GiB artifact at {STORAGE_BYTES_PER_S // 2**20} MiB/s (a network volume) takes "
            f"{read_s:.0f} s, plus {START_S} s for vLLM's start, the runtime creation on the NPU and warm-up; "
            f"the budget doubles that ({budget} s, at least 900 s). The artifact is precompiled, so no start "
            "compiles. Pass --load-check with `qvl load-check --json` from the NPU host to size it from a measurement."
        )
    threshold = math.ceil((budget - PROBE_DELAY_S) / PROBE_PERIOD_S)
    window = PROBE_DELAY_S + threshold * PROBE_PERIOD_S  # from the container's start until the probe gives up
    return {
        "budget_s": budget,
        "measured_s": measured_s,
        "measured_from": source or None,
        "why": why,
        "failure_threshold": threshold,
        "window_s": window,
        "progress_deadline_s": window + PULL_S,
    }


def host_resources(cfg: dict[str, Any], size_bytes: int) -> dict[str, Any]:
    """CPU and host-memory requests per replica, estimated from the compiled batch and the artifact's size."""
    batch = cfg.get("batch_size") if type(cfg.get("batch_size")) is int else 1
    cpu = 2 + math.ceil(batch / 2)
    cpu += cpu % 2  # even: a node whose static CPU manager aligns to SMT siblings rejects odd counts
    graphs_gib = math.ceil(size_bytes / 2**30)
    memory = BASE_HOST_GIB + graphs_gib + SHM_GIB
    return {
        "cpu": str(cpu),
        "memory": f"{memory}Gi",
        "why_cpu": (
            f"An estimate, not measured: 2 cores for vLLM's API server and engine core, plus 1 per 2 of the "
            f"{batch} sequences the artifact batches (max_num_seqs), which decode and resize images and video "
            "frames on the CPU; rounded up to an even count."
        ),
        "why_memory": (
            f"An estimate, not measured: {BASE_HOST_GIB} GiB for vLLM's processes, {graphs_gib} GiB for the "
            f"artifact's files (read into host memory, and into the page cache charged to this pod, before they go "
            f"to the NPU), and {SHM_GIB} GiB for /dev/shm, which is memory-backed and counts against this limit. "
            "The limit equals the request, so a replica that outgrows it is restarted instead of starving its node."
        ),
    }


def prefill_throughput(
    model_config: dict[str, Any], cfg: dict[str, Any], npu: str | None, graph_hash: str | None = None
) -> dict[str, Any]:
    """Peak prefill tokens/s of one replica, the first prefill chunk (where the fewest tokens are attended to), from
    ``qvl tune``'s cost model: the chunk ``qvl profile`` measured on this NPU when timings.json has it (real NPU
    entries of this artifact only, by ``graph_hash``), else the roofline bound. ``measured`` says which. A timings
    file that cannot be used (a value no graph call can have) gives no figure, with the reason, as a missing one."""
    from qwenvl_rbln.memory.calibration import model_key, prefill_key
    from qwenvl_rbln.planning.catalogue.devices import compute_spec
    from qwenvl_rbln.planning.catalogue.modelinfo import geometry_from_config
    from qwenvl_rbln.tuning.measured import load_measured
    from qwenvl_rbln.tuning.measured_roofline import ROOFLINE, MeasuredRoofline

    try:
        compute = compute_spec(npu or "")
        geometry = geometry_from_config(model_config, "artifact", "config.json")
        measured = load_measured(model_key(geometry), compute.sku, graph_hash=graph_hash)
        chunk = cfg.get("prefill_chunk_size") if type(cfg.get("prefill_chunk_size")) is int else 128
        # the calibration key's block, as qvl profile writes it (profiling.graphs.Shapes.block)
        block = next((v for v in (cfg.get("kvcache_partition_len"), cfg.get("max_seq_len")) if type(v) is int), 0)
        roof = MeasuredRoofline(geometry, compute, chunk=chunk, measured=measured)
        seconds = roof.prefill_chunk(0, block)
    except InputError as exc:
        return {"tokens_per_s": None, "label": None, "reason": exc.message}
    source = roof.sources.get(prefill_key(chunk, block), ROOFLINE)
    is_measured = source != ROOFLINE
    label = source if is_measured else roof.label()
    tokens_per_s = int(chunk / seconds)
    return {"tokens_per_s": tokens_per_s, "label": label, "measured": is_measured, "chunk": chunk, "reason": None}
