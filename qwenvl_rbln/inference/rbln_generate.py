"""The rbln backend of ``qvl infer``: optimum-rbln's own ``generate`` on compiled artifacts.

What optimum-rbln 0.12.0 does and qvl therefore does around it (reference section 3):

* Loading: ``backends.rbln.load_model(dir, device, visual_device)`` =
  ``RBLNAutoModelForImageTextToText.from_pretrained(dir, export=False,
  rbln_config={"visual": {"device": V}, "device": D})``, the placement of ``qvl load-check``.
* Batch: Qwen3-VL's ``generate`` always decodes with ``decoder_batch_{batch_size}`` and requires the input
  batch to equal the compiled ``batch_size`` ("Cache position size mismatch"). qvl pads a short batch
  with text-only rows (the shortest real prompt, no image or video: a padded row costs no ViT call) and
  drops their outputs; the report names the graph and the padded rows.
* ViT: each image / video temporal patch runs in the smallest compiled bucket >= its patches; an input
  above the largest bucket raises inside optimum-rbln, so the processor is capped beforehand
  (``vision_report.plan_vision``, ``--on-oversize resize|error``).
* Length: a prompt + ``max_new_tokens`` above the compiled ``max_seq_len`` is refused before generate.
* ViT packing (``backends.vit_packing``, on unless ``vit_packing=False``): the loaded ``visual`` packs each
  call's segments into shared compiled calls; every batch reports the graph calls actually made and each pack,
  and ``timings.vision_calls`` is that count of graph calls.

optimum-rbln and rebel are imported only through ``backends.rbln`` (``model_cls`` injects a fake in tests).
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

from qwenvl_rbln.inference.generation import BatchResult, GenerationOptions, TimedProxy, VisionTimer, generate_batch


def wrap_visual(model: Any, timer: VisionTimer) -> bool:
    """Time the ``visual`` submodule's calls; False when it cannot be wrapped (then vision_s stays 0)."""
    visual = getattr(model, "visual", None)
    if visual is None or not callable(visual):
        return False
    try:
        model.visual = TimedProxy(visual, timer)
        return True
    except Exception:  # noqa: BLE001 - e.g. an nn.Module refusing a non-module child
        if hasattr(visual, "register_forward_hook"):
            timer.hook_module(visual)
            return True
        return False


def vit_report(log: Any, packing: bool) -> dict[str, Any] | None:
    """One batch's ViT work from the packed forward's log: graph calls, and each pack (bucket, segments, padding)."""
    if log is None:
        return None
    entries = log.drain()
    return {
        "packing": packing,
        "graph_calls": sum(e["graph_calls"] for e in entries),
        "unpacked_calls": sum(e["unpacked_calls"] for e in entries),
        "visual_calls": entries,
    }


class GraphCallCounter:
    """Counts the compiled ViT graph's calls by wrapping its runtime (``visual.transformer``, ``visual.model[0]``),
    so ``timings.vision_calls`` stays the number of graph runs whatever calls it (optimum-rbln's per-image
    loop, or a packed forward)."""

    def __init__(self, runtime: Any):
        self._runtime = runtime
        self.count = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        return self._runtime(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)


def count_graph_calls(model: Any) -> GraphCallCounter | None:
    """Wrap the loaded ``visual`` submodule's runtime in a counter (None when there is none to wrap, e.g. a fake)."""
    visual = getattr(model, "visual", None)
    runtimes = getattr(visual, "model", None)
    runtime = getattr(visual, "transformer", None)
    if runtime is None and isinstance(runtimes, list) and runtimes:
        runtime = runtimes[0]
    if runtime is None or not callable(runtime) or type(runtime).__name__ == "UnavailableRuntime":
        return None
    counter = GraphCallCounter(runtime)
    try:
        if getattr(visual, "transformer", None) is runtime:
            visual.transformer = counter
        if isinstance(runtimes, list) and runtimes and runtimes[0] is runtime:
            runtimes[0] = counter
    except Exception:  # noqa: BLE001 - a module refusing the attribute: then visual() calls are counted
        return None
    return counter


class RblnBackend:
    """Compiled artifacts on Rebel100 NPUs through optimum-rbln's generate."""

    name = "rbln"

    def __init__(
        self,
        artifact_dir: Path,
        caps: Any,
        *,
        batch_size: int,
        device: Any,
        visual_device: Any,
        model_cls: Any = None,
        vit_packing: bool = True,
    ):
        from qwenvl_rbln.backends.rbln import optimum as rbln_backend
        from qwenvl_rbln.inference.inputs import load_processor

        self.artifact_dir = Path(artifact_dir)
        self.batch_size = batch_size
        self.placement = {"device": device, "visual_device": visual_device}
        self.load_rbln_config = rbln_backend.load_rbln_config(device, visual_device, True)
        # the processor first: a broken processor must not cost an NPU load
        self.caps = caps
        self.processor = load_processor(self.artifact_dir, caps)
        self.model = rbln_backend.load_model(
            self.artifact_dir, device, visual_device, create_runtimes=True, model_cls=model_cls
        )
        self.graph_calls = count_graph_calls(self.model)  # before anything else wraps visual
        from qwenvl_rbln.backends.vit_packing import install_on_instance

        self.vit_packing = vit_packing
        self.last_vit: dict[str, Any] | None = None
        self.vit_log = install_on_instance(getattr(self.model, "visual", None), enabled=vit_packing)
        self.timer = VisionTimer()
        self.vision_timed = wrap_visual(self.model, self.timer)

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "rbln",
            "class": type(self.model).__name__,
            "placement": self.placement,
            "load_rbln_config": self.load_rbln_config,
            "vision_timed": self.vision_timed,
            "vit_packing": self.vit_packing if self.vit_log is not None else None,
        }

    def run_batch(
        self,
        requests: list[Any],
        gen: GenerationOptions,
        *,
        sink: IO[str] | None = None,
        max_seq_len: int | None = None,
        stream_prefix: str = "",
    ) -> BatchResult:
        """Generate for up to ``batch_size`` requests; the batch handed to generate is exactly ``batch_size``."""
        if len(requests) > self.batch_size:
            raise ValueError(f"{len(requests)} requests in one batch; the artifact runs {self.batch_size}")
        if self.vit_log is not None:
            self.vit_log.drain()
        if self.graph_calls is not None:
            self.graph_calls.count = 0
        result = generate_batch(
            self.model,
            self.processor,
            requests,
            gen,
            pad_to=self.batch_size,
            timer=self.timer,
            sink=sink,
            device=None,
            max_seq_len=max_seq_len,
            strict_length=True,
            stream_prefix=stream_prefix,
            caps=self.caps,
        )
        self.last_vit = vit_report(self.vit_log, self.vit_packing)
        if self.last_vit is not None:  # the compiled ViT graph calls actually made, not visual() calls
            result.timings["vision_calls"] = self.last_vit["graph_calls"]
        if self.graph_calls is not None:  # counted at the compiled graph itself
            result.timings["vision_calls"] = self.graph_calls.count
        return result

    def close(self) -> None:
        self.timer.remove()
