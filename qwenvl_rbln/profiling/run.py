"""``qvl profile`` as data: load an artifact's graphs on the devices of its placement, time each one with
synthetic inputs (every ViT bucket; the prefill chunk and each decoder batch at several contexts), fit the LM
graphs over context, set every figure beside the roofline, and record the entry in timings.json.

Under ``--emulate`` the graphs run on qvl's CPU emulator of rebel: the figures are CPU times, recorded in the
file's ``emulated`` section and labelled emulated everywhere; nothing reads them for a real NPU.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenvl_rbln.artifacts.manifest import RBLN_CONFIG_NAME, graph_hash
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.profiling.compare import compare, roofline_seconds
from qwenvl_rbln.profiling.graphs import Graph, Shapes, contexts, discover, synthetic_inputs
from qwenvl_rbln.profiling.timer import time_call
from qwenvl_rbln.tuning.fit import fit_quadratic
from qwenvl_rbln.tuning.measured import SPREAD, check_writable, entry_key, write_entry

if TYPE_CHECKING:
    from qwenvl_rbln.artifacts.checked import CheckedArtifact


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
    """The rebel and optimum-rbln versions an entry is keyed by. rebel's from its package metadata (what pip
    installed: ``rebel-compiler``), since no upstream source shows a ``rebel.__version__``; the emulator, which is
    no installed package, says its own (``0.12.0+qvl.emulated``)."""
    from qwenvl_rbln.artifacts.manifest import NOT_INSTALLED, collect_versions

    installed = collect_versions()
    version = installed["rebel-compiler"]
    if getattr(rebel, "EMULATED", False) or version == NOT_INSTALLED:
        version = str(getattr(rebel, "__version__", None) or "unknown")
    return {"rebel": version, "optimum_rbln": installed["optimum-rbln"]}


def _load(opts: ProfileOptions) -> tuple[CheckedArtifact, dict[str, Any]]:
    """The artifact's files, read once (the manifest now, rbln_config.json when ``discover`` parses it), and the
    placement it was compiled for."""
    from qwenvl_rbln.artifacts.checked import CheckedArtifact

    art = opts.directory
    if opts.check is not None and not (math.isfinite(opts.check) and opts.check >= 0):
        raise InputError(f"--check {opts.check}: not a tolerance", "pass a finite TOL >= 0, e.g. --check 0.5 (+-50 %)")
    if not art.is_dir():
        raise InputError(f"artifact directory {art} does not exist", "pass the directory `qvl compile` wrote")
    files = CheckedArtifact(root=art, kind="rbln", cfg={}, manifest=None)  # cfg: discover's own refusals
    manifest = files.load_manifest()
    if (manifest or {}).get("emulated") and not opts.emulate:
        raise InputError(f"{art} was compiled on the CPU emulator", f"profile it with `qvl profile {art} --emulate`")
    return files, (manifest or {}).get("placement") or {"device": 0, "visual_device": 0}


def _intact(files: CheckedArtifact, graphs: list[Graph]) -> str:
    """Refuse what would record wrong figures under a good key: a graph file that is not there, or any file changed
    since compile (the manifest's sha256, the check load-check and serve run; the files read already are compared
    from their bytes). Returns the manifest's verdict."""
    from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME
    from qwenvl_rbln.jobs.load_check_fixes import recompile_command

    art, manifest = files.root, files.manifest
    fix = f"restore it, or recompile with `{recompile_command(art, manifest)}`"
    for g in graphs:
        if not (art / g.file).is_file():
            raise InputError(f"{art}: {g.file} is missing (the compiled graph of {g.key})",
                             f"{fix}; `qvl load-check {art} --no-runtime` lists every problem")  # fmt: skip
    if manifest is None:
        return f"no {MANIFEST_NAME} (not compiled by qvl): edits after compile cannot be detected"
    verdict = files.verify()
    bad = verdict["modified"] + verdict["missing"] + verdict["unsafe"]
    if bad:
        raise InputError(
            f"{art}: {', '.join(bad[:4])} changed or missing since compile (sha256 differs from {MANIFEST_NAME}); "
            "its timings would be recorded under the compiled graphs' key",
            f"{fix.replace('restore it', 'restore the files')}; `qvl load-check {art} --no-runtime` lists every "
            "difference",
        )
    return f"{len(manifest.get('files') or {})} files match {MANIFEST_NAME}"


def run_profile(opts: ProfileOptions) -> dict[str, Any]:
    """Time every graph, fit, compare, and (``save``) write the entry; the document ``--json`` prints."""
    from qwenvl_rbln.backends import emulator
    from qwenvl_rbln.tuning.measured import timings_path

    files, placement = _load(opts)
    art, manifest = opts.directory, files.manifest
    device, visual_device = int(placement.get("device") or 0), int(placement.get("visual_device") or 0)
    graphs, shapes = discover(art, device, visual_device, raw=files.raw(RBLN_CONFIG_NAME))
    if opts.only:
        graphs = [g for g in graphs if g.kind in opts.only or g.key in opts.only]
        if not graphs:
            raise InputError(f"--only {', '.join(opts.only)} names no graph of {art}", "name vit, prefill, decoder or "
                             "a graph key that `qvl profile --json` lists")  # fmt: skip
    integrity = _intact(files, graphs)
    ghash = graph_hash(art, manifest)
    with emulator.active() if opts.emulate else contextlib.nullcontext():
        rebel = _import_rebel()
        npu = str(rebel.get_npu_name(graphs[0].device if graphs else 0) or "unknown")
        roof, mkey = _roofline(art, npu, shapes)
        versions = _versions(rebel)
        key = entry_key(npu, versions["rebel"], versions["optimum_rbln"], ghash)
        if opts.save:  # a file or an entry that cannot take the new figures is refused before any is measured
            check_writable(key, emulated=opts.emulate)
        timed = [_time_graph(rebel, art, g, shapes, opts) for g in graphs]
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
    path, kept = write_entry(key, entry, emulated=opts.emulate) if opts.save else (None, [])
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
        "manifest": integrity,
        "timings_file": str(path) if path else None,
        "kept_graphs": kept,  # timed before into this entry and not now (--only): kept, each with its own date
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
