"""A CPU emulator of the ``rebel`` (rebel-compiler) surface optimum-rbln 0.12 uses for Qwen3-VL.

Usage in-process (a test, a benchmark): call ``qwenvl_rbln.backends.emulator.activate()`` before anything imports
``optimum.rbln`` (or use ``with qwenvl_rbln.backends.emulator.active():``); ``import rebel`` then yields the emulator
and optimum-rbln's real ``RBLNAutoModelForImageTextToText.from_pretrained(..., export=True,
rbln_config={"npu": "RBLN-CR13", ...})`` compiles a (tiny) Qwen3-VL into emulated ``.rbln`` files that
``from_pretrained(dir, export=False)`` loads and ``generate`` runs on the CPU. ``deactivate()`` removes it
again (optimum.rbln modules imported meanwhile stay bound to it). From the CLI: ``--emulate`` on compile,
load-check and infer, or ``QVL_EMULATE_NPU=1``. ``activate()`` refuses (InputError) when a real ``rebel`` is
importable. Tests: ``tests/test_emulator.py``; the negative control sets
``qwenvl_rbln.backends.emulator.rebel_api.state.share_static_buffers = False``.

What it proves and what it does not: optimum-rbln's own host logic (config resolution, wrapping, chunked
prefill, page tables, decoder-batch graphs, the ViT bucket loop, save/load) and qvl's glue run for real.
The NPU's numerics, memory use and compile errors are never emulated: the custom attention ops follow
semantics inferred from optimum-rbln's call sites (``ops.py``), and the memory figures are the byte sizes of
the emulated graphs' tensors. Everything it produces is labelled "emulated".
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Mapping

ENV = "QVL_EMULATE_NPU"
_ACTIVE = False


def requested(flag: bool = False) -> bool:
    """--emulate, or QVL_EMULATE_NPU=1 in the environment."""
    return bool(flag) or os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def is_active() -> bool:
    mod = sys.modules.get("rebel")
    return _ACTIVE and mod is not None and getattr(mod, "EMULATED", False)


def real_rebel_importable() -> bool:
    """A real rebel-compiler on this host (never the emulator itself)."""
    mod = sys.modules.get("rebel")
    if mod is not None:
        return not getattr(mod, "EMULATED", False)
    try:
        return importlib.util.find_spec("rebel") is not None
    except (ImportError, ValueError):
        return False


def refuse_real_rebel(flag_name: str = "--emulate") -> None:
    """InputError when a real rebel-compiler is importable: two rebels in one process is a trap."""
    if real_rebel_importable():
        from qwenvl_rbln.errors import InputError

        raise InputError(
            f"{flag_name} (or {ENV}=1) was given on a host where the real rebel-compiler is installed: two rebels "
            "in one process is a trap",
            f"drop {flag_name} and unset {ENV} to use the NPU, or run the emulator in a virtualenv without "
            "rebel-compiler",
        )


def activate(flag_name: str = "--emulate") -> None:
    """Serve the emulator as ``rebel`` (idempotent); InputError when a real rebel is importable."""
    if is_active():
        return
    refuse_real_rebel(flag_name)
    _install()


def _install() -> None:
    """``rebel`` and its submodules in ``sys.modules``, with the ops optimum-rbln and vllm-rbln call."""
    global _ACTIVE
    from qwenvl_rbln.backends.emulator import engine, ops, rebel_api

    sys.modules["rebel"] = rebel_api  # type: ignore[assignment]
    sys.modules["rebel.compile_context"] = rebel_api.compile_context
    engine.install(rebel_api)  # vllm-rbln's additions: manual_seed, rebel.core.torch_compile
    _ACTIVE = True
    ops.register()


SUBMODULES = ("rebel.compile_context", "rebel.core", "rebel.core.torch_compile")


def deactivate() -> None:
    global _ACTIVE
    if sys.modules.get("rebel") is not None and getattr(sys.modules["rebel"], "EMULATED", False):
        del sys.modules["rebel"]
        for name in SUBMODULES:
            sys.modules.pop(name, None)
    _ACTIVE = False


SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim")  # holds the ``rebel`` shim package


def engine_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What every process of ``vllm serve`` / ``vllm bench serve`` needs to import this emulator as ``rebel``:
    ``SHIM_DIR`` first on PYTHONPATH (kept ahead of the inherited one), and ``QVL_EMULATE_NPU=1`` for qvl's own code
    in them. ``qvl serve --emulate`` adds it to the environment it starts vLLM with."""
    inherited = environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([SHIM_DIR, *([inherited] if inherited else [])]), ENV: "1"}


def serve_as_rebel(shim_dir: str) -> None:
    """Run by the ``rebel`` shim that ``qvl serve --emulate`` puts first on vLLM's PYTHONPATH
    (``emulator/shim/rebel``): every process vLLM starts then imports the emulator as ``rebel``. Refuses (ImportError,
    which stops vLLM with this message) when a real rebel-compiler is installed elsewhere on the path: two rebels in
    one process is a trap, as ``activate`` says."""
    from importlib.machinery import PathFinder

    others = [p for p in sys.path if os.path.realpath(p or ".") != os.path.realpath(shim_dir)]
    if PathFinder.find_spec("rebel", others) is not None:
        raise ImportError(
            "qvl serve --emulate: a real rebel-compiler is installed in this environment; serve without --emulate "
            "(or run the emulator in a virtualenv without rebel-compiler)"
        )
    _install()


@contextlib.contextmanager
def active() -> Iterator[None]:
    was = is_active()
    activate()
    try:
        yield
    finally:
        if not was:
            deactivate()


def quiet_optimum_import() -> contextlib.AbstractContextManager:
    """optimum-rbln warns at import that rebel-compiler has no distribution metadata: expected here."""
    import warnings

    class _Ctx(contextlib.AbstractContextManager):
        def __enter__(self):
            self._cm = warnings.catch_warnings(record=True)
            self._rec = self._cm.__enter__()
            warnings.simplefilter("always")
            return self

        def __exit__(self, *exc):
            self._cm.__exit__(*exc)
            for w in self._rec:
                if "rebel-compiler" in str(w.message):
                    continue
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            return False

    return _Ctx()
