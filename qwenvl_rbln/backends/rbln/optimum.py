"""The NPU backend: optimum-rbln 0.12.0 + rebel-compiler, imported only inside these functions.

Here: the dependencies, the emulator switch and guard, compile and load. The compile stage lines are in
``rbln.progress``; the device-memory read-out and the ``Lack of device memory`` diagnosis in ``rbln.device_memory``.

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
- Runtime creation failure is re-raised as ``RuntimeError("\\nFailed to create RBLN runtime: ...")`` with an
  OOM help text when the rebel message contains ``Lack of device memory`` (``modeling_base.py:353-378``).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

from qwenvl_rbln.backends.rbln.progress import import_stage, stage_hooks
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


def install_hint(missing: list[str]) -> str:
    """What to do about ``missing``: with optimum-rbln already installed, only rebel is absent, and this CPU can
    run the rbln backend through qvl's emulator (--emulate) before any install."""
    if missing == ["rebel-compiler"]:
        return (
            "on this CPU add --emulate (qvl's emulated rebel: proves the glue, never NPU numbers; or set "
            "QVL_EMULATE_NPU=1); on an RBLN host install rebel-compiler from Rebellions' package index (see README)"
        )
    return INSTALL_HINT


def check_dependencies() -> None:
    missing = missing_dependencies()
    if missing:
        raise DependencyMissing(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed, "
            "so the rbln backend cannot run on this host",
            install_hint(missing),
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
        raise DependencyMissing(f"importing optimum-rbln failed ({first_line(exc)})", INSTALL_HINT) from None


def first_line(exc: BaseException) -> str:
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

    from qwenvl_rbln.artifacts.emulated import emulated_evidence, is_emulated_artifact
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
        evidence = emulated_evidence(root, manifest, [info["file"] for info in graphs.values()])
        return InputError(
            f"{root} was compiled by qvl's CPU emulator ({evidence}): it holds no NPU graphs",
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


# -------------------------------------------------------------------------------------------- compile


def compile_model(plan: Any, out_dir: Path, progress: Any, model_cls: Any = None, *, source: str | None = None) -> dict:
    """Export with optimum-rbln and save into ``out_dir`` (an existing, empty staging directory).

    ``source`` is the model id or local directory to compile (default: the plan's model id). Returns what was
    called, for the manifest. Errors become DoesNotFit (memory) or BackendError (anything else).
    """
    import_stage(progress, model_cls)
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
    line = first_line(exc)
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
            f"optimum-rbln could not load {artifact_dir}: {first_line(exc)}",
            f"{where}; rerun with QVL_DEBUG=1 for the traceback",
        ) from exc


def _raw_runtime_message(text: str) -> str:
    for ln in text.splitlines():
        if LACK_OF_MEMORY in ln:
            return ln.strip()
    return text.strip().splitlines()[0] if text.strip() else text
