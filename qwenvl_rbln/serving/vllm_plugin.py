"""vLLM general plugin: the packed ViT forward inside every vLLM process that ``qvl serve`` starts.

vLLM loads every entry point of the group ``vllm.general_plugins`` in each process it creates (API server, engine
core, workers) before the model is built, and calls it (docs.vllm.ai, design/plugin_system). qvl declares one,
``qvl_vit_packing = "qwenvl_rbln.serving.vllm_plugin:register"`` (pyproject.toml). It does nothing unless ``qvl serve``
enabled packing (``QVL_VIT_PACKING=1`` in the environment it execs vllm with), so installing qvl beside vLLM
changes nothing for anyone else. vllm-rbln calls ``self.model.visual(pixel_values, grid_thw=...)`` on the
optimum-rbln model, so patching ``RBLNQwen3VLVisionModel.forward`` on the class reaches it.

``register`` may run several times per process (vLLM warns plugins about that) and never raises: without optimum-rbln
or without qvl's packing module the ViT simply runs unpacked, and one warning line says so.
"""

from __future__ import annotations

import importlib
import os
import sys

ENV = "QVL_VIT_PACKING"
_installed = False


def _warn(message: str) -> None:
    print(f"qvl: warning: {message}", file=sys.stderr, flush=True)


def register() -> None:
    """Install the packed ViT forward on optimum-rbln's vision model class when ``QVL_VIT_PACKING=1``."""
    global _installed
    if _installed or os.environ.get(ENV) != "1":
        return
    try:  # import_module, not `from ... import`: it goes through sys.modules like every plugin import
        vit_packing = importlib.import_module("qwenvl_rbln.backends.vit_packing")
    except ImportError as exc:
        _warn(f"ViT packing requested ({ENV}=1) but this qvl has no packed forward ({exc}); the ViT runs unpacked")
        return
    try:
        vit_packing.install_on_class()
    except ImportError as exc:
        _warn(f"ViT packing requested ({ENV}=1) but optimum-rbln is not importable ({exc}); the ViT runs unpacked")
        return
    except Exception as exc:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        _warn(f"ViT packing could not be installed ({type(exc).__name__}: {exc}); the ViT runs unpacked")
        return
    _installed = True
