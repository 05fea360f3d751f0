"""`qvl load-check DIR`: will this artifact load, where, and does it fit? Then create the runtimes.

Steps, each reported (human tables or ``--json``):

1. layout: the files optimum-rbln 0.12 loads, derived from the artifact's own rbln_config.json
   (``prefill.rbln``, one ``decoder_batch_N.rbln`` per ``decoder_batch_sizes`` entry,
   ``visual/compiled_model.rbln``, ``torch_artifacts.pth``, config, processor and tokenizer files), extra
   ``.rbln`` files, and every file's sha256 against ``qvl-manifest.json`` (edits/truncation after compile);
2. target: NPU and num_devices from ``_compile_cfgs``;
3. placement: the requested ``--device`` / ``--visual-device`` against the placement recorded at compile;
4. memory per device: exact allocations from the compiled graphs when ``rebel`` is importable, the memory
   planner's estimate otherwise;
5. runtime: ``from_pretrained(DIR, export=False, rbln_config={"visual": {"device": V}, "device": D})``
   (transformers on CPU for torch artifacts) unless ``--no-runtime``; with --no-runtime and optimum-rbln
   installed the load still runs with ``create_runtimes: False``, which validates the config without the NPU.

Exit codes: 0 ok; 2 layout or placement problems; 3 optimum-rbln/torch missing for the runtime step;
4 does not fit (``Lack of device memory`` at runtime creation, or the memory check says so when no runtime was
created); 5 the backend failed otherwise. The full report is printed first (stdout, also with --json), then
one ``qvl: error:`` line on stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from qwenvl_rbln.commands.common import JsonOpt
from qwenvl_rbln.paths import user_path

DEFAULT_PRESET = "rebel100-1npu"


def parse_device(value: str | None, flag: str) -> int | list[int] | None:
    """'0' -> 0, '0,1' -> [0, 1]; InputError naming the flag otherwise."""
    from qwenvl_rbln.errors import InputError

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


def _as_list(value: Any) -> list[int]:
    return list(value) if isinstance(value, list) else [value]


def check_placement(
    device: Any,
    visual_device: Any,
    manifest: dict[str, Any] | None,
    target: dict[str, Any],
    fallback: dict | None,
    cfg: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Requested placement vs. the one recorded at compile (qvl-manifest.json, else the preset)."""
    from qwenvl_rbln.artifacts import placement_from_artifact

    compiled = None
    recorded = placement_from_artifact(cfg or {}, manifest)
    source = recorded.pop("source")
    if manifest and isinstance(manifest.get("placement"), dict):
        compiled = recorded
    elif fallback:
        compiled, source = dict(fallback["placement"]), f"preset {fallback['preset']}"
    base = compiled or recorded
    req_device = device if device is not None else base["device"]
    if visual_device is not None:
        req_visual = visual_device
    elif device is None or (compiled and compiled.get("visual_device") != compiled.get("device")):
        req_visual = base.get("visual_device", req_device)
    else:
        req_visual = req_device
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
    shared = sorted(set(_as_list(req_device)) & set(_as_list(req_visual)))
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


def _planner_estimate(
    root: Path, kind: str, cfg: dict[str, Any], npu: str | None, placement: dict[str, Any], device_memory: str | None
) -> dict[str, Any]:
    from qwenvl_rbln import memory as planner
    from qwenvl_rbln.artifacts import read_json, resolved_from_rbln_config
    from qwenvl_rbln.devices import npu_spec
    from qwenvl_rbln.errors import QvlError
    from qwenvl_rbln.modelinfo import geometry_from_config

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


def _memory(
    root: Path,
    kind: str,
    cfg: dict[str, Any],
    layout: dict,
    target: dict,
    placement: dict,
    device_memory: str | None,
    refused: bool = False,
) -> dict[str, Any]:
    from qwenvl_rbln.backends import rbln as rbln_backend
    from qwenvl_rbln.devices import npu_spec
    from qwenvl_rbln.errors import InputError

    estimate = _planner_estimate(root, kind, cfg, target.get("npu"), placement, device_memory)
    if kind == "rbln" and not layout["missing"] and not refused and rbln_backend.import_rebel() is not None:
        try:
            spec = npu_spec(target["npu"]) if target.get("npu") else None
        except InputError:
            spec = None
        exact = rbln_backend.read_allocations(root, layout["graphs"], placement, spec)
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


def _emulated() -> bool:
    from qwenvl_rbln import emulator

    return emulator.is_active()


def _calibrate(root: Path, cfg: dict[str, Any], memory: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    """--calibrate: record the exact per-graph workspaces so later estimates use them."""
    from qwenvl_rbln import calibration as cal

    if memory.get("source") == "emulated":
        return {"recorded": False, "reason": "emulated sizes are not NPU figures; calibrate on an RBLN host"}
    if memory.get("source") != "exact":
        return {"recorded": False, "reason": "exact allocations need rebel-compiler on this host (rbln artifacts)"}
    found = calibration_from_exact(root, cfg, memory)
    if not found["records"] or not target.get("npu"):
        return {"recorded": False, "reason": "no graph allocations or no target NPU in the artifact"}
    path = cal.record(found["records"], model=found["model"], npu=target["npu"])
    return {"recorded": True, "path": str(path), "entries": found["records"]}


def _runtime(
    root: Path,
    kind: str,
    placement: dict[str, Any],
    no_runtime: bool,
    model_cls: Any,
) -> dict[str, Any]:
    """Create the runtimes (or the torch model). Returns a dict; errors are returned as 'error' + exit code."""
    import time

    from qwenvl_rbln.errors import BackendError, DependencyMissing, DoesNotFit

    req = placement["requested"]
    if kind == "torch":
        from qwenvl_rbln.backends import torch_ref_compile

        if no_runtime:
            return {"attempted": False, "ok": None, "reason": "--no-runtime"}
        try:
            return torch_ref_compile.load_model(root, create_runtimes=True)
        except (DependencyMissing, BackendError) as exc:
            return {"attempted": True, "ok": False, "error": exc.one_line(), "exit_code": exc.exit_code, "exc": exc}

    from qwenvl_rbln.backends import rbln as rbln_backend

    cfg = rbln_backend.load_rbln_config(req["device"], req["visual_device"], create_runtimes=not no_runtime)
    if model_cls is None and rbln_backend.missing_dependencies():
        missing = " and ".join(rbln_backend.missing_dependencies())
        if no_runtime:
            return {
                "attempted": False,
                "ok": None,
                "rbln_config": cfg,
                "reason": f"--no-runtime; {missing} not installed, so only qvl's own checks ran",
            }
        err = DependencyMissing(
            f"{missing} not installed, so the runtimes cannot be created here", rbln_backend.INSTALL_HINT
        )
        return {
            "attempted": False,
            "ok": False,
            "rbln_config": cfg,
            "error": err.one_line(),
            "exit_code": err.exit_code,
            "exc": err,
        }
    t0 = time.monotonic()
    try:
        rbln_backend.load_model(
            root, req["device"], req["visual_device"], create_runtimes=not no_runtime, model_cls=model_cls
        )
    except DoesNotFit as exc:
        return {
            "attempted": True,
            "ok": False,
            "create_runtimes": not no_runtime,
            "rbln_config": cfg,
            "error": getattr(exc, "raw", exc.message),
            "exit_code": exc.exit_code,
            "exc": exc,
            "lack_of_device_memory": True,
        }
    except (DependencyMissing, BackendError) as exc:
        return {
            "attempted": True,
            "ok": False,
            "create_runtimes": not no_runtime,
            "rbln_config": cfg,
            "error": exc.one_line(),
            "exit_code": exc.exit_code,
            "exc": exc,
        }
    return {
        "attempted": True,
        "ok": True,
        "create_runtimes": not no_runtime,
        "rbln_config": cfg,
        "seconds": round(time.monotonic() - t0, 3),
        "note": (
            "runtimes created on the NPU"
            if not no_runtime
            else "loaded with create_runtimes=False: optimum-rbln validated files and config, no NPU memory was used"
        ),
    }


def calibration_from_exact(root: Path, cfg: dict[str, Any], exact: dict[str, Any]) -> dict[str, Any]:
    """Workspace per graph from exact allocations, in the planner's calibration keys.

    Assumption (stated in each record): a graph's workspace is its non-KV allocation (every key but
    ``DramTensor``) less the weights it holds; the LM weights are shared by its graphs (optimum-rbln compiles
    them with weight sharing), so they are taken out once, from the first LM graph big enough to hold them.
    """
    from qwenvl_rbln import calibration as cal
    from qwenvl_rbln.artifacts import read_json, resolved_from_rbln_config
    from qwenvl_rbln.memory import lm_params, vision_params
    from qwenvl_rbln.modelinfo import geometry_from_config

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


def _vit_shares_a_device(requested: dict[str, Any]) -> bool:
    def ids(value: Any) -> set[Any]:
        return set(value) if isinstance(value, list) else {value}

    return bool(ids(requested.get("device")) & ids(requested.get("visual_device", requested.get("device"))))


def _unknown_npus(target: dict[str, Any]) -> list[str]:
    """A target NPU that optimum-rbln would refuse (``Unknown npu name``) is a problem of the artifact."""
    from qwenvl_rbln.devices import npu_spec
    from qwenvl_rbln.errors import InputError

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
) -> tuple[dict[str, Any], Exception | None]:
    """The whole check; returns (report, the error to raise after printing it, or None).

    ``emulate`` (or QVL_EMULATE_NPU=1): an rbln artifact is loaded through qvl's CPU emulator of rebel.
    """
    from qwenvl_rbln import artifacts, render
    from qwenvl_rbln.backends import rbln as rbln_backend
    from qwenvl_rbln.errors import DoesNotFit, InputError

    root = user_path(directory).absolute()
    if device_memory is not None:  # a typo here is bad input, not a footnote under "ok" or an artifact problem
        from qwenvl_rbln.memory import parse_device_memory

        parse_device_memory(device_memory)
    kind, cfg = artifacts.read_artifact_config(root)
    if emulate and kind != "rbln":
        raise InputError(
            f"--emulate emulates the NPU backend, but {root} is a {kind}-backend artifact (nothing to emulate)",
            "drop --emulate",
        )
    if kind == "rbln":
        rbln_backend.use_emulator(emulate)
    manifest = artifacts.read_manifest(root)
    if manifest is not None:
        entries = list((manifest.get("files") or {}).values())
        n = len(entries)
        # a hostile or damaged manifest may hold anything here; verify_manifest reports it, this only counts
        total = sum(f["size"] for f in entries if isinstance(f, dict) and type(f.get("size")) is int)
        render.info(
            f"qvl load-check: verifying {n} files ({render.fmt_bytes(total)}) against {artifacts.MANIFEST_NAME}"
        )
    layout = artifacts.check_layout(root, kind, cfg, manifest)
    guard = None
    if kind == "rbln" and not layout["missing"]:  # emulated vs real graphs, tampered graphs, optimum-rbln version
        guard = rbln_backend.artifact_problem(root, cfg, manifest, layout["graphs"])
        if guard is not None:
            layout["problems"].insert(0, guard.message)
            layout["ok"] = False
    if _emulated() and kind == "rbln":
        layout["notes"].append("emulated: loaded through qvl's CPU emulator of rebel (no NPU)")
    target = artifacts.compile_target(cfg, manifest)
    target["problems"].extend(_unknown_npus(target))
    if device_memory is not None and not target["problems"] and target.get("npu"):
        from qwenvl_rbln.devices import npu_spec
        from qwenvl_rbln.memory import parse_device_memory

        parse_device_memory(device_memory, npu_spec(target["npu"]))  # above this card's DRAM: exit 2, as a dry run
    layout["problems"].extend(target["problems"])
    if target["problems"]:
        layout["ok"] = False
    placement = check_placement(device, visual_device, manifest, target, fallback, cfg)
    memory = _memory(root, kind, cfg, layout, target, placement["requested"], device_memory, guard is not None)
    if layout["ok"] and memory.get("source") == "unavailable" and memory.get("problem"):
        # the artifact's own config cannot be read as optimum-rbln would (a bad value, a broken config.json)
        layout["problems"].append(memory["problem"])
        layout["ok"] = False
    if calibrate:
        memory["calibration"] = _calibrate(root, cfg, memory, target)

    error: Exception | None = None
    if not layout["ok"]:
        runtime: dict[str, Any] = {"attempted": False, "ok": None, "reason": "layout problems (fix them first)"}
        error = guard or InputError(
            f"{root}: {artifacts.describe_layout_problem(layout)}",
            "recompile with `qvl compile --force` (or restore the files); the report (or --json's layout) lists every "
            "problem",
        )
    elif not placement["ok"]:
        runtime = {"attempted": False, "ok": None, "reason": "placement problems"}
        error = InputError(placement["problems"][0], "pass one device id per compiled device (num_devices)")
    else:
        runtime = _runtime(root, kind, placement, no_runtime, model_cls)
        exc = runtime.pop("exc", None)
        real_runtime = kind == "rbln" and runtime.get("ok") is True and bool(runtime.get("create_runtimes"))
        if runtime.get("lack_of_device_memory"):
            diag = rbln_backend.lack_of_memory_diagnosis(
                runtime.get("error") or "", memory, placement["requested"], layout["graphs"], memory
            )
            runtime["diagnosis"] = diag
            error = DoesNotFit(
                f"runtime creation failed, {rbln_backend.LACK_OF_MEMORY} ({diag['summary']})", diag["hint"]
            )
        elif exc is not None:
            error = exc
        elif kind == "rbln" and memory.get("fits") is False and not real_runtime:
            where = rbln_backend.over_devices_text(memory)
            _, clis = rbln_backend.suggestion_texts(memory)
            flags, sets = rbln_backend.split_load_time(clis)
            error = DoesNotFit(
                f"{root} does not fit the requested placement "
                f"({memory.get('source')} memory: {where or 'over capacity'})",
                rbln_backend.fix_hint(flags, sets, vit_shares_a_device=_vit_shares_a_device(placement["requested"])),
            )
        elif memory.get("fits") is False and real_runtime:
            memory.setdefault("notes", []).append(
                "the runtimes were created although the memory check predicted otherwise; `qvl load-check` results "
                "on hardware beat estimates"
            )
    if runtime.get("ok") is True and _emulated():
        runtime["note"] = "runtimes created on qvl's CPU emulator (emulated: no NPU memory was used)"
    report = {
        "artifact_dir": str(root),
        "kind": kind,
        "emulated": kind == "rbln" and _emulated(),
        "ok": error is None,
        "layout": layout,
        "target": target,
        "placement": placement,
        "memory": memory,
        "runtime": runtime,
        "exit_code": getattr(error, "exit_code", 0) if error else 0,
        "error": error.one_line() if hasattr(error, "one_line") else None,
    }
    return report, error


# ------------------------------------------------------------------------------------------- rendering


def _human(console: Any, d: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from qwenvl_rbln.memory_view import print_memory
    from qwenvl_rbln.render import fmt_bytes

    ok = "[green]ok[/green]"
    bad = "[red bold]problem[/red bold]"
    layout, target, placement, memory, runtime = d["layout"], d["target"], d["placement"], d["memory"], d["runtime"]
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    table.add_row("artifact", f"{escape(d['artifact_dir'])}  [dim]({d['kind']})[/dim]")
    table.add_row(
        "target",
        f"{escape(str(target.get('npu')))}, num_devices {target['num_devices']} "
        f"(visual {target['visual_num_devices']})",
    )
    lines = [ok if layout["ok"] else bad]
    for label, key in (("missing", "missing"), ("changed after compile", "modified"), ("unexpected", "unexpected")):
        if layout[key]:
            lines.append(f"{label}: {escape(', '.join(layout[key]))}")
    lines.extend(escape(p) for p in layout["problems"])
    lines.extend(f"[dim]{escape(n)}[/dim]" for n in layout["notes"])
    table.add_row("layout", "\n".join(lines))
    man = layout["manifest"]
    if man.get("present"):
        table.add_row("manifest", ok + " (every file matches its sha256)" if man["ok"] else bad)
    req = placement["requested"]
    pl = [f"LM on device {req['device']}, visual on device {req['visual_device']}"]
    if placement.get("compiled"):
        c = placement["compiled"]
        pl.append(
            f"[dim]compiled for: LM {c.get('device')}, visual {c.get('visual_device')} "
            f"({escape(placement['compiled_source'])})[/dim]"
        )
    pl.extend(f"[red]{escape(p)}[/red]" for p in placement["problems"])
    pl.extend(f"[yellow]{escape(n)}[/yellow]" for n in placement["notes"])
    table.add_row("placement", "\n".join(pl))
    console.print(table)

    if memory.get("source") in ("exact", "emulated"):
        title = (
            "memory per device (exact: from the compiled graphs)"
            if memory["source"] == "exact"
            else "memory per device (emulated: tensor sizes of the emulated graphs, not NPU figures)"
        )
        mt = Table(title=title, title_justify="left", show_edge=False)
        for col in ("device", "graphs", "allocated", "usable", "fullest chiplet", "verdict"):
            mt.add_column(col)
        for dev in memory["devices"]:
            chips = dev.get("per_chiplet_bytes") or []
            verdict = {True: "[green]fits[/green]", False: "[red bold]does not fit[/red bold]", None: "-"}[
                dev.get("fits")
            ]
            mt.add_row(
                str(dev["device"]),
                ", ".join(dev["graphs"]),
                fmt_bytes(dev["total_bytes"]),
                fmt_bytes(dev.get("usable_bytes")),
                f"{fmt_bytes(max(chips) if chips else None)} of {fmt_bytes(dev.get('usable_per_chiplet_bytes'))}",
                verdict,
            )
        console.print(mt)
        if memory["source"] == "emulated":
            gt = Table(title="graphs (emulated sizes)", title_justify="left", show_edge=False)
            for col in ("graph", "device", "weights", "io buffers", "KV cache"):
                gt.add_column(col)
            for name, g in (memory.get("graphs") or {}).items():
                by_key = g.get("by_key") or {}
                kv = fmt_bytes(by_key.get("DramTensor")) if "DramTensor" in by_key else "-"
                if g.get("kv_shared"):
                    kv += " (shared)"
                gt.add_row(
                    name, str(g["device"]), fmt_bytes(by_key.get("Weight")), fmt_bytes(by_key.get("IOBuffer")), kv
                )
            console.print(gt)
            if (memory.get("estimate") or {}).get("source") == "estimate":
                console.print("[bold]planner estimate[/bold] [dim](beside the emulated sizes)[/dim]")
                print_memory(console, memory["estimate"])
    elif memory.get("source") == "estimate":
        console.print("[bold]memory per device[/bold] [dim](planner estimate: rebel is not importable here)[/dim]")
        print_memory(console, memory)
    else:
        console.print(f"[dim]memory: {escape(str(memory.get('reason') or 'unavailable'))}[/dim]")
    calibration = memory.get("calibration")
    if calibration and calibration.get("recorded"):
        console.print(
            f"[green]calibration: {len(calibration['entries'])} workspaces recorded in "
            f"{escape(calibration['path'])}[/green]"
        )
    elif calibration:
        console.print(f"[yellow]calibration: nothing recorded ({escape(str(calibration.get('reason')))})[/yellow]")

    if runtime.get("ok") is True:
        extra = f" in {runtime['seconds']}s" if runtime.get("seconds") is not None else ""
        console.print(f"[green]runtime: {escape(runtime.get('note') or 'created')}{extra}[/green]")
    elif runtime.get("attempted") is False:
        reason = runtime.get("reason") or runtime.get("error") or "skipped"
        console.print(f"[dim]runtime: not created ({escape(str(reason))})[/dim]")
    else:
        console.print(f"[red bold]runtime: failed[/red bold] {escape(str(runtime.get('error')))}")
        diag = runtime.get("diagnosis")
        if diag:
            for dev in diag["devices"]:
                nums = ""
                if dev.get("used_bytes") is not None:
                    nums = f": {fmt_bytes(dev['used_bytes'])} of {fmt_bytes(dev.get('usable_bytes'))}"
                console.print(f"  device {dev['device']}: {escape(', '.join(dev['graphs']))}{nums}")
            console.print("[bold]fixes[/bold]")
            for fix in diag["fixes"]:
                console.print(f"  • {escape(fix)}")
            for flag in diag.get("load_flags") or []:
                console.print(f"  • load with {escape(flag)} (no recompile)")
            for cli in diag["set"]:
                console.print(f"  • recompile with {escape(cli)}")
    console.print("[green bold]load-check: ok[/green bold]" if d["ok"] else "[red bold]load-check: failed[/red bold]")


def register(app: typer.Typer) -> None:
    @app.command("load-check")
    def load_check(
        directory: Path = typer.Argument(
            None,
            metavar="DIR",
            help="Artifact directory. Default, as for `qvl infer`: with --preset P, P's output_dir; else the "
            "directory the last `qvl compile` run from this working directory wrote (if deleted: its preset's "
            f"output_dir); with no compile recorded here, {DEFAULT_PRESET}'s output_dir.",
            show_default=False,
        ),
        preset: str = typer.Option(
            None,
            "--preset",
            "-p",
            help="Preset whose output_dir is checked when DIR is omitted, and whose placement is the fallback "
            "when the artifact records none.",
        ),
        device: str = typer.Option(
            None,
            "--device",
            help="NPU id for the LM graphs, e.g. 0 (or 0,1); default: the placement recorded at compile.",
        ),
        visual_device: str = typer.Option(
            None, "--visual-device", help="NPU id for the ViT; default: the recorded placement, else --device."
        ),
        calibrate: bool = typer.Option(
            False,
            "--calibrate",
            help="Record the compiled graphs' exact workspaces (needs rebel) into $QVL_HOME/calibration.json "
            "so later estimates use measured numbers.",
        ),
        no_runtime: bool = typer.Option(
            False, "--no-runtime", help="Check layout, placement and memory; create no runtimes (no NPU needed)."
        ),
        device_memory: str = typer.Option(
            None, "--device-memory", help="Usable bytes per NPU for the estimate, e.g. 120GiB (default: the NPU spec)."
        ),
        emulate: bool = typer.Option(
            False,
            "--emulate",
            help="Load an artifact compiled with `qvl compile --emulate` through qvl's CPU emulator of rebel "
            "(also QVL_EMULATE_NPU=1); sizes are labelled emulated.",
        ),
        as_json: bool = JsonOpt,
    ) -> None:
        """Check a compiled artifact: files, target NPU, placement, memory per device, then create the runtimes."""
        from qwenvl_rbln import render

        fallback = None
        if directory is None:  # exactly the rule `qvl infer` follows (inference.runner.default_directory)
            from qwenvl_rbln.inference.runner import default_directory

            directory, used, notes = default_directory(preset, [], command="load-check")
            for line in notes:
                render.warn(line)
            preset = preset or used
        if preset is not None:
            from qwenvl_rbln.plan import build_plan

            plan = build_plan(preset)
            fallback = {"preset": plan.preset, "placement": plan.placement}
        report, error = run_load_check(
            directory,
            device=parse_device(device, "--device"),
            visual_device=parse_device(visual_device, "--visual-device"),
            no_runtime=no_runtime,
            calibrate=calibrate,
            device_memory=device_memory,
            fallback=fallback,
            emulate=emulate,
        )
        render.emit(report, as_json=as_json, human=_human, error=error)
        if error is not None:
            raise error
