"""The torch reference backend: transformers ``Qwen3VLForConditionalGeneration`` on CPU (CUDA when present).

It is the accuracy reference an NPU run is compared with (``qvl compare``), so it takes exactly the
same processor inputs as the rbln backend (``inputs.build_inputs`` with the plan's pixel caps) and
decodes greedily by default. Batches are left padded (no padding copies: the torch model has no
static decoder graph; the report still says what the NPU's graph would be).

Loaded models are cached per process (key: directory, file stamps, device), so several ``infer`` runs
in one process (tests, benchmarks) load once.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import IO, Any

from qwenvl_rbln.errors import BackendError, DependencyMissing, InputError
from qwenvl_rbln.inference.generation import BatchResult, GenerationOptions, VisionTimer, generate_batch
from qwenvl_rbln.inference.model_stamp import model_stamp
from qwenvl_rbln.paths import user_path

TORCH_INSTALL_HINT = "pip install torch torchvision transformers==5.15.1 (or `pip install 'qwenvl-rbln[torch]'`)"

_CACHE: dict[tuple[Any, ...], tuple[Any, Any]] = {}


DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?")


def device_spelling(value: str | None, flag: str = "--torch-device") -> str | None:
    """``value`` when it is cpu, cuda or cuda:N (nothing else runs Qwen3-VL here); InputError otherwise."""
    if value is None:
        return None
    dev = value.strip().lower()
    if not DEVICE_RE.fullmatch(dev):
        fix = "cpu, cuda or cuda:N (N: a GPU index)"
        hint = f"use --torch-device {fix}" if flag.startswith("--") else f"set {flag} to {fix}, or unset it"
        raise InputError(f"{flag} {value!r} is not cpu, cuda or cuda:N", hint)
    return dev


def _check_cuda(dev: str, flag: str) -> None:
    """InputError (exit 2: a wrong flag, not a missing package) when the asked-for GPU is not there."""
    import torch

    if not dev.startswith("cuda"):
        return
    from_env = not flag.startswith("--")  # $QVL_TORCH_DEVICE: leaving the flag out changes nothing
    if not torch.cuda.is_available():
        raise InputError(
            f"{flag} {dev}: no CUDA GPU is available (torch {torch.__version__}, CUDA build "
            f"{torch.version.cuda or 'none'})",
            _no_cuda_hint(flag),
        )
    index = int(dev.split(":")[1]) if ":" in dev else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise InputError(
            f"{flag} {dev}: this machine has {count} CUDA GPU{'s' if count != 1 else ''}",
            f"set {flag} to an index below {count}, e.g. cuda:0, or unset it"
            if from_env
            else f"use an index below {count}, e.g. --torch-device cuda:0",
        )


def _no_cuda_hint(flag: str) -> str:
    """The fix for a CUDA device asked for where none is: the way back to the CPU depends on where it was asked."""
    if not flag.startswith("--"):
        return f"unset {flag} or set it to cpu (or pass --torch-device cpu)"
    if (os.environ.get("QVL_TORCH_DEVICE") or "").strip().lower() not in ("", "cpu"):  # leaving the flag out
        # would pick up the environment's GPU
        return "run on the CPU with --torch-device cpu"
    return "run on the CPU with --torch-device cpu (or leave --torch-device out: cuda when available, else cpu)"


def torch_device(requested: str | None = None) -> str:
    """``requested``, else $QVL_TORCH_DEVICE, else cuda when available, else cpu; checked against the machine."""
    import torch

    flag = "--torch-device" if requested else "QVL_TORCH_DEVICE"
    dev = device_spelling(requested or os.environ.get("QVL_TORCH_DEVICE") or None, flag)
    if dev:
        _check_cuda(dev, flag)
        return dev
    return "cuda" if torch.cuda.is_available() else "cpu"


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise DependencyMissing(
            f"the torch reference backend needs {exc.name or 'torch'}, which is not installed", TORCH_INSTALL_HINT
        ) from None


def load_reference(model_dir: Path, device: str | None = None) -> tuple[Any, Any, str]:
    """(model, processor, device) for a local Qwen3-VL directory in Hugging Face format (cached)."""
    from qwenvl_rbln.inference.inputs import shared_processor
    from qwenvl_rbln.planning.catalogue.modelinfo import read_model_config

    model_dir = user_path(model_dir).absolute()
    cfg = read_model_config(model_dir)  # InputError unless config.json says qwen3_vl or qwen3_vl_moe
    _require_torch()
    dev = torch_device(device)
    key = (str(model_dir), model_stamp(model_dir), dev)
    if key in _CACHE:
        model, processor = _CACHE[key]
        return model, processor, dev

    from transformers.utils import logging as hf_logging

    from qwenvl_rbln.backends.tiny.moe import model_class

    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        cls = model_class(cfg.get("model_type") == "qwen3_vl_moe")  # Qwen3VL(Moe)ForConditionalGeneration
        model = cls.from_pretrained(str(model_dir), dtype="auto", local_files_only=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise BackendError(
            f"transformers could not load {model_dir}: {type(exc).__name__}: {first}",
            "the directory needs config.json, the weights (model.safetensors) and the processor/tokenizer files; "
            "recompile it (`qvl compile --force`)",
        ) from None
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    processor = shared_processor(model_dir)  # checked; the same one the prompt count before the load used
    model = model.to(dev).eval()
    _CACHE.clear()  # one model per process is enough
    _CACHE[key] = (model, processor)
    return model, processor, dev


def visual_module(model: Any) -> Any | None:
    """The vision tower (``model.model.visual`` in transformers 5; ``model.visual`` in 4.x)."""
    inner = getattr(model, "model", None)
    return getattr(inner, "visual", None) or getattr(model, "visual", None)


class ReferenceBackend:
    """transformers generate on a local directory, with the plan's pixel caps."""

    name = "torch"

    def __init__(self, model_dir: Path, caps: Any, *, device: str | None = None):
        from qwenvl_rbln.inference.inputs import load_processor

        self.model_dir = Path(model_dir)
        self.model, _, self.device = load_reference(self.model_dir, device)
        self.processor = load_processor(self.model_dir, caps)  # the shared one, with this run's caps
        self.caps = caps
        sync = None
        if self.device.startswith("cuda"):
            import torch

            sync = torch.cuda.synchronize
            torch.cuda.reset_peak_memory_stats()
        self.timer = VisionTimer(sync=sync)
        visual = visual_module(self.model)
        if visual is not None:
            self.timer.hook_module(visual)

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    def describe(self) -> dict[str, Any]:
        dtype = str(next(self.model.parameters()).dtype).replace("torch.", "")
        return {"backend": "torch", "device": self.device, "dtype": dtype, "class": type(self.model).__name__}

    def run_batch(
        self,
        requests: list[Any],
        gen: GenerationOptions,
        *,
        sink: IO[str] | None = None,
        max_seq_len: int | None = None,
        stream_prefix: str = "",
    ) -> BatchResult:
        return generate_batch(
            self.model,
            self.processor,
            requests,
            gen,
            pad_to=None,
            timer=self.timer,
            sink=sink,
            device=self.device,
            max_seq_len=max_seq_len,
            strict_length=True,  # as on the NPU: refused before generate, not minutes later
            stream_prefix=stream_prefix,
            caps=self.caps,
        )

    def memory(self) -> dict[str, Any]:
        return peak_memory(self.device)

    def close(self) -> None:
        self.timer.remove()


def peak_memory(device: str = "cpu") -> dict[str, Any]:
    """Peak resident set size of this process (and peak CUDA allocation on a GPU)."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_bytes = rss if sys.platform == "darwin" else rss * 1024
    out: dict[str, Any] = {"source": "process", "peak_rss_bytes": int(rss_bytes)}
    if device.startswith("cuda"):
        import torch

        out["cuda_peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    return out
