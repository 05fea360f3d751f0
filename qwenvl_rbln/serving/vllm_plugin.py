"""vLLM general plugin: the packed ViT forward inside every vLLM process that ``qvl serve`` starts.

vLLM loads every entry point of the group ``vllm.general_plugins`` in each process it creates (API server, engine
core, workers) before the model is built, and calls it (docs.vllm.ai, design/plugin_system). qvl declares one,
``qvl_vit_packing = "qwenvl_rbln.serving.vllm_plugin:register"`` (pyproject.toml). It does nothing unless ``qvl serve``
enabled packing (``QVL_VIT_PACKING=1`` in the environment it execs vllm with), so installing qvl beside vLLM
changes nothing for anyone else. vllm-rbln calls ``self.model.visual(pixel_values, grid_thw=...)`` on the
optimum-rbln model, so patching ``RBLNQwen3VLVisionModel.forward`` on the class reaches it.

``register`` may run several times per process (vLLM warns plugins about that) and never raises: without optimum-rbln
or without qvl's packing module the ViT simply runs unpacked, and one warning line says so.

It also installs qvl's per-frame video cap (``vision/frame_cap.py``) on transformers' ``Qwen3VLVideoProcessor``, in
every process ``qvl serve`` starts (``QVL_FRAME_CAP=1``, whatever ``QVL_VIT_PACKING`` says): vLLM's Qwen3-VL
processor loads the video processor from the artifact, whose config carries ``qvl_max_frame_pixels`` (written by
``qvl compile``), and the patched resize caps each frame at it, so every temporal patch fits the largest compiled
bucket. A processor without that key runs unchanged.
"""

from __future__ import annotations

import importlib
import os
import sys

ENV = "QVL_VIT_PACKING"
FRAME_CAP_ENV = "QVL_FRAME_CAP"  # "1" from qvl serve: cap each video frame at the artifact's qvl_max_frame_pixels
_installed = False


def _warn(message: str) -> None:
    print(f"qvl: warning: {message}", file=sys.stderr, flush=True)


def install_frame_cap() -> bool:
    """The per-frame video cap on transformers' video processor class; False (with one warning) when it cannot be."""
    try:
        frame_cap = importlib.import_module("qwenvl_rbln.vision.frame_cap")
        frame_cap.install_on_class()
    except Exception as exc:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        _warn(
            f"the per-frame video cap could not be installed ({type(exc).__name__}: {exc}); short high-resolution "
            "videos may exceed the largest ViT bucket"
        )
        return False
    return True


def register() -> None:
    """Install the per-frame video cap, and the packed ViT forward on optimum-rbln's vision model class when
    ``QVL_VIT_PACKING=1``."""
    global _installed
    if os.environ.get(FRAME_CAP_ENV) == "1":
        install_frame_cap()
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
