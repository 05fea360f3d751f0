"""The NPU backend: optimum-rbln 0.12.0 + rebel-compiler, imported only inside these functions.

What this file relies on in optimum-rbln 0.12.0 (paths inside the wheel, ``optimum/rbln/``):

- ``RBLNAutoModelForImageTextToText.from_pretrained(model, export=True, rbln_config=dict, **kw)`` picks
  ``RBLNQwen3VLForConditionalGeneration`` from ``config.json`` (``transformers/models/auto/auto_factory.py:68-121,
  208-250``); ``export=False`` picks it from ``rbln_config.json``'s ``cls_name``.
- Export writes into ``model_save_dir`` (created if missing), else into a ``TemporaryDirectory()`` under the
  system temp dir (``modeling.py:143-154``); ``save_pretrained(dir)`` then copies that tree via
  ``<dir>.tmp`` and refuses ``dir == model_save_dir`` with FileExistsError (``modeling_base.py:637-724``).
  qvl exports into a scratch sibling of its staging directory (same filesystem, never the system /tmp, which
  may be RAM-backed) and ``save_pretrained``s into the staging directory.
- The rbln_config dict is mutated by optimum-rbln (``initialize_from_kwargs`` updates it, the vision config
  sorts ``max_seq_len`` in place: ``configuration_utils.py:1100-1112``, ``qwen3_vl/configuration_qwen3_vl.py:121``),
  so a deep copy of the plan's dict is passed.
- Each graph is compiled through ``RBLNBaseModel.compile`` (``modeling_base.py:511-538``), called for the ViT
  (``modeling.py:76``, name ``compiled_model``) and for ``prefill`` / ``decoder_batch_N``
  (``decoderonly/modeling_decoderonly.py:243, 285-330``); KV blocks are sized afterwards when flash attention
  and ``kvcache_num_blocks`` is automatic (``modeling_decoderonly.py:332-333``). optimum-rbln logs no stage
  messages at INFO level (only DEBUG lines during KV sizing, ``modeling_attention_utils.py:253-268, 374-398``), so
  stages are reported by wrapping ``RBLNBaseModel.compile`` for the duration of the export, plus a handler on
  the ``optimum.rbln`` logger for the KV-sizing debug lines when OPTIMUM_RBLN_VERBOSE=debug.
- Runtime creation failure is re-raised as ``RuntimeError("\\nFailed to create RBLN runtime: ...")`` with an
  OOM help text when the rebel message contains ``Lack of device memory`` (``modeling_base.py:353-378``).
- Device memory of a compiled graph: ``rebel.RBLNCompiledModel(path).get_alloc_per_chiplet_by_key()`` ->
  ``{key: [[bytes per chiplet] per node]}``; ``DramTensor`` is the KV cache, shared by all LM graphs and counted
  once from ``prefill`` (``transformers/modeling_attention_utils.py:318-345``).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import logging
import os
import shutil
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import BackendError, DependencyMissing, DoesNotFit

INSTALL_HINT = (
    "on an RBLN host run `pip install optimum-rbln==0.12.0` and install rebel-compiler from "
    "Rebellions' package index (see README)"
)
AUTO_CLASS = "RBLNAutoModelForImageTextToText"
LACK_OF_MEMORY = "Lack of device memory"
KV_INSUFFICIENT = "Insufficient memory for the required KV cache"


# ----------------------------------------------------------------------------------------- dependencies


def _available(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def missing_dependencies() -> list[str]:
    """Distribution names that are missing for the rbln backend (cheap: no import of either)."""
    missing = []
    if not _available("optimum.rbln"):
        missing.append("optimum-rbln")
    if not _available("rebel"):
        missing.append("rebel-compiler")
    return missing


def check_dependencies() -> None:
    missing = missing_dependencies()
    if missing:
        raise DependencyMissing(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed, "
            "so the rbln backend cannot run on this host",
            INSTALL_HINT,
        )


def model_class(model_cls: Any = None) -> Any:
    """``optimum.rbln.RBLNAutoModelForImageTextToText`` (or the injected class, for tests)."""
    if model_cls is not None:
        return model_cls
    check_dependencies()
    try:
        from qwenvl_rbln.backends import emulator

        quiet = emulator.quiet_optimum_import() if emulator.is_active() else contextlib.nullcontext()
        with quiet:
            module = importlib.import_module("optimum.rbln")
        return getattr(module, AUTO_CLASS)
    except ImportError as exc:
        name = getattr(exc, "name", None) or str(exc)
        raise DependencyMissing(f"importing optimum-rbln failed: {name} is missing", INSTALL_HINT) from None
    except (AttributeError, RuntimeError) as exc:  # _LazyModule wraps import errors of submodules
        raise DependencyMissing(f"importing optimum-rbln failed ({_first_line(exc)})", INSTALL_HINT) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _debug_traceback() -> None:
    if os.environ.get("QVL_DEBUG"):
        traceback.print_exc(file=sys.stderr)


# ------------------------------------------------------------------------------------------- emulation


def use_emulator(flag: bool = False, flag_name: str = "--emulate") -> bool:
    """Serve qvl's CPU emulator as ``rebel`` when asked (``flag`` or QVL_EMULATE_NPU=1); True when it is active.

    InputError (exit 2) when a real rebel-compiler is importable: two rebels in one process is a trap.
    """
    from qwenvl_rbln.backends import emulator

    if emulator.requested(flag):
        emulator.activate(flag_name)
    return emulator.is_active()


def artifact_problem(root: Path, cfg: dict[str, Any], manifest: dict[str, Any] | None, graphs: dict) -> Any:
    """The InputError that stops loading ``root`` here, or None.

    An emulated artifact (manifest ``emulated: true`` or emulated graph files) needs the emulator; the emulator
    runs only graph files it wrote, unmodified; an artifact from another optimum-rbln version is refused
    (optimum-rbln rejects or misreads another version's rbln_config.json).
    """
    from importlib import metadata

    from qwenvl_rbln.artifacts.emulated import is_emulated_artifact
    from qwenvl_rbln.backends import emulator
    from qwenvl_rbln.backends.emulator import graph as emulated_graph
    from qwenvl_rbln.errors import InputError

    root = Path(root)
    files = [root / info["file"] for info in graphs.values() if (root / info["file"]).is_file()]
    marked = is_emulated_artifact(root, manifest, [info["file"] for info in graphs.values()])
    if emulator.is_active():
        if not marked:
            return InputError(
                f"{root} holds NPU graphs that qvl's emulator did not write, so --emulate cannot run them",
                "drop --emulate (and unset QVL_EMULATE_NPU) and run it on an RBLN host",
            )
        for f in files:
            problem = emulated_graph.check_file(f)
            if problem:
                return InputError(
                    f"{f}: the emulator refuses this graph file: it {problem}",
                    "recompile the artifact with `qvl compile --emulate --force` (graph files are never executed "
                    "as code, only read back)",
                )
    elif marked:
        return InputError(
            f"{root} was compiled by qvl's CPU emulator (qvl-manifest.json emulated: true): it holds no NPU graphs",
            "run it on the CPU with --emulate, or compile it for real on an RBLN host (`qvl compile` without "
            "--emulate)",
        )
    version = cfg.get("optimum_rbln_version")
    try:
        installed = metadata.version("optimum-rbln")
    except metadata.PackageNotFoundError:
        installed = None
    if isinstance(version, str) and installed and version != installed:
        return InputError(
            f"{root / 'rbln_config.json'}: compiled with optimum-rbln {version}, but this host has optimum-rbln "
            f"{installed} (another version's artifact is refused or misread at load)",
            f"recompile it here with `qvl compile --force`{' --emulate' if marked else ''}, or install "
            f"optimum-rbln=={version}",
        )
    return None


# ------------------------------------------------------------------------------------------- progress


class _OptimumLogHandler(logging.Handler):
    """Turns optimum-rbln's KV-sizing log lines into a stage; records warnings for the manifest."""

    def __init__(self, progress: Any):
        super().__init__(level=logging.DEBUG)
        self.progress = progress
        self.kv_seen = False
        self.warnings: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a logging handler must never raise
            return
        if not self.kv_seen and ("kvcache_num_blocks" in msg or msg.startswith("[KVCache]")):
            self.kv_seen = True
            if not (self.progress.current or "").startswith("KV cache sizing"):
                self.progress.stage("KV cache sizing", "optimum-rbln is estimating kvcache_num_blocks")
        if record.levelno >= logging.WARNING:
            self.warnings.append(msg.splitlines()[0] if msg else msg)


def _stage_label(cls: Any, name: str, cfg: Any, plan: Any) -> tuple[str, str]:
    r = plan.resolved
    if name == "compiled_model" or "Vision" in getattr(cls, "__name__", ""):
        return "ViT buckets", f"visual/compiled_model.rbln, buckets {', '.join(str(b) for b in r.vit_buckets)} patches"
    if name == "prefill":
        return "prefill graph", f"prefill.rbln, chunk {r.prefill_chunk_size}, max_seq_len {r.max_seq_len}"
    if name.startswith("decoder_batch_"):
        names = [f"decoder_batch_{b}" for b in r.decoder_batch_sizes]
        pos = names.index(name) + 1 if name in names else 0
        return f"decoder graph {name}", f"{name}.rbln ({pos}/{len(names)})" if pos else f"{name}.rbln"
    return f"graph {name}", f"{name}.rbln"


@contextlib.contextmanager
def stage_hooks(plan: Any, progress: Any) -> Iterator[_OptimumLogHandler]:
    """Report optimum-rbln's compile stages while the export runs; everything is restored afterwards."""
    handler = _OptimumLogHandler(progress)
    logger = logging.getLogger("optimum.rbln")
    logger.addHandler(handler)
    base = None
    original = None
    with contextlib.suppress(Exception):
        base = importlib.import_module("optimum.rbln.modeling_base").RBLNBaseModel
        original = base.__dict__.get("compile")
    if base is not None and isinstance(original, classmethod):
        func = original.__func__
        last_graph = plan.resolved.graph_names[-1]
        auto_kv = plan.resolved.attn_impl == "flash_attn" and not plan.resolved.kvcache_num_blocks

        def compile_with_progress(cls: Any, model: Any, rbln_compile_config: Any = None, *args: Any, **kwargs: Any):
            name = getattr(rbln_compile_config, "compiled_model_name", None) or "compiled_model"
            progress.stage(*_stage_label(cls, name, rbln_compile_config, plan))
            result = func(cls, model, rbln_compile_config, *args, **kwargs)
            if name == last_graph and auto_kv:
                progress.stage(
                    "KV cache sizing", "optimum-rbln is estimating kvcache_num_blocks from the compiled graphs"
                )
            return result

        base.compile = classmethod(compile_with_progress)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        if base is not None and isinstance(original, classmethod):
            base.compile = original


# -------------------------------------------------------------------------------------------- compile


def compile_model(plan: Any, out_dir: Path, progress: Any, model_cls: Any = None, *, source: str | None = None) -> dict:
    """Export with optimum-rbln and save into ``out_dir`` (an existing, empty staging directory).

    ``source`` is the model id or local directory to compile (default: the plan's model id). Returns what was
    called, for the manifest. Errors become DoesNotFit (memory) or BackendError (anything else).
    """
    cls = model_class(model_cls)
    out_dir = Path(out_dir)
    scratch = out_dir.parent / f"{out_dir.name}.export"
    model_src = source or plan.model_id
    rbln_config = copy.deepcopy(plan.rbln_config)
    progress.stage("loading model", f"{AUTO_CLASS}.from_pretrained({model_src!r}, export=True)")
    try:
        with stage_hooks(plan, progress) as handler:
            model = cls.from_pretrained(model_src, export=True, rbln_config=rbln_config, model_save_dir=str(scratch))
            progress.stage("saving", f"save_pretrained -> {out_dir.name}")
            model.save_pretrained(str(out_dir))
        del model
    except (KeyboardInterrupt, SystemExit, DependencyMissing):
        raise
    except Exception as exc:
        _debug_traceback()
        raise compile_error(exc, plan) from exc
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
    return {
        "class": getattr(cls, "__name__", str(cls)),
        "source": model_src,
        "call": "from_pretrained(model, export=True, rbln_config=<manifest rbln_config>, model_save_dir=<scratch>)",
        "optimum_rbln_warnings": handler.warnings[:20],
    }


def _kv_fix(plan: Any) -> str:
    """optimum-rbln sizes the KV pool for the LM graphs alone, so moving the ViT cannot help here: the planner's
    context, batch or memory_budget changes can, each a ready --set."""
    generic = "lower max_seq_len or batch_size, or raise memory_budget; `qvl compile --dry-run` shows the estimate"
    try:
        from qwenvl_rbln.memory.planner import estimate_plan

        suggestions = estimate_plan(plan).suggestions
    except Exception:  # the hint must never hide the real error
        return generic
    lm_only = [s for s in suggestions if s["kind"] in ("max_seq_len", "batch_size", "memory_budget")]
    if not lm_only:
        return generic
    return "try " + " or ".join(" ".join(f"--set {x}" for x in s["set"]) for s in lm_only[:2])


def compile_error(exc: BaseException, plan: Any) -> Exception:
    text = str(exc)
    line = _first_line(exc)
    if KV_INSUFFICIENT in text:
        return DoesNotFit(f"optimum-rbln could not fit the KV cache for preset {plan.preset}: {line}", _kv_fix(plan))
    if LACK_OF_MEMORY in text:
        return DoesNotFit(
            f"runtime creation during compile failed: {LACK_OF_MEMORY}",
            "compile with create_runtimes: false (the presets do) and load on a free NPU with `qvl load-check`",
        )
    return BackendError(
        f"optimum-rbln compile of {plan.model_id} failed: {line}",
        "rerun with QVL_DEBUG=1 for the traceback and OPTIMUM_RBLN_VERBOSE=debug for optimum-rbln's log",
    )


# ---------------------------------------------------------------------------------------------- load


def load_rbln_config(device: Any, visual_device: Any, create_runtimes: bool = True) -> dict[str, Any]:
    """The load-time rbln_config: top-level runtime keys are copied into ``visual`` by optimum-rbln first,
    then the nested ``visual`` dict overrides them (``configuration_utils.py:1046-1066``)."""
    cfg: dict[str, Any] = {"visual": {"device": visual_device}, "device": device}
    if not create_runtimes:
        cfg["create_runtimes"] = False
    return cfg


def load_model(
    artifact_dir: Path, device: Any, visual_device: Any, create_runtimes: bool = True, model_cls: Any = None
) -> Any:
    """``from_pretrained(dir, export=False, rbln_config={"visual": {"device": V}, "device": D})``.

    Raises DoesNotFit (with ``.raw`` = the runtime's message) on ``Lack of device memory``, BackendError
    otherwise.
    """
    cls = model_class(model_cls)
    cfg = load_rbln_config(device, visual_device, create_runtimes)
    try:
        return cls.from_pretrained(str(artifact_dir), export=False, rbln_config=cfg)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        _debug_traceback()
        text = str(exc)
        if LACK_OF_MEMORY in text:
            err = DoesNotFit(
                f"runtime creation failed on the NPU: {LACK_OF_MEMORY}",
                "see the memory diagnosis printed by `qvl load-check`",
            )
            err.raw = _raw_runtime_message(text)  # type: ignore[attr-defined]
            raise err from exc
        from qwenvl_rbln.backends.emulator import is_active

        where = (
            "the emulated host has QVL_EMULATOR_DEVICES NPUs (default 4): use ids below that"
            if is_active()
            else "check `rbln-smi` for the NPU ids and their free memory"
        )
        raise BackendError(
            f"optimum-rbln could not load {artifact_dir}: {_first_line(exc)}",
            f"{where}; rerun with QVL_DEBUG=1 for the traceback",
        ) from exc


def _raw_runtime_message(text: str) -> str:
    for ln in text.splitlines():
        if LACK_OF_MEMORY in ln:
            return ln.strip()
    return text.strip().splitlines()[0] if text.strip() else text


# --------------------------------------------------------------------------------------- allocations


def import_rebel() -> Any | None:
    if "rebel" in sys.modules:
        return sys.modules["rebel"]
    try:
        return importlib.import_module("rebel")
    except Exception:  # noqa: BLE001 - any failure means "no exact read-out here"
        return None


def _devices(value: Any) -> list[int]:
    return list(value) if isinstance(value, list) else [value]


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
                f"rebel could not read {path}: {_first_line(exc)}",
                "the file may be truncated: recompile (`qvl compile --force`)",
            ) from exc
        devs = _devices(placement["device"] if info["submodule"] == "lm" else placement["visual_device"])
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
        devs = _devices(placement["device"] if info["submodule"] == "lm" else placement["visual_device"])
        for dev in devs:
            by_device.setdefault(dev, []).append(name)
    numbers = _device_numbers(memory)
    devices = []
    for dev in sorted(by_device):
        nums = numbers.get(dev, {})
        devices.append({"device": dev, "graphs": by_device[dev], **nums})
    lm_devs = set(_devices(placement["device"]))
    vis_devs = set(_devices(placement["visual_device"]))
    shared = sorted(lm_devs & vis_devs)
    fixes: list[str] = []
    load_flags: list[str] = []
    if shared:
        spare = max(lm_devs | vis_devs) + 1
        load_flags.append(f"--visual-device {spare}")
        fixes.append(
            f"the ViT and the LM share device {shared[0]}: load the ViT on its own NPU "
            f"(`qvl load-check DIR --visual-device {spare}`, or placement.visual_device: {spare} in the preset)"
        )
    texts, clis = suggestion_texts(planner)
    flags, sets = split_load_time(clis)
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
