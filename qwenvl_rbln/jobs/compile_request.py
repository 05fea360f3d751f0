"""What `qvl compile` decides around the compile itself: the plan, the dry run's CI gate, and the refusals that
must come before a long compile. Returns data or raises from ``errors``; prints nothing (the command renders)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import DoesNotFit, InputError


def plan_for_compile(preset: str, sets: list[str] | None, model: str | None, output: str | None) -> Any:
    """The validated plan; an empty -o is refused first (typer would read '' as '.', the working directory)."""
    from qwenvl_rbln.planning.plan import build_plan

    if output is not None and not output.strip():
        raise InputError("-o/--output is empty", "pass the artifact directory, e.g. -o qvl-out/my-model")
    return build_plan(preset, sets, model=model, output_dir=output)


def refuse_multi_device(plan: Any, force: bool) -> None:
    """num_devices > 1 on a Rebel100: refused (exit 2) before a dry run or a compile, unless --force."""
    from qwenvl_rbln.planning.catalogue.multi_device import multi_device_refusal

    r = plan.resolved
    refusal = multi_device_refusal(plan.npu, r.num_devices, r.visual_num_devices, f"preset {plan.preset}")
    if refusal is not None and not force:
        raise refusal


def dry_run_gate(memory: dict[str, Any], uncertain_ok: bool, as_json: bool) -> DoesNotFit | None:
    """A dry run is also a CI gate: exit 4 when it would not fit, and when the planner cannot tell (verdict
    uncertain) unless --uncertain-ok accepts that. None when the plan may load."""
    from qwenvl_rbln.memory.verdicts import fit_hint, gate_message, gate_stops

    if not gate_stops(memory.get("verdict"), uncertain_ok):
        return None

    where = "in the JSON's memory.suggestions" if as_json else "above"
    return DoesNotFit(
        "dry run: " + gate_message(memory).replace("predicts this", "predicts this configuration"),
        fit_hint(memory, where),
    )


def refuse_before_compile(plan: Any, *, emulate: bool, force: bool, dry_run: bool = False) -> list[str]:
    """The refusals that need no model, run by a dry run and the real compile alike, so a dry run that passes
    means the real run gets past them: --emulate on a torch preset, --emulate beside a real rebel, and an output
    path that is a file, an existing artifact without --force, or (with --force) a directory that is not one.

    A dry run writes nothing, so an occupied output directory without --force is not refused there: it returns
    the one warning saying what the real compile would need (the plan and verdict still print). Returns the
    warnings (none for a real compile)."""
    from qwenvl_rbln.artifacts.staging import check_target, non_empty_dir
    from qwenvl_rbln.backends import emulator
    from qwenvl_rbln.paths import user_path

    if emulate and plan.backend != "rbln":
        raise InputError(
            f"--emulate emulates the NPU backend, but preset {plan.preset} uses backend {plan.backend} "
            "(nothing to emulate)",
            "drop --emulate, or compile an rbln preset such as --preset cpu-tiny-rbln --emulate",
        )
    if plan.backend == "rbln" and emulator.requested(emulate) and emulator.real_rebel_importable():
        emulator.activate("--emulate" if emulate else "QVL_EMULATE_NPU=1")  # raises its one-line refusal
    target = user_path(plan.output_dir, "output_dir").absolute()
    if dry_run and not force and non_empty_dir(target):
        return [occupied_warning(target)]
    check_target(target, force)
    return []


def occupied_warning(target: Path) -> str:
    """What a real compile into the occupied ``target`` would need: --force for an artifact it may replace, -o for
    a directory of other files (which --force never replaces)."""
    from qwenvl_rbln.artifacts.staging import replace_refusal

    lead = f"output directory {target} already exists and is not empty: a real compile would refuse it"
    refusal = replace_refusal(target)
    if refusal is not None:
        return f"{lead}, even with --force ({refusal[0]}); compile with -o DIR into a new directory"
    return f"{lead}; pass --force to replace it, or -o DIR to compile into a new directory"


def compile_for_real(
    plan: Any,
    memory: Any,
    *,
    emulate: bool,
    uncertain_ok: bool,
    force: bool,
    cache_dir: Path | None,
    use_cache: bool,
    as_json: bool,
    info: Callable[[str], None],
    warn: Callable[[str], None],
    watch: Any = None,
) -> dict[str, Any]:
    """The refusals, in this order, then the compile: an uncertain verdict (exit 4 before a long compile whose
    load the planner cannot vouch for), --emulate on a torch preset; then the emulator if asked."""
    from qwenvl_rbln.backends.rbln.optimum import use_emulator
    from qwenvl_rbln.jobs.compile_job import run_compile

    if memory.verdict == "uncertain" and not (uncertain_ok or force):
        from qwenvl_rbln.memory.verdicts import ensure_fits

        ensure_fits(memory)
    refuse_before_compile(plan, emulate=emulate, force=force)
    if plan.backend == "rbln":
        use_emulator(emulate)
    return run_compile(
        plan,
        memory,
        force=force,
        cache_dir=cache_dir,
        use_cache=use_cache,
        as_json=as_json,
        info=info,
        warn=warn,
        watch=watch,
    )
