"""Device memory of an rbln artifact: the exact per-device read-out from rebel, and the diagnosis of optimum-rbln's
``Lack of device memory`` (which graphs share a device, the numbers, and the fixes as load flags or --set strings).

Its own module because it reads compiled files and reasons about placement, apart from compiling and loading in
``rbln``. What it relies on in rebel-compiler:

- Device memory of a compiled graph: ``rebel.RBLNCompiledModel(path).get_alloc_per_chiplet_by_key()`` ->
  ``{key: [[bytes per chiplet] per node]}``; ``DramTensor`` is the KV cache, shared by all LM graphs and counted
  once from ``prefill`` (``transformers/modeling_attention_utils.py:318-345``).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from qwenvl_rbln.backends.rbln.optimum import first_line
from qwenvl_rbln.errors import BackendError
from qwenvl_rbln.memory.placement import device_list

# --------------------------------------------------------------------------------------- allocations


def import_rebel() -> Any | None:
    if "rebel" in sys.modules:
        return sys.modules["rebel"]
    try:
        return importlib.import_module("rebel")
    except Exception:  # noqa: BLE001 - any failure means "no exact read-out here"
        return None


def read_allocations(
    artifact_dir: Path, graphs: dict[str, dict[str, str]], placement: dict[str, Any], spec: Any
) -> dict | None:
    """Exact device memory per graph and per device from the compiled files, or None without rebel.

    Per device: every graph's non-KV allocation (weights, buffers, workspace) plus the KV cache
    (``DramTensor``) once for the LM graphs (they share it) and once per ViT file - the same accounting
    optimum-rbln uses when it sizes the KV cache.
    """
    rebel = import_rebel()
    if rebel is None or not hasattr(rebel, "RBLNCompiledModel"):
        return None
    root = Path(artifact_dir)
    per_device: dict[int, list[int]] = {}
    device_graphs: dict[int, list[str]] = {}
    out_graphs: dict[str, Any] = {}
    kv_counted = False
    for name, info in graphs.items():
        path = root / info["file"]
        try:
            alloc = rebel.RBLNCompiledModel(str(path)).get_alloc_per_chiplet_by_key()
        except Exception as exc:  # noqa: BLE001
            raise BackendError(
                f"rebel could not read {path}: {first_line(exc)}",
                "the file may be truncated: recompile (`qvl compile --force`)",
            ) from exc
        devs = device_list(placement["device"] if info["submodule"] == "lm" else placement["visual_device"])
        by_key = {key: int(sum(sum(chips) for chips in nodes)) for key, nodes in alloc.items()}
        count_kv = info["submodule"] == "visual" or not kv_counted
        if info["submodule"] == "lm" and "DramTensor" in alloc:
            kv_counted = True
        counted = 0
        for key, nodes in alloc.items():
            if key == "DramTensor" and not count_kv:
                continue
            for node_id, chips in enumerate(nodes):
                dev = devs[node_id] if node_id < len(devs) else devs[-1]
                row = per_device.setdefault(dev, [])
                if len(row) < len(chips):
                    row.extend([0] * (len(chips) - len(row)))
                for chip_id, size in enumerate(chips):
                    row[chip_id] += int(size)
                    counted += int(size)
        for dev in sorted(set(devs)):
            device_graphs.setdefault(dev, []).append(name)
        out_graphs[name] = {
            "file": info["file"],
            "submodule": info["submodule"],
            "device": devs[0] if len(devs) == 1 else devs,
            "by_key": by_key,
            "total_bytes": int(sum(by_key.values())),
            "counted_bytes": counted,
            "kv_shared": info["submodule"] == "lm" and not count_kv and "DramTensor" in alloc,
        }
    devices = []
    for dev in sorted(per_device):
        chips = per_device[dev]
        total = sum(chips)
        per_chip_cap = spec.usable_per_chiplet if spec is not None else None
        cap = spec.usable_bytes if spec is not None else None
        fits = None if spec is None else (total <= cap and all(c <= per_chip_cap for c in chips))
        devices.append(
            {
                "device": dev,
                "graphs": device_graphs.get(dev, []),
                "total_bytes": total,
                "per_chiplet_bytes": chips,
                "usable_bytes": cap,
                "usable_per_chiplet_bytes": per_chip_cap,
                "fits": fits,
            }
        )
    verdicts = [d["fits"] for d in devices if d["fits"] is not None]
    return {
        "source": "exact",
        "method": (
            "rebel.RBLNCompiledModel(path).get_alloc_per_chiplet_by_key(); KV (DramTensor) counted once for the LM"
        ),
        "npu": getattr(spec, "sku", None),
        "fits": all(verdicts) if verdicts else None,
        "devices": devices,
        "graphs": out_graphs,
    }


# -------------------------------------------------------------------------------------------- diagnosis


def suggestion_texts(report: dict[str, Any] | None) -> tuple[list[str], list[str]]:
    """(human lines, CLI override strings) from a planner report's ``suggestions``.

    memory/suggestions.py gives ``{"kind", "text", "set": ["rbln_config.max_seq_len=32768", ...], "cli": "--set ..."}``;
    the ``set`` entries of one suggestion belong together, so each suggestion yields one CLI string.
    """
    texts: list[str] = []
    clis: list[str] = []
    for item in (report or {}).get("suggestions") or []:
        if isinstance(item, str):
            texts.append(item)
            continue
        if not isinstance(item, dict):
            continue
        text = item.get("text") or item.get("message")
        sets = item.get("set")
        if isinstance(sets, list) and sets:
            clis.append(" ".join(f"--set {s}" for s in sets))
        elif isinstance(item.get("cli"), str) and item["cli"].strip():
            clis.append(item["cli"].strip())
        if text:
            texts.append(str(text))
    return texts, list(dict.fromkeys(clis))


def over_devices_text(memory: dict[str, Any]) -> str:
    """'device 0 needs 150.00 GiB of 140.00 GiB; ...' for the devices a memory report says are over."""
    from qwenvl_rbln.units import fmt_bytes

    parts = []
    for d in memory.get("devices") or []:
        if isinstance(d, dict) and d.get("fits") is False:
            parts.append(
                f"device {d['device']} needs {fmt_bytes(d.get('total_bytes'))} of {fmt_bytes(d.get('usable_bytes'))}"
            )
    return "; ".join(parts)


def _device_numbers(memory: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Per-device used/capacity from the exact read-out or a planner report (tolerant of its field names)."""
    out: dict[int, dict[str, Any]] = {}
    for d in memory.get("devices") or []:
        if not isinstance(d, dict) or "device" not in d:
            continue
        dev = d["device"]
        if isinstance(dev, list):
            dev = dev[0] if dev else 0
        used = next(
            (
                d[k]
                for k in ("total_bytes", "used_bytes", "required_bytes", "total")
                if isinstance(d.get(k), int | float)
            ),
            None,
        )
        cap = next(
            (
                d[k]
                for k in ("usable_bytes", "capacity_bytes", "available_bytes", "device_memory")
                if isinstance(d.get(k), int | float)
            ),
            None,
        )
        out[int(dev)] = {"used_bytes": used, "usable_bytes": cap, "fits": d.get("fits")}
    return out


def lack_of_memory_diagnosis(
    raw: str, memory: dict[str, Any], placement: dict[str, Any], graphs: dict[str, dict[str, str]], planner: dict | None
) -> dict[str, Any]:
    """Which graphs share which device, the numbers, and concrete fixes."""
    from qwenvl_rbln.units import fmt_bytes

    by_device: dict[int, list[str]] = {}
    for name, info in graphs.items():
        devs = device_list(placement["device"] if info["submodule"] == "lm" else placement["visual_device"])
        for dev in devs:
            by_device.setdefault(dev, []).append(name)
    numbers = _device_numbers(memory)
    devices = []
    for dev in sorted(by_device):
        nums = numbers.get(dev, {})
        devices.append({"device": dev, "graphs": by_device[dev], **nums})
    lm_devs = set(device_list(placement["device"]))
    vis_devs = set(device_list(placement["visual_device"]))
    shared = sorted(lm_devs & vis_devs)
    fixes: list[str] = []
    load_flags: list[str] = []
    lm = ",".join(map(str, device_list(placement["device"])))
    if shared:
        spare = max(lm_devs | vis_devs) + 1
        load_flags.append(f"--device {lm} --visual-device {spare}")
        fixes.append(
            f"the ViT and the LM share device {shared[0]}: load the ViT on an NPU of its own "
            f"(`qvl load-check DIR --device {lm} --visual-device {spare}`: {spare} is an example, any NPU the LM "
            f"does not use; or placement.visual_device: {spare} in the preset)"
        )
    texts, clis = suggestion_texts(planner)
    flags, sets = split_load_time(clis)
    flags = [f if f.startswith("--device ") else f"--device {lm} {f}" for f in flags]  # keep the LM where it is
    load_flags.extend(f for f in flags if f not in load_flags)
    fixes.extend(texts)
    fixes.append(
        "make the LM smaller on the device: recompile with a lower max_seq_len, batch_size, or a memory_budget "
        "that leaves room for the ViT (flash attention sizes the KV cache to fill the whole NPU)"
    )
    fixes.append("check that no other process holds NPU memory (`rbln-smi`)")
    summary_parts = []
    for d in devices:
        used, cap = d.get("used_bytes"), d.get("usable_bytes")
        nums = f" ({fmt_bytes(used)} of {fmt_bytes(cap)})" if used is not None and cap else ""
        summary_parts.append(f"device {d['device']}: {', '.join(d['graphs'])}{nums}")
    return {
        "kind": "lack_of_device_memory",
        "raw": raw,
        "source": memory.get("source"),
        "devices": devices,
        "shared_devices": shared,
        "summary": "; ".join(summary_parts),
        "fixes": fixes,
        "load_flags": load_flags,
        "set": sets,
        "hint": fix_hint(load_flags, sets, vit_shares_a_device=bool(shared)),
    }


def split_load_time(clis: list[str]) -> tuple[list[str], list[str]]:
    """Planner CLI strings -> (load-check flags for pure placement changes, compile-time --set strings).

    ``placement.*`` only changes the load-time rbln_config, so it needs no recompile.
    """
    flags: list[str] = []
    sets: list[str] = []
    names = {"placement.device": "--device", "placement.visual_device": "--visual-device"}
    for cli in clis:
        parts = [p for p in cli.split("--set") if p.strip()]
        pairs = [p.strip().split("=", 1) for p in parts]
        if pairs and all(len(kv) == 2 and kv[0] in names for kv in pairs):
            flags.append(" ".join(f"{names[k]} {v.strip('[]').replace(' ', '')}" for k, v in pairs))
        else:
            sets.append(cli)
    return flags, sets


def fix_hint(load_flags: list[str], sets: list[str], *, vit_shares_a_device: bool = True) -> str:
    """One line: load-time flags first (no recompile), then the first compile-time change; with neither, only
    advice that applies (moving the ViT is no fix when it already has its own NPU)."""
    parts = []
    if load_flags:
        parts.append(f"load with {load_flags[0]} (the ViT on its own NPU)")
    if sets:
        parts.append(f"recompile with {sets[0]}")
    if parts:
        return ", or ".join(parts)
    smaller = "recompile with a smaller max_seq_len or batch_size (see `qvl compile --dry-run` for what fits)"
    if vit_shares_a_device:
        return f"move the ViT to another NPU (--visual-device N), or {smaller}"
    return f"{smaller}, or check --device-memory against what `rbln-smi` reports free"
