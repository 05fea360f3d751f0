"""The serving half of qvl's vLLM plugin: the per-frame video cap, the decode batch sort, what `qvl serve` sets.

vLLM loads every entry point of the group ``vllm.general_plugins`` in each process it creates (API server, engine
core, workers) before the model is built, and calls it (docs.vllm.ai, design/plugin_system). qvl's entry point is
``qwenvl_rbln.vllm_plugin:register`` (pyproject.toml), a top-layer module: it composes this module (serving) with
the packed ViT forward (``backends/vit_packing``), since serving never reaches into a backend. Nothing here acts
unless ``qvl serve`` asked for it in the environment it execs vllm with, so installing qvl beside vLLM changes
nothing for anyone else, and nothing here raises: a plugin must never stop vLLM from starting.

``QVL_FRAME_CAP=1``: qvl's per-frame video cap (``vision/frame_cap.py``) on transformers' Qwen3-VL and Qwen2-VL
video processor classes. vLLM's Qwen3-VL processor loads the video processor from the artifact, whose config
carries ``qvl_max_frame_pixels`` (written by ``qvl compile``), and the patched resize caps each frame at it, so
every temporal patch fits the largest compiled bucket. ``QVL_MAX_FRAME_PIXELS=<int>`` (set by ``qvl serve`` for
an artifact whose processor files were written outside qvl) caps every such processor that has no smaller cap of
its own; a bad value is one warning line, and that default is then not applied.

``QVL_SORT_DECODE=1`` (set by ``qvl serve`` for a decoder compiled with ``_requires_batch_sort``): every decode
batch reaches optimum-rbln longest first (``serving/decode_sort.py``).

``QVL_RESUME_MM=1`` (set by ``qvl serve`` for an artifact whose KV pool can preempt): a request vLLM preempted is
recomputed with its images and videos, not as text (``serving/resume_features.py``).

``QVL_LISTEN_FD=<fd>`` (set by ``qvl serve`` for the socket it bound and listens on since its port check): vLLM's
API server serves on that socket instead of binding the port again (``serving/port.py`` says why).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from qwenvl_rbln.serving import decode_sort, port, resume_features, step_log
from qwenvl_rbln.serving.options import FRAME_CAP_ENV, MAX_FRAME_PIXELS_ENV


def warn(message: str) -> None:
    """One ``qvl: warning:`` line on stderr (vLLM's processes share it)."""
    print(f"qvl: warning: {message}", file=sys.stderr, flush=True)


def positive_int_env(name: str, what: str, warn: Callable[[str], None]) -> int | None:
    """Environment variable ``name`` as a positive int; None when unset, or (with one warning saying ``what`` then
    happens) when it is not one."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        warn(f"{name}={raw!r} is not a positive integer; ignored, so {what}")
        return None
    return value


def default_frame_pixels() -> int | None:
    """``QVL_MAX_FRAME_PIXELS`` (pixels per video frame) as a positive int; None when unset or not one."""
    what = "processors without qvl_max_frame_pixels in their config run uncapped"
    return positive_int_env(MAX_FRAME_PIXELS_ENV, what, warn)


def install_frame_cap() -> bool:
    """The per-frame video cap on transformers' video processor classes; False (with one warning) when it cannot be."""
    try:
        frame_cap = importlib.import_module("qwenvl_rbln.vision.frame_cap")
        frame_cap.set_default_cap(default_frame_pixels())
        frame_cap.install_on_class()
    except Exception as exc:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        warn(
            f"the per-frame video cap could not be installed ({type(exc).__name__}: {exc}); short high-resolution "
            "videos may exceed the largest ViT bucket"
        )
        return False
    return True


def register() -> None:
    """Serve on qvl's listening socket (``QVL_LISTEN_FD``), install the per-frame video cap (``QVL_FRAME_CAP=1``),
    the decode batch sort (``QVL_SORT_DECODE=1``), the resumed request's features (``QVL_RESUME_MM=1``) and the
    engine-step log (``QVL_STEP_LOG=DIR``, ``step_log.py``)."""
    try:
        port.adopt_in_vllm(warn)
    except Exception as exc:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        warn(f"qvl's listening socket could not be handed to vLLM ({type(exc).__name__}: {exc})")
    if os.environ.get(FRAME_CAP_ENV) == "1":
        install_frame_cap()
    decode_sort.install(warn)  # QVL_SORT_DECODE unset: nothing to sort, nothing said
    resume_features.install(warn)  # QVL_RESUME_MM unset: a full pool, nothing preempts, nothing said
    step_log.install(warn)  # QVL_STEP_LOG unset: nothing logged
