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

from qwenvl_rbln.artifacts.checked import CheckedArtifact, read_artifact
from qwenvl_rbln.artifacts.layout import QWEN3_VL_MOE_CONFIG_CLS
from qwenvl_rbln.errors import InputError, QvlError
from qwenvl_rbln.jobs.load_check_fixes import add_apply, check_flags
from qwenvl_rbln.jobs.load_check_memory import memory_for_placement, record_calibration
from qwenvl_rbln.jobs.load_check_runtime import blocked, run_and_judge
from qwenvl_rbln.jobs.processor_fix import processor_part, strict_error
from qwenvl_rbln.memory.placement import check_placement
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


def _read_config(root: Path, emulate: bool) -> CheckedArtifact:
    """The artifact, read once (its kind, config, manifest, model config and processor files); an rbln artifact
    switches the emulator on or off as asked."""
    from qwenvl_rbln.backends.rbln import optimum as rbln_backend

    art = read_artifact(root)
    kind = art.kind
    if emulate and kind != "rbln":
        raise InputError(
            f"--emulate emulates the NPU backend, but {root} is a {kind}-backend artifact (nothing to emulate)",
            "drop --emulate",
        )
    if kind == "rbln":
        rbln_backend.use_emulator(emulate)
    return art


def _announce(manifest: dict[str, Any] | None, progress: Progress | None) -> None:
    if manifest is None or progress is None:
        return
    entries = list((manifest.get("files") or {}).values())
    # a hostile or damaged manifest may hold anything here; verify_manifest reports it, this only counts
    total = sum(f["size"] for f in entries if isinstance(f, dict) and type(f.get("size")) is int)
    progress(len(entries), total)


def _layout(art: CheckedArtifact) -> tuple[dict[str, Any], QvlError | None]:
    """Files and hashes; for rbln also the guard (emulated vs real graphs, tampered graphs, optimum-rbln version)."""
    from qwenvl_rbln.artifacts.layout import check_layout
    from qwenvl_rbln.backends.rbln import optimum as rbln_backend

    root, kind, cfg, manifest = art.root, art.kind, art.cfg, art.manifest
    # processor caps: warnings, below; the files read already are hashed from the bytes read
    layout = check_layout(root, kind, cfg, manifest, processor=False, read=art.read, known=art.known)
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


def _moe_line(art: CheckedArtifact) -> str:
    """The MoE numbers of the artifact's own config.json (ViT depth, out_hidden_size, experts), for the summary."""
    from qwenvl_rbln.planning.catalogue.modelinfo import geometry_from_config, moe_summary

    try:
        return moe_summary(geometry_from_config(art.model_config, art.root.name, "config.json")) or ""
    except QvlError as exc:
        return f"Qwen3-VL-MoE ({exc.message})"


def _target(art: CheckedArtifact, layout: dict[str, Any], device_memory: str | None) -> dict[str, Any]:
    """NPU and num_devices; its problems are layout problems. A --device-memory above the card: exit 2."""
    target = art.target
    target["problems"].extend(_unknown_npus(target))
    if device_memory is not None and not target["problems"] and target.get("npu"):
        from qwenvl_rbln.memory.report import parse_device_memory
        from qwenvl_rbln.planning.catalogue.devices import npu_spec

        parse_device_memory(device_memory, npu_spec(target["npu"]))  # above this card's DRAM: exit 2, as a dry run
    layout["problems"].extend(target["problems"])
    if target["problems"]:
        layout["ok"] = False
    return target


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
    root = user_path(directory).absolute()
    _check_device_memory(device_memory)
    art = _read_config(root, emulate)  # the one read of rbln_config.json, the manifest and the small JSON files
    kind, cfg, manifest = art.kind, art.cfg, art.manifest
    _announce(manifest, progress)
    layout, guard = _layout(art)
    processor = processor_part(root, kind, cfg, manifest, read=art.read)
    target = _target(art, layout, device_memory)
    if cfg.get("cls_name") == QWEN3_VL_MOE_CONFIG_CLS:
        target["model_moe"] = _moe_line(art)  # its ViT and out_hidden_size are not the dense 2B's
    placement = check_placement(device, visual_device, manifest, target, fallback, cfg)
    requested = placement["requested"]
    memory = memory_for_placement(root, kind, cfg, layout, target, requested, device_memory, guard is not None, art=art)
    if layout["ok"] and memory.get("source") == "unavailable" and memory.get("problem"):
        # the artifact's own config cannot be read as optimum-rbln would (a bad value, a broken config.json)
        layout["problems"].append(memory["problem"])
        layout["ok"] = False
    if calibrate:
        memory["calibration"] = record_calibration(root, cfg, memory, target, art)
    flags = check_flags(no_runtime=no_runtime, device_memory=device_memory, emulate=emulate, strict=strict)
    add_apply(memory, manifest, root, placement["requested"], flags)  # before the verdict: its fix names them
    if not layout["ok"] or not placement["ok"]:
        runtime, error = blocked(root, layout, placement, guard, manifest)
    else:
        runtime, error = run_and_judge(art, layout, placement, memory, no_runtime, model_cls, uncertain_ok)
    if error is None and strict and processor["warnings"]:
        error = strict_error(root, processor)
    if runtime.get("ok") is True and runtime.get("create_runtimes") and _emulated():
        runtime["note"] = "runtimes created on qvl's CPU emulator (emulated: no NPU memory was used)"
    parts: dict[str, Any] = {"layout": layout, "processor": processor, "target": target, "placement": placement}
    parts.update(memory=memory, runtime=runtime, accepted=_accepted(memory, uncertain_ok, error))
    return _report(root, kind, parts, error), error
