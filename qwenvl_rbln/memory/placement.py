"""Where an artifact's graphs load: ``--device`` / ``--visual-device`` parsed, and checked against the placement
recorded at compile. Pure data (no torch, no terminal); load-check, infer and serve share it.
"""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.errors import InputError


def parse_device(value: str | None, flag: str) -> int | list[int] | None:
    """'0' -> 0, '0,1' -> [0, 1]; InputError naming the flag otherwise."""
    if value is None:
        return None
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        ids = []
    if not ids or any(i < 0 for i in ids):
        raise InputError(
            f"{flag} {value!r} is not an NPU id", f"use {flag} 0 (or a list such as {flag} 0,1; see `rbln-smi`)"
        )
    if len(set(ids)) != len(ids):
        raise InputError(f"{flag} {value!r} repeats an NPU id", "list each NPU once")
    return ids[0] if len(ids) == 1 else ids


def device_list(value: Any) -> list[int]:
    """A placement value (one NPU id or a list of them) as a list; the planner and the allocation read-out share it."""
    return list(value) if isinstance(value, list) else [value]


def vit_shares_a_device(requested: dict[str, Any]) -> bool:
    """True when the ViT and the LM graphs are placed on at least one common NPU."""
    device = requested.get("device")
    return bool(set(device_list(device)) & set(device_list(requested.get("visual_device", device))))


def _requested(device: Any, visual_device: Any, compiled: dict | None, base: dict[str, Any]) -> tuple[Any, Any]:
    """The flags, else the compiled placement (a split ViT stays split when only --device is given)."""
    req_device = device if device is not None else base["device"]
    if visual_device is not None:
        req_visual = visual_device
    elif device is None or (compiled and compiled.get("visual_device") != compiled.get("device")):
        req_visual = base.get("visual_device", req_device)
    else:
        req_visual = req_device
    return req_device, req_visual


def check_placement(
    device: Any,
    visual_device: Any,
    manifest: dict[str, Any] | None,
    target: dict[str, Any],
    fallback: dict | None,
    cfg: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Requested placement vs. the one recorded at compile (qvl-manifest.json, else the preset)."""
    from qwenvl_rbln.artifacts.layout import placement_from_artifact

    compiled = None
    recorded = placement_from_artifact(cfg or {}, manifest)
    source = recorded.pop("source")
    if manifest and isinstance(manifest.get("placement"), dict):
        compiled = recorded
    elif fallback:
        compiled, source = dict(fallback["placement"]), f"preset {fallback['preset']}"
    req_device, req_visual = _requested(device, visual_device, compiled, compiled or recorded)
    problems: list[str] = []
    notes: list[str] = []
    for flag, value, n in (
        ("--device", req_device, target["num_devices"]),
        ("--visual-device", req_visual, target["visual_num_devices"]),
    ):
        if isinstance(value, list) and len(value) != n:
            problems.append(
                f"{flag} {','.join(map(str, value))} lists {len(value)} devices but the graphs were compiled for "
                f"num_devices={n} (optimum-rbln: the number of devices does not match num_devices)"
            )
    if compiled and (req_device != compiled.get("device") or req_visual != compiled.get("visual_device")):
        notes.append(
            f"placement differs from the one planned at compile ({source}: LM on {compiled.get('device')}, "
            f"visual on {compiled.get('visual_device')}); memory is checked for the requested one"
        )
    shared = sorted(set(device_list(req_device)) & set(device_list(req_visual)))
    if shared:
        notes.append(f"the ViT and the LM share device {shared[0]}: their graphs and the KV cache must fit one NPU")
    requested = {"device": req_device, "visual_device": req_visual}
    return {
        "requested": requested,
        "compiled": (
            {**compiled, "num_devices": target["num_devices"], "visual_num_devices": target["visual_num_devices"]}
            if compiled
            else None
        ),
        "compiled_source": source,
        "matches": compiled is None
        or (
            requested["device"] == compiled.get("device")
            and requested["visual_device"] == compiled.get("visual_device")
        ),
        "shared_devices": shared,
        "ok": not problems,
        "problems": problems,
        "notes": notes,
    }
