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
from collections.abc import Iterator

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


def activate(flag_name: str = "--emulate") -> None:
    """Serve the emulator as ``rebel`` (idempotent); InputError when a real rebel is importable."""
    global _ACTIVE
    if is_active():
        return
    if real_rebel_importable():
        from qwenvl_rbln.errors import InputError

        raise InputError(
            f"{flag_name} (or {ENV}=1) was given on a host where the real rebel-compiler is installed: two rebels "
            "in one process is a trap",
            f"drop {flag_name} and unset {ENV} to use the NPU, or run the emulator in a virtualenv without "
            "rebel-compiler",
        )
    from qwenvl_rbln.backends.emulator import ops, rebel_api

    sys.modules["rebel"] = rebel_api  # type: ignore[assignment]
    sys.modules["rebel.compile_context"] = rebel_api.compile_context
    _ACTIVE = True
    ops.register()


def deactivate() -> None:
    global _ACTIVE
    if sys.modules.get("rebel") is not None and getattr(sys.modules["rebel"], "EMULATED", False):
        del sys.modules["rebel"]
        sys.modules.pop("rebel.compile_context", None)
    _ACTIVE = False


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
