"""Will this artifact load, where, and does it fit? Then create the runtimes. Returns the report as data.

Steps (``qvl load-check`` renders them as tables or ``--json``):

1. layout: the files optimum-rbln 0.12 loads, derived from the artifact's own rbln_config.json
   (``prefill.rbln``, one ``decoder_batch_N.rbln`` per ``decoder_batch_sizes`` entry,
   ``visual/compiled_model.rbln``, ``torch_artifacts.pth``, config, processor and tokenizer files), extra
   ``.rbln`` files, and every file's sha256 against ``qvl-manifest.json`` (edits/truncation after compile);
2. target: NPU and num_devices from ``_compile_cfgs``;
3. placement: the requested ``--device`` / ``--visual-device`` against the placement recorded at compile
   (``placement.check_placement``);
4. memory per device: exact allocations from the compiled graphs when ``rebel`` is importable, the memory
   planner's estimate otherwise;
5. runtime: ``from_pretrained(DIR, export=False, rbln_config={"visual": {"device": V}, "device": D})``
   (transformers on CPU for torch artifacts) unless ``no_runtime``; with no_runtime and optimum-rbln
   installed the load still runs with ``create_runtimes: False``, which validates the config without the NPU.

Processor files whose caps let inputs past the largest compiled ViT bucket (an artifact saved outside qvl) are
warnings (``processor``: file, key, the inputs that would fail; ``qvl fix-processor DIR`` rewrites them).

Exit codes of the returned error: 2 layout or placement problems (and processor warnings under ``strict``); 3
optimum-rbln/torch missing for the runtime step; 4 does not fit (``Lack of device memory`` at runtime creation, or
the memory check says so when no runtime was created, or says ``uncertain`` without ``uncertain_ok``, as a dry
run); 5 the backend failed otherwise. Heavy imports (torch, optimum, rebel) stay inside the backends.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts.layout import QWEN3_VL_MOE_CONFIG_CLS
from qwenvl_rbln.errors import DoesNotFit, InputError, QvlError
from qwenvl_rbln.jobs.load_check_fixes import add_apply, check_flags, gate_hint, recompile_command
from qwenvl_rbln.jobs.processor_fix import processor_part, strict_error
from qwenvl_rbln.memory.placement import check_placement, vit_shares_a_device
from qwenvl_rbln.paths import user_path

Progress = Callable[[int, int], None]
"""Called with (files, bytes) before the manifest's sha256 check, which reads every file."""


def resolve_request(
    directory: Path | None, preset: str | None, notify: Callable[[str], None]
) -> tuple[Path, dict[str, Any] | None]:
    """The directory to check and the placement fallback: with no DIR, exactly the rule `qvl infer` follows
    (``inference.target.default_directory``; its notes go to ``notify``); the preset's placement is the
    fallback when the artifact records none."""
    if directory is None:
        from qwenvl_rbln.inference.target import default_directory

        directory, used, notes = default_directory(preset, [], command="load-check")
        for line in notes:
            notify(line)
        preset = preset or used
    if preset is None:
        return directory, None
    from qwenvl_rbln.planning.plan import build_plan

    plan = build_plan(preset)
    return directory, {"preset": plan.preset, "placement": plan.placement}


def _emulated() -> bool:
    from qwenvl_rbln.backends import emulator

    return emulator.is_active()


# ------------------------------------------------------------------------------------ layout and target


def _read_config(root: Path, emulate: bool) -> tuple[str, dict[str, Any]]:
    """The artifact's kind and config; an rbln artifact switches the emulator on or off as asked."""
    from qwenvl_rbln.artifacts.layout import read_artifact_config
    from qwenvl_rbln.backends.rbln import optimum as rbln_backend

    kind, cfg = read_artifact_config(root)
    if emulate and kind != "rbln":
        raise InputError(
            f"--emulate emulates the NPU backend, but {root} is a {kind}-backend artifact (nothing to emulate)",
            "drop --emulate",
        )
    if kind == "rbln":
        rbln_backend.use_emulator(emulate)
    return kind, cfg


def _announce(manifest: dict[str, Any] | None, progress: Progress | None) -> None:
    if manifest is None or progress is None:
        return
    entries = list((manifest.get("files") or {}).values())
    # a hostile or damaged manifest may hold anything here; verify_manifest reports it, this only counts
    total = sum(f["size"] for f in entries if isinstance(f, dict) and type(f.get("size")) is int)
    progress(len(entries), total)


def _layout(
    root: Path, kind: str, cfg: dict[str, Any], manifest: dict[str, Any] | None
) -> tuple[dict[str, Any], QvlError | None]:
    """Files and hashes; for rbln also the guard (emulated vs real graphs, tampered graphs, optimum-rbln version)."""
    from qwenvl_rbln.artifacts.layout import check_layout
    from qwenvl_rbln.backends.rbln import optimum as rbln_backend

    layout = check_layout(root, kind, cfg, manifest, processor=False)  # processor caps: warnings, below
    guard = None
    if kind == "rbln" and not layout["missing"]:
        guard = rbln_backend.artifact_problem(root, cfg, manifest, layout["graphs"])
        if guard is not None:
            layout["problems"].insert(0, guard.message)
            layout["ok"] = False
    if _emulated() and kind == "rbln":
        layout["notes"].append("emulated: loaded through qvl's CPU emulator of rebel (no NPU)")
    return layout, guard


def _unknown_npus(target: dict[str, Any]) -> list[str]:
    """A target NPU that optimum-rbln would refuse (``Unknown npu name``) is a problem of the artifact."""
    from qwenvl_rbln.planning.catalogue.devices import npu_spec

    problems = []
    for key in ("npu", "visual_npu"):
        name = target.get(key)
        if not name or (key == "visual_npu" and name == target.get("npu")):
            continue
        try:
            npu_spec(name)
        except InputError:
            where = "visual " if key == "visual_npu" else ""
            problems.append(f"{where}graphs were compiled for an unknown NPU {name!r} (optimum-rbln: Unknown npu name)")
    return problems


def _moe_line(root: Path) -> str:
    """The MoE numbers of the artifact's own config.json (ViT depth, out_hidden_size, experts), for the summary."""
    from qwenvl_rbln.artifacts.layout import read_json
    from qwenvl_rbln.planning.catalogue.modelinfo import geometry_from_config, moe_summary

    try:
        return moe_summary(geometry_from_config(read_json(root / "config.json"), root.name, "config.json")) or ""
    except QvlError as exc:
        return f"Qwen3-VL-MoE ({exc.message})"


def _target(
    cfg: dict[str, Any], manifest: dict[str, Any] | None, layout: dict[str, Any], device_memory: str | None
) -> dict[str, Any]:
    """NPU and num_devices; its problems are layout problems. A --device-memory above the card: exit 2."""
    from qwenvl_rbln.artifacts.layout import compile_target

    target = compile_target(cfg, manifest)
    target["problems"].extend(_unknown_npus(target))
    if device_memory is not None and not target["problems"] and target.get("npu"):
        from qwenvl_rbln.memory.report import parse_device_memory
        from qwenvl_rbln.planning.catalogue.devices import npu_spec

        parse_device_memory(device_memory, npu_spec(target["npu"]))  # above this card's DRAM: exit 2, as a dry run
    layout["problems"].extend(target["problems"])
    if target["problems"]:
        layout["ok"] = False
    return target


# ------------------------------------------------------------------------------------------------ memory


def _planner_estimate(
    root: Path, kind: str, cfg: dict[str, Any], npu: str | None, placement: dict[str, Any], device_memory: str | None
) -> dict[str, Any]:
    from qwenvl_rbln.artifacts.layout import read_json, resolved_from_rbln_config
    from qwenvl_rbln.memory import planner
    from qwenvl_rbln.planning.catalogue.devices import npu_spec
    from qwenvl_rbln.planning.catalogue.modelinfo import geometry_from_config

    notes = []
    if not npu:
        npu = "RBLN-CR13"
        notes.append("target NPU not recorded in the artifact; estimated for RBLN-CR13 (Rebel100)")
    try:
        spec = npu_spec(npu)
        geometry = geometry_from_config(
            read_json(root / "config.json"), name=root.name, source=str(root / "config.json")
        )
        resolved = resolved_from_rbln_config(cfg)
        report = planner.estimate(
            geometry,
            resolved,
            spec,
            placement,
            device_memory=device_memory,
            dtype_bytes=2 if kind == "rbln" else geometry.dtype_bytes,
        ).to_dict()
    except QvlError as exc:
        return {"source": "unavailable", "fits": None, "devices": [], "reason": exc.one_line(), "problem": exc.message}
    out = {"source": "estimate", **report}
    out["notes"] = list(report.get("notes") or []) + notes
    return out


def memory_for_placement(
    root: Path,
    kind: str,
    cfg: dict[str, Any],
    layout: dict,
    target: dict,
    placement: dict,
    device_memory: str | None,
    refused: bool = False,
) -> dict[str, Any]:
    """Exact (or emulated) allocations when rebel is importable, with the planner's estimate beside; else the
    estimate alone."""
    from qwenvl_rbln.backends.rbln import device_memory as rbln_memory
    from qwenvl_rbln.planning.catalogue.devices import npu_spec

    estimate = _planner_estimate(root, kind, cfg, target.get("npu"), placement, device_memory)
    if kind == "rbln" and not layout["missing"] and not refused and rbln_memory.import_rebel() is not None:
        try:
            spec = npu_spec(target["npu"]) if target.get("npu") else None
        except InputError:
            spec = None
        exact = rbln_memory.read_allocations(root, layout["graphs"], placement, spec)
        exact = _with_device_memory(exact, device_memory)
        if exact is not None and _emulated():
            exact["source"] = "emulated"
            exact["method"] = (
                "qvl's CPU emulator: byte sizes of each emulated graph's tensors (Weight: constants, IOBuffer: "
                "inputs and outputs, DramTensor: the KV cache), never NPU figures; the planner's estimate is beside"
            )
            exact["estimate"] = estimate
            return exact
        if exact is not None:
            exact["suggestions"] = estimate.get("suggestions") or []
            exact["estimate_fits"] = estimate.get("fits")
            return exact
    return estimate


def _with_device_memory(exact: dict[str, Any] | None, device_memory: str | None) -> dict[str, Any] | None:
    """The allocations judged against --device-memory when given (the same usable bytes the estimate uses), each
    chiplet its even share, as optimum-rbln splits a card."""
    if exact is None or device_memory is None:
        return exact
    from qwenvl_rbln.memory.report import parse_device_memory

    usable = parse_device_memory(device_memory)
    verdicts = []
    for dev in exact["devices"]:
        chips = dev.get("per_chiplet_bytes") or []
        per_chip = usable // max(1, len(chips))
        dev["usable_bytes"], dev["usable_per_chiplet_bytes"] = usable, per_chip
        dev["fits"] = dev["total_bytes"] <= usable and all(c <= per_chip for c in chips)
        verdicts.append(dev["fits"])
    exact["fits"] = all(verdicts) if verdicts else None
    exact["usable_source"] = "--device-memory"
    return exact


def calibration_from_exact(root: Path, cfg: dict[str, Any], exact: dict[str, Any]) -> dict[str, Any]:
    """Workspace per graph from exact allocations, in the planner's calibration keys.

    Assumption (stated in each record): a graph's workspace is its non-KV allocation (every key but
    ``DramTensor``) less the weights it holds; the LM weights are shared by its graphs (optimum-rbln compiles
    them with weight sharing), so they are taken out once, from the first LM graph big enough to hold them.
    """
    from qwenvl_rbln.artifacts.layout import read_json, resolved_from_rbln_config
    from qwenvl_rbln.memory import calibration as cal
    from qwenvl_rbln.memory.params import lm_params, vision_params
    from qwenvl_rbln.planning.catalogue.modelinfo import geometry_from_config

    geometry = geometry_from_config(read_json(root / "config.json"), name=root.name, source=str(root))
    keys = cal.graph_keys(resolved_from_rbln_config(cfg))
    lm_weights = lm_params(geometry.text)["device"] * 2
    vit_weights = vision_params(geometry.vision)["device"] * 2
    records: dict[str, Any] = {}
    for name, graph in (exact.get("graphs") or {}).items():
        by_key = graph.get("by_key") or {}
        non_kv = sum(v for k, v in by_key.items() if k != "DramTensor")
        key = "visual" if graph.get("submodule") == "visual" else name
        if key not in keys:
            continue
        if key == "visual":
            weights = min(vit_weights, non_kv)
        elif lm_weights and non_kv >= lm_weights:
            weights, lm_weights = lm_weights, 0
        else:
            weights = 0
        records[keys[key]] = {
            "workspace_bytes": int(non_kv - weights),
            "non_kv_bytes": int(non_kv),
            "weights_subtracted": int(weights),
            "graph": name,
            "method": "non-KV allocation minus planner weights (bf16)",
        }
    return {"model": geometry, "records": records}


def _calibrate(root: Path, cfg: dict[str, Any], memory: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    """--calibrate: record the exact per-graph workspaces so later estimates use them."""
    from qwenvl_rbln.memory import calibration as cal

    if memory.get("source") == "emulated":
        return {"recorded": False, "reason": "emulated sizes are not NPU figures; calibrate on an RBLN host"}
    if memory.get("source") != "exact":
        return {"recorded": False, "reason": "exact allocations need rebel-compiler on this host (rbln artifacts)"}
    found = calibration_from_exact(root, cfg, memory)
    if not found["records"] or not target.get("npu"):
        return {"recorded": False, "reason": "no graph allocations or no target NPU in the artifact"}
    path = cal.record(found["records"], model=found["model"], npu=target["npu"])
    return {"recorded": True, "path": str(path), "entries": found["records"]}


# ----------------------------------------------------------------------------------------------- runtime


def _failed(head: dict[str, Any], error: str, exc: QvlError, **tail: Any) -> dict[str, Any]:
    """A runtime step that failed: its error line, exit code and the exception (popped before reporting)."""
    return {**head, "error": error, "exit_code": exc.exit_code, "exc": exc, **tail}


def _torch_runtime(root: Path, no_runtime: bool) -> dict[str, Any]:
    from qwenvl_rbln.backends import torch_ref_compile
    from qwenvl_rbln.errors import BackendError, DependencyMissing

    if no_runtime:
        return {"attempted": False, "ok": None, "reason": "--no-runtime"}
    try:
        return torch_ref_compile.load_model(root, create_runtimes=True)
    except (DependencyMissing, BackendError) as exc:
        return _failed({"attempted": True, "ok": False}, exc.one_line(), exc)


def _rbln_runtime(root: Path, requested: dict[str, Any], no_runtime: bool, model_cls: Any) -> dict[str, Any]:
    import time

    from qwenvl_rbln.backends.rbln import optimum as rbln_backend
    from qwenvl_rbln.errors import BackendError, DependencyMissing

    cfg = rbln_backend.load_rbln_config(requested["device"], requested["visual_device"], create_runtimes=not no_runtime)
    if model_cls is None and rbln_backend.missing_dependencies():
        missing = " and ".join(rbln_backend.missing_dependencies())
        if no_runtime:
            return {
                "attempted": False,
                "ok": None,
                "rbln_config": cfg,
                "reason": f"--no-runtime; {missing} not installed, so only qvl's own checks ran",
            }
    if no_runtime and _emulated():  # the emulator validates nothing optimum-rbln's own checks would not: no load
        return {
            "attempted": False,
            "ok": None,
            "rbln_config": cfg,
            "reason": "--no-runtime; emulated: the model was not loaded",
        }
        err = DependencyMissing(
            f"{missing} not installed, so the runtimes cannot be created here",
            rbln_backend.install_hint(rbln_backend.missing_dependencies()),
        )
        return _failed({"attempted": False, "ok": False, "rbln_config": cfg}, err.one_line(), err)
    head = {"attempted": True, "ok": False, "create_runtimes": not no_runtime, "rbln_config": cfg}
    t0 = time.monotonic()
    try:
        rbln_backend.load_model(
            root, requested["device"], requested["visual_device"], create_runtimes=not no_runtime, model_cls=model_cls
        )
    except DoesNotFit as exc:
        return _failed(head, getattr(exc, "raw", exc.message), exc, lack_of_device_memory=True)
    except (DependencyMissing, BackendError) as exc:
        return _failed(head, exc.one_line(), exc)
    return {
        **head,
        "ok": True,
        "seconds": max(round(time.monotonic() - t0, 3), 0.001),  # a load under 0.5 ms (a fake's) is not 0 s
        "note": (
            "runtimes created on the NPU"
            if not no_runtime
            else "loaded with create_runtimes=False: optimum-rbln validated files and config, no NPU memory was used"
        ),
    }


def _runtime(root: Path, kind: str, placement: dict[str, Any], no_runtime: bool, model_cls: Any) -> dict[str, Any]:
    """Create the runtimes (or the torch model). Returns a dict; errors are returned as 'error' + exit code."""
    if kind == "torch":
        return _torch_runtime(root, no_runtime)
    return _rbln_runtime(root, placement["requested"], no_runtime, model_cls)


# ------------------------------------------------------------------------------------------------ verdict


def _blocked(
    root: Path, layout: dict, placement: dict, guard: QvlError | None, manifest: dict | None
) -> tuple[dict[str, Any], QvlError]:
    """Layout or placement problems: no runtime is tried, the first problem is the error."""
    from qwenvl_rbln.artifacts.layout import describe_layout_problem

    if not layout["ok"]:
        runtime: dict[str, Any] = {"attempted": False, "ok": None, "reason": "layout problems (fix them first)"}
        return runtime, guard or InputError(
            f"{root}: {describe_layout_problem(layout)}",
            f"recompile with `{recompile_command(root, manifest)}` (or restore the files); the report (or --json's "
            "layout) lists every problem",
        )
    runtime = {"attempted": False, "ok": None, "reason": "placement problems"}
    return runtime, InputError(placement["problems"][0], "pass one device id per compiled device (num_devices)")


def _lack_of_memory(runtime: dict, memory: dict, placement: dict, layout: dict) -> DoesNotFit:
    """optimum-rbln said ``Lack of device memory``: which device, which graphs, and the fixes."""
    from qwenvl_rbln.backends.rbln import device_memory as rbln_memory
    from qwenvl_rbln.backends.rbln import optimum as rbln_backend

    diag = rbln_memory.lack_of_memory_diagnosis(
        runtime.get("error") or "", memory, placement["requested"], layout["graphs"], memory
    )
    applies = [s for s in memory.get("suggestions") or [] if isinstance(s, dict) and s.get("apply")]
    diag["recompile"] = [s["apply"] for s in applies if not s.get("apply_placement")]  # with -o DIR
    runtime["diagnosis"] = diag
    hint = gate_hint(memory) or diag["hint"]
    return DoesNotFit(f"runtime creation failed, {rbln_backend.LACK_OF_MEMORY} ({diag['summary']})", hint)


def _does_not_fit(root: Path, memory: dict, placement: dict) -> DoesNotFit:
    """No runtime was created and the memory check says the placement does not fit."""
    from qwenvl_rbln.backends.rbln import device_memory as rbln_memory

    where = rbln_memory.over_devices_text(memory)
    return DoesNotFit(
        f"{root} does not fit the requested placement ({memory.get('source')} memory: {where or 'over capacity'})",
        _fix(memory, placement),
    )


def _fix(memory: dict, placement: dict) -> str:
    """The gate's fix: the commands that apply the suggestions (load_check_fixes.gate_hint), else general advice."""
    from qwenvl_rbln.backends.rbln import device_memory as rbln_memory

    hint = gate_hint(memory)
    return hint or rbln_memory.fix_hint([], [], vit_shares_a_device=vit_shares_a_device(placement["requested"]))


def _uncertain(root: Path, memory: dict, placement: dict) -> DoesNotFit:
    """The estimate cannot tell (verdict uncertain) and no runtime proved it: the dry run's gate, exit 4."""
    from qwenvl_rbln.memory.verdicts import gate_message

    fix = _fix(memory, placement)
    return DoesNotFit(
        f"{root}: " + gate_message(memory).replace("--uncertain-ok accepts it", "loading may fail"),
        f"{fix}; or pass --uncertain-ok to accept the risk (as `qvl compile --dry-run` does)",
    )


def _run_and_judge(
    root: Path,
    kind: str,
    layout: dict,
    placement: dict,
    memory: dict,
    no_runtime: bool,
    model_cls: Any,
    uncertain_ok: bool = False,
) -> tuple[dict[str, Any], Exception | None]:
    """Create the runtimes, then the verdict: a runtime failure, a predicted misfit, an uncertain estimate without
    --uncertain-ok, or none."""
    runtime = _runtime(root, kind, placement, no_runtime, model_cls)
    exc = runtime.pop("exc", None)
    real_runtime = (
        kind == "rbln" and runtime.get("ok") is True and bool(runtime.get("create_runtimes")) and not _emulated()
    )
    estimate = memory.get("estimate") if memory.get("source") == "emulated" else None
    misfit = memory if memory.get("fits") is False else estimate if (estimate or {}).get("fits") is False else None
    judged = estimate if estimate is not None else memory
    unsure = judged if judged.get("source") == "estimate" and judged.get("verdict") == "uncertain" else None
    error: Exception | None = None
    if runtime.get("lack_of_device_memory"):
        error = _lack_of_memory(runtime, memory, placement, layout)
    elif exc is not None:
        error = exc
    elif misfit is not None and not real_runtime:  # never "ok" after "does not fit"
        error = _does_not_fit(root, misfit, placement)
    elif unsure is not None and not real_runtime and not uncertain_ok:  # the dry run's gate: never "ok" here
        error = _uncertain(root, unsure, placement)
    elif memory.get("fits") is False and real_runtime:
        memory.setdefault("notes", []).append(
            "the runtimes were created although the memory check predicted otherwise; `qvl load-check` results "
            "on hardware beat estimates"
        )
    if real_runtime:
        _record_load(root, runtime)
    return runtime, error


def _record_load(root: Path, runtime: dict[str, Any]) -> None:
    """Keep the measured load (``qvl deploy`` sizes its startup probe from it); a damaged file is only a note. The
    report carries the graphs' hash beside the seconds, so ``qvl deploy --load-check`` uses it for these graphs only."""
    from qwenvl_rbln.artifacts.load_times import record_load
    from qwenvl_rbln.artifacts.manifest import graph_hash, read_manifest

    try:
        runtime["graph_hash"] = graph_hash(root, read_manifest(root))
        where = record_load(root, runtime["seconds"], key=runtime["graph_hash"])
        runtime["recorded"] = str(where)
    except (QvlError, OSError) as exc:
        runtime["recorded"] = None
        runtime["record_problem"] = str(getattr(exc, "message", exc))


# --------------------------------------------------------------------------------------------------- entry


def _accepted(memory: dict[str, Any], uncertain_ok: bool, error: Exception | None) -> list[str]:
    """What passed only because a flag accepted it (the last line and --json say so)."""
    judged = memory.get("estimate") if memory.get("source") == "emulated" else memory
    if error is None and uncertain_ok and (judged or {}).get("verdict") == "uncertain":
        return ["memory uncertain at the estimate (accepted with --uncertain-ok)"]
    return []


def _check_device_memory(device_memory: str | None) -> None:
    """A typo in --device-memory is bad input, not a footnote under "ok" or an artifact problem."""
    if device_memory is not None:
        from qwenvl_rbln.memory.report import parse_device_memory

        parse_device_memory(device_memory)


def _report(root: Path, kind: str, parts: dict[str, Any], error: Exception | None) -> dict[str, Any]:
    """The report's fixed shape (``--json`` documents it): parts are layout, processor (warnings), target, placement,
    memory, runtime, and accepted (what passed only by a flag such as --uncertain-ok)."""
    return {
        "artifact_dir": str(root),
        "kind": kind,
        "emulated": kind == "rbln" and _emulated(),
        "ok": error is None,
        **parts,
        "exit_code": getattr(error, "exit_code", 0) if error else 0,
        "error": error.one_line() if hasattr(error, "one_line") else None,
    }


def run_load_check(
    directory: Path,
    *,
    device: Any = None,
    visual_device: Any = None,
    no_runtime: bool = False,
    device_memory: str | None = None,
    fallback: dict[str, Any] | None = None,
    model_cls: Any = None,
    calibrate: bool = False,
    emulate: bool = False,
    progress: Progress | None = None,
    uncertain_ok: bool = False,
    strict: bool = False,
) -> tuple[dict[str, Any], Exception | None]:
    """The whole check; returns (report, the error to raise after printing it, or None).

    ``emulate`` (or QVL_EMULATE_NPU=1): an rbln artifact is loaded through qvl's CPU emulator of rebel.
    ``uncertain_ok``: an uncertain estimate passes (else exit 4, as a dry run); ``strict``: processor-file warnings
    fail (exit 2).
    """
    from qwenvl_rbln.artifacts.manifest import read_manifest

    root = user_path(directory).absolute()
    _check_device_memory(device_memory)
    kind, cfg = _read_config(root, emulate)
    manifest = read_manifest(root)
    _announce(manifest, progress)
    layout, guard = _layout(root, kind, cfg, manifest)
    processor = processor_part(root, kind, cfg, manifest)
    target = _target(cfg, manifest, layout, device_memory)
    if cfg.get("cls_name") == QWEN3_VL_MOE_CONFIG_CLS:
        target["model_moe"] = _moe_line(root)  # its ViT and out_hidden_size are not the dense 2B's
    placement = check_placement(device, visual_device, manifest, target, fallback, cfg)
    requested = placement["requested"]
    memory = memory_for_placement(root, kind, cfg, layout, target, requested, device_memory, guard is not None)
    if layout["ok"] and memory.get("source") == "unavailable" and memory.get("problem"):
        # the artifact's own config cannot be read as optimum-rbln would (a bad value, a broken config.json)
        layout["problems"].append(memory["problem"])
        layout["ok"] = False
    if calibrate:
        memory["calibration"] = _calibrate(root, cfg, memory, target)
    flags = check_flags(no_runtime=no_runtime, device_memory=device_memory, emulate=emulate, strict=strict)
    add_apply(memory, manifest, root, placement["requested"], flags)  # before the verdict: its fix names them
    if not layout["ok"] or not placement["ok"]:
        runtime, error = _blocked(root, layout, placement, guard, manifest)
    else:
        runtime, error = _run_and_judge(root, kind, layout, placement, memory, no_runtime, model_cls, uncertain_ok)
    if error is None and strict and processor["warnings"]:
        error = strict_error(root, processor)
    if runtime.get("ok") is True and runtime.get("create_runtimes") and _emulated():
        runtime["note"] = "runtimes created on qvl's CPU emulator (emulated: no NPU memory was used)"
    parts: dict[str, Any] = {"layout": layout, "processor": processor, "target": target, "placement": placement}
    parts.update(memory=memory, runtime=runtime, accepted=_accepted(memory, uncertain_ok, error))
    return _report(root, kind, parts, error), error
