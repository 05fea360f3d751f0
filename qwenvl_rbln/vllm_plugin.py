"""vLLM general plugin: qvl inside every vLLM process that ``qvl serve`` starts.

The ``vllm.general_plugins`` entry point ``qvl_vit_packing = "qwenvl_rbln.vllm_plugin:register"``
(pyproject.toml). It sits in the top layer because it composes two lower ones that must not know each other:
serving's part (``serving/vllm_plugin.py``: the per-frame video cap, the environment switches) and the packed ViT
forward on optimum-rbln's vision model class (``backends/vit_packing.py``), installed when ``qvl serve`` set
``QVL_VIT_PACKING=1``. vllm-rbln calls ``self.model.visual(pixel_values, grid_thw=...)`` on the optimum-rbln model,
so patching ``RBLNQwen3VLVisionModel.forward`` on the class reaches it.

``register`` may run several times per process (vLLM warns plugins about that) and never raises: without optimum-rbln
or without qvl's packing module the ViT simply runs unpacked, and one warning line says so. Loading it imports
neither torch, transformers, optimum nor vLLM.
"""

from __future__ import annotations

import importlib
import os

from qwenvl_rbln.serving import vllm_plugin as serving_plugin
from qwenvl_rbln.serving.options import PACKING_ENV as ENV

_installed = False


TIME_MODEL_ENV = "QVL_EMULATE_TIME_MODEL"  # backends/emulator/timed.py's switch (read there, named here)


def register() -> None:
    """Install the per-frame video cap (``QVL_FRAME_CAP=1``), the timed emulator's time-model reader where
    ``QVL_EMULATE_TIME_MODEL`` is set, and the packed ViT forward on optimum-rbln's vision model class when
    ``QVL_VIT_PACKING=1``."""
    global _installed
    try:
        serving_plugin.register()
    except Exception as exc:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        serving_plugin.warn(f"the per-frame video cap failed ({type(exc).__name__}: {exc})")
    if os.environ.get(TIME_MODEL_ENV):
        register_time_model_reader()
    if _installed or os.environ.get(ENV) != "1":
        return
    warn = serving_plugin.warn
    try:  # import_module, not `from ... import`: it goes through sys.modules like every plugin import
        vit_packing = importlib.import_module("qwenvl_rbln.backends.vit_packing")
    except ImportError as exc:
        warn(f"ViT packing requested ({ENV}=1) but this qvl has no packed forward ({exc}); the ViT runs unpacked")
        return
    try:
        vit_packing.install_on_class()
    except ImportError as exc:
        warn(f"ViT packing requested ({ENV}=1) but optimum-rbln is not importable ({exc}); the ViT runs unpacked")
        return
    except Exception as exc:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        warn(f"ViT packing could not be installed ({type(exc).__name__}: {exc}); the ViT runs unpacked")
        return
    _installed = True


def register_time_model_reader() -> None:
    """The emulator (a backend) reads its device-time model through the tuning layer's reader, given here from the
    top so neither imports the other; both modules are pure Python (no torch)."""
    timed = importlib.import_module("qwenvl_rbln.backends.emulator.timed")
    device_time = importlib.import_module("qwenvl_rbln.tuning.device_time")
    timed.set_reader(device_time.DeviceTimeModel.from_json)
