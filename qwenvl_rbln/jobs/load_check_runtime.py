"""load-check's last steps: create the runtimes (or load the torch model), then the verdict, with what failed and
why (lack of device memory: which device and which graphs; a predicted misfit; an uncertain estimate), and keep a
measured load for ``qvl deploy``.

Apart from ``load_check.py`` (the layout, target, placement and the report) because this is the part that touches the
backend and says what to do when it fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenvl_rbln.errors import DoesNotFit, InputError, QvlError
from qwenvl_rbln.jobs.load_check_fixes import gate_hint, recompile_command
from qwenvl_rbln.memory.placement import vit_shares_a_device

if TYPE_CHECKING:
    from qwenvl_rbln.artifacts.checked import CheckedArtifact


def _emulated() -> bool:
    from qwenvl_rbln.backends import emulator

    return emulator.is_active()


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


def blocked(
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


def run_and_judge(
    art: CheckedArtifact,
    layout: dict,
    placement: dict,
    memory: dict,
    no_runtime: bool,
    model_cls: Any,
    uncertain_ok: bool = False,
) -> tuple[dict[str, Any], Exception | None]:
    """Create the runtimes, then the verdict: a runtime failure, a predicted misfit, an uncertain estimate without
    --uncertain-ok, or none."""
    root, kind = art.root, art.kind
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
        _record_load(art, runtime)
    return runtime, error


def _record_load(art: CheckedArtifact, runtime: dict[str, Any]) -> None:
    """Keep the measured load (``qvl deploy`` sizes its startup probe from it); a damaged file is only a note. The
    report carries the graphs' hash beside the seconds, so ``qvl deploy --load-check`` uses it for these graphs only.
    The manifest and the target NPU are the ones read at the start, not read again."""
    from qwenvl_rbln.artifacts.load_times import record_load
    from qwenvl_rbln.artifacts.manifest import graph_hash

    try:
        runtime["graph_hash"] = graph_hash(art.root, art.manifest)
        where = record_load(art.root, runtime["seconds"], key=runtime["graph_hash"], art=art)
        runtime["recorded"] = str(where)
    except (QvlError, OSError) as exc:
        runtime["recorded"] = None
        runtime["record_problem"] = str(getattr(exc, "message", exc))
