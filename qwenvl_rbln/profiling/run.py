"""``qvl profile`` as data: load an artifact's graphs on the devices of its placement, time each one with
synthetic inputs (every ViT bucket; the prefill chunk and each decoder batch at several contexts), fit the LM
graphs over context, set every figure beside the roofline, and record the entry in timings.json.

Under ``--emulate`` the graphs run on qvl's CPU emulator of rebel: the figures are CPU times, recorded in the
file's ``emulated`` section and labelled emulated everywhere; nothing reads them for a real NPU.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts.manifest import graph_hash
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.profiling.compare import compare, roofline_seconds
from qwenvl_rbln.profiling.graphs import Graph, Shapes, contexts, discover, synthetic_inputs
from qwenvl_rbln.profiling.timer import time_call
from qwenvl_rbln.tuning.fit import fit_quadratic
from qwenvl_rbln.tuning.measured import SPREAD, entry_key, write_entry


@dataclass(frozen=True)
class ProfileOptions:
    directory: Path
    emulate: bool = False
    warmup: int = 2
    repeats: int = 10
    points: int = 5  # context positions per LM graph (3 or more for a quadratic fit with an error)
    check: float | None = None  # --check TOL: measured / roofline within 1 +- TOL
    save: bool = True
    only: tuple[str, ...] = ()  # graph kinds (vit, prefill, decoder) or keys to time; empty: all


def _roofline(directory: Path, npu: str, shapes: Shapes) -> tuple[Any, str]:
    from qwenvl_rbln.memory.calibration import model_key
    from qwenvl_rbln.planning.catalogue.devices import compute_spec
    from qwenvl_rbln.planning.catalogue.modelinfo import geometry_from_config, read_model_config
    from qwenvl_rbln.tuning.roofline import Roofline

    geometry = geometry_from_config(read_model_config(directory), name=directory.name, source="artifact")
    return Roofline(geometry, compute_spec(npu), chunk=shapes.chunk), model_key(geometry)


def _time_graph(rebel: Any, art: Path, graph: Graph, shapes: Shapes, opts: ProfileOptions) -> dict[str, Any]:
    """One runtime for the graph (dropped afterwards: the KV pool of one graph at a time on the device)."""
    from qwenvl_rbln.backends.rbln.optimum import first_line
    from qwenvl_rbln.errors import BackendError

    try:
        compiled = rebel.RBLNCompiledModel(str(art / graph.file))
        runtime = rebel.Runtime(compiled, tensor_type="pt", device=graph.device)
    except (RuntimeError, OSError, ValueError, TypeError) as exc:
        raise BackendError(
            f"{graph.file} ({graph.key}) cannot be loaded on device {graph.device}: {first_line(exc)}",
            "`qvl load-check DIR` diagnoses the artifact and its placement; an artifact from `qvl compile "
            "--emulate` needs --emulate, any other one an NPU host",
        ) from None
    points, clock = [], ""
    for n in contexts(graph, shapes, opts.points):
        inputs = synthetic_inputs(graph, shapes, n)
        stats, clock = time_call(rebel, lambda x=inputs: runtime(*x), warmup=opts.warmup, repeats=opts.repeats)
        points.append({"context": n if n is not None else 0, **stats})
    runtime = compiled = None  # noqa: F841 (dropped before the next graph's runtime takes the device)
    return {"key": graph.key, "kind": graph.kind, "file": graph.file, "device": graph.device, "size": graph.size,
            "time_source": clock, "points": points}  # fmt: skip


def _versions(rebel: Any) -> dict[str, str]:
    from qwenvl_rbln.artifacts.manifest import collect_versions

    return {"rebel": str(getattr(rebel, "__version__", "unknown")), "optimum_rbln": collect_versions()["optimum-rbln"]}


def _load(opts: ProfileOptions) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    from qwenvl_rbln.artifacts.manifest import read_manifest

    art = opts.directory
    if not art.is_dir():
        raise InputError(f"artifact directory {art} does not exist", "pass the directory `qvl compile` wrote")
    manifest = read_manifest(art)
    if (manifest or {}).get("emulated") and not opts.emulate:
        raise InputError(f"{art} was compiled on the CPU emulator", f"profile it with `qvl profile {art} --emulate`")
    return manifest, (manifest or {}).get("placement") or {"device": 0, "visual_device": 0}


def run_profile(opts: ProfileOptions) -> dict[str, Any]:
    """Time every graph, fit, compare, and (``save``) write the entry; the document ``--json`` prints."""
    from qwenvl_rbln.backends import emulator
    from qwenvl_rbln.tuning.measured import timings_path

    manifest, placement = _load(opts)
    art = opts.directory
    graphs, shapes = discover(art, int(placement.get("device") or 0), int(placement.get("visual_device") or 0))
    if opts.only:
        graphs = [g for g in graphs if g.kind in opts.only or g.key in opts.only]
        if not graphs:
            raise InputError(f"--only {', '.join(opts.only)} names no graph of {art}", "name vit, prefill, decoder or "
                             "a graph key that `qvl profile --json` lists")  # fmt: skip
    with emulator.active() if opts.emulate else contextlib.nullcontext():
        rebel = _import_rebel()
        npu = str(rebel.get_npu_name(graphs[0].device if graphs else 0) or "unknown")
        roof, mkey = _roofline(art, npu, shapes)
        timed = [_time_graph(rebel, art, g, shapes, opts) for g in graphs]
        versions = _versions(rebel)
    for g, rec in zip(graphs, timed, strict=True):
        for p in rec["points"]:
            p["roofline_s"] = roofline_seconds(roof, g, shapes, p["context"] if g.kind != "vit" else None)
            if g.kind != "vit":  # prefill: chunk tokens per second (llm-d's peakPrefillThroughput); decode: rows
                p["tokens_per_s"] = g.size / p["median_s"] if p["median_s"] > 0 else None
        if g.kind != "vit":
            fit = fit_quadratic([(p["context"], p["median_s"]) for p in rec["points"]])
            rec["fit"] = fit.to_dict() if fit else None
        else:
            rec["fit"] = None
    check = compare(timed, opts.check)
    ghash = graph_hash(art, manifest)
    key = entry_key(npu, versions["rebel"], versions["optimum_rbln"], ghash)
    from qwenvl_rbln.artifacts.manifest import now

    entry = {
        "npu": npu,
        **versions,
        "graph_hash": ghash,
        "model_key": mkey,
        "artifact": str(art.absolute()),
        "profiled_at": now(),
        "warmup": opts.warmup,
        "repeats": opts.repeats,
        "spread": SPREAD,
        "graphs": {g["key"]: {k: v for k, v in g.items() if k != "key"} for g in timed},
    }
    path = write_entry(key, entry, emulated=opts.emulate) if opts.save else None
    return {
        "artifact": str(art),
        "emulated": opts.emulate,
        "label": "emulated on the CPU by qvl, not an NPU figure" if opts.emulate else f"measured on {npu}",
        "npu": npu,
        **versions,
        "graph_hash": ghash,
        "entry_key": key,
        "placement": placement,
        "spread": SPREAD,
        "roofline": roof.label(),
        "graphs": timed,
        "check": check,
        "timings_file": str(path) if path else None,
        "timings_section": ("emulated" if opts.emulate else "entries") if path else None,
        "default_timings_file": str(timings_path()),
    }


def _import_rebel() -> Any:
    import importlib

    from qwenvl_rbln.backends.rbln.optimum import install_hint, missing_dependencies
    from qwenvl_rbln.errors import DependencyMissing

    if "rebel-compiler" in missing_dependencies():
        raise DependencyMissing(
            "rebel-compiler is not installed, so no graph can run here", install_hint(["rebel-compiler"])
        )
    return importlib.import_module("rebel")
