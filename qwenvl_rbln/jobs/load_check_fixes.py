"""load-check's fixes as whole commands: load-check has no ``--set``, so each planner suggestion becomes the
command that applies it to the artifact being checked.

- A placement change is ``qvl load-check DIR --device D --visual-device V`` plus the user's own check flags
  (``--no-runtime``, ``--device-memory``, ...): the complete placement the planner re-estimated, never a lone
  ``--visual-device`` that would put the LM back on its default device next to the ViT.
- Anything else is a recompile of this artifact: ``qvl compile --preset P --set ... -o DIR --force`` (without
  ``-o`` it would rebuild the preset's default output folder instead).

The gate's one-line ``fix:`` hint names the same commands.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

HOW = "load-check has no --set: each line is the command that applies it"


def devices_text(value: Any) -> str:
    """A placement value as its flag's argument: 3 -> '3', [0, 1] -> '0,1'."""
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def check_flags(
    *, no_runtime: bool = False, device_memory: str | None = None, emulate: bool = False, strict: bool = False
) -> list[str]:
    """The user's own flags that shape the check, repeated in every load-check suggestion."""
    flags = ["--no-runtime"] if no_runtime else []
    if device_memory is not None:
        flags.append(f"--device-memory {shlex.quote(device_memory)}")
    return flags + ["--emulate"] * emulate + ["--strict"] * strict


def preset_name(manifest: dict[str, Any] | None) -> str | None:
    preset = (manifest or {}).get("preset")
    return preset.get("name") if isinstance(preset, dict) and isinstance(preset.get("name"), str) else None


def recompile_command(root: Path, manifest: dict[str, Any] | None, sets: str = "") -> str:
    """``qvl compile --preset P [--set ...] -o DIR --force``: rebuilds this artifact, not the preset's default."""
    parts = ["qvl compile --preset", shlex.quote(preset_name(manifest) or "PRESET"), sets, "-o", shlex.quote(str(root))]
    return " ".join(p for p in parts if p) + " --force"


def _placement_of(sug: dict[str, Any], requested: dict[str, Any]) -> dict[str, Any] | None:
    """The whole placement a placement-only suggestion was estimated with (None: it needs a recompile)."""
    names = {"placement.device": "device", "placement.visual_device": "visual_device"}
    pairs = [str(s).split("=", 1) for s in sug.get("set") or []]
    if not pairs or not all(len(kv) == 2 and kv[0] in names for kv in pairs):
        return None
    if isinstance(sug.get("placement"), dict):
        return {**requested, **sug["placement"]}
    from qwenvl_rbln.memory.placement import parse_device

    moved = {names[k]: parse_device(v.strip("[] "), f"--{names[k].replace('_', '-')}") for k, v in pairs}
    return {**requested, **moved}


def add_apply(
    memory: dict[str, Any], manifest: dict[str, Any] | None, root: Path, requested: dict[str, Any], flags: list[str]
) -> None:
    """Each suggestion's ``apply``: the command that applies it here (and ``apply_placement`` for a load flag)."""
    for report in (memory, memory.get("estimate") or {}):
        if not report.get("suggestions"):
            continue
        report["suggestions_how"] = HOW
        for sug in report["suggestions"]:
            if not isinstance(sug, dict) or not sug.get("set"):
                continue
            placement = _placement_of(sug, requested)
            if placement is None:
                sug["apply"] = recompile_command(
                    root, manifest, " ".join(f"--set {shlex.quote(str(x))}" for x in sug["set"])
                )
                continue
            sug["apply_placement"] = placement
            sug["apply"] = " ".join(
                [
                    "qvl load-check",
                    shlex.quote(str(root)),
                    f"--device {devices_text(placement['device'])}",
                    f"--visual-device {devices_text(placement['visual_device'])}",
                    *flags,
                ]
            )


def gate_hint(memory: dict[str, Any]) -> str | None:
    """The ``fix:`` of a gate error line from the applied suggestions: the first load-time placement (no
    recompile), then the first recompile; None when there is none."""
    applies = [s for s in memory.get("suggestions") or [] if isinstance(s, dict) and s.get("apply")]
    load = next((s for s in applies if s.get("apply_placement")), None)
    rebuild = next((s for s in applies if not s.get("apply_placement")), None)
    parts = []
    if load is not None:
        vis = devices_text(load["apply_placement"]["visual_device"])
        parts.append(
            f"load with `{load['apply']}` (the ViT on NPU {vis}, one the LM does not use; the id is an example)"
        )
    if rebuild is not None:
        parts.append(f"recompile this artifact with `{rebuild['apply']}`")
    return ", or ".join(parts) or None
