"""load-check's memory step: exact (or emulated) allocations of the compiled graphs when rebel is importable, the
memory planner's estimate beside (or alone), and ``--calibrate``'s record of the measured workspaces.

Its own module because ``qvl serve --device`` asks it too (``serving.command.remap_memory_gate``), for a placement
other than the compiled one, with the artifact the preflight read.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenvl_rbln.errors import InputError, QvlError

if TYPE_CHECKING:
    from qwenvl_rbln.artifacts.checked import CheckedArtifact


def _planner_estimate(
    root: Path,
    kind: str,
    cfg: dict[str, Any],
    npu: str | None,
    placement: dict[str, Any],
    device_memory: str | None,
    art: CheckedArtifact | None = None,
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
        config = art.read_strict("config.json") if art is not None else read_json(root / "config.json")
        geometry = geometry_from_config(config, name=root.name, source=str(root / "config.json"))
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
    *,
    art: CheckedArtifact | None = None,
) -> dict[str, Any]:
    """Exact (or emulated) allocations when rebel is importable, with the planner's estimate beside; else the
    estimate alone. ``art``: the artifact as read already (its config.json is not read again)."""
    from qwenvl_rbln.backends import emulator
    from qwenvl_rbln.backends.rbln import device_memory as rbln_memory
    from qwenvl_rbln.planning.catalogue.devices import npu_spec

    estimate = _planner_estimate(root, kind, cfg, target.get("npu"), placement, device_memory, art)
    if kind == "rbln" and not layout["missing"] and not refused and rbln_memory.import_rebel() is not None:
        try:
            spec = npu_spec(target["npu"]) if target.get("npu") else None
        except InputError:
            spec = None
        exact = rbln_memory.read_allocations(root, layout["graphs"], placement, spec)
        exact = _with_device_memory(exact, device_memory)
        if exact is not None and emulator.is_active():
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


def calibration_from_exact(
    root: Path, cfg: dict[str, Any], exact: dict[str, Any], art: CheckedArtifact | None = None
) -> dict[str, Any]:
    """Workspace per graph from exact allocations, in the planner's calibration keys.

    Assumption (stated in each record): a graph's workspace is its non-KV allocation (every key but
    ``DramTensor``) less the weights it holds; the LM weights are shared by its graphs (optimum-rbln compiles
    them with weight sharing), so they are taken out once, from the first LM graph big enough to hold them.
    """
    from qwenvl_rbln.artifacts.layout import read_json, resolved_from_rbln_config
    from qwenvl_rbln.memory import calibration as cal
    from qwenvl_rbln.memory.params import lm_params, vision_params
    from qwenvl_rbln.planning.catalogue.modelinfo import geometry_from_config

    config = art.read_strict("config.json") if art is not None else read_json(root / "config.json")
    geometry = geometry_from_config(config, name=root.name, source=str(root))
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


def record_calibration(
    root: Path, cfg: dict[str, Any], memory: dict[str, Any], target: dict[str, Any], art: CheckedArtifact | None = None
) -> dict[str, Any]:
    """--calibrate: record the exact per-graph workspaces so later estimates use them."""
    from qwenvl_rbln.memory import calibration as cal

    if memory.get("source") == "emulated":
        return {"recorded": False, "reason": "emulated sizes are not NPU figures; calibrate on an RBLN host"}
    if memory.get("source") != "exact":
        return {"recorded": False, "reason": "exact allocations need rebel-compiler on this host (rbln artifacts)"}
    found = calibration_from_exact(root, cfg, memory, art)
    if not found["records"] or not target.get("npu"):
        return {"recorded": False, "reason": "no graph allocations or no target NPU in the artifact"}
    path = cal.record(found["records"], model=found["model"], npu=target["npu"])
    return {"recorded": True, "path": str(path), "entries": found["records"]}
