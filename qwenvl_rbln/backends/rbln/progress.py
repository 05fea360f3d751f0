"""Compile stage lines for optimum-rbln's export: which graph is compiling now, and when the KV cache is sized.

Its own module because it hooks into optimum-rbln while the export runs (a wrapped ``RBLNBaseModel.compile`` and
a log handler), apart from the compile call itself in ``rbln``. What it relies on in optimum-rbln 0.12.0:

- Each graph is compiled through ``RBLNBaseModel.compile`` (``modeling_base.py:511-538``), called for the ViT
  (``modeling.py:76``, name ``compiled_model``) and for ``prefill`` / ``decoder_batch_N``
  (``decoderonly/modeling_decoderonly.py:243, 285-330``); KV blocks are sized afterwards when flash attention
  and ``kvcache_num_blocks`` is automatic (``modeling_decoderonly.py:332-333``). optimum-rbln logs no stage
  messages at INFO level (only DEBUG lines during KV sizing, ``modeling_attention_utils.py:253-268, 374-398``), so
  stages are reported by wrapping ``RBLNBaseModel.compile`` for the duration of the export, plus a handler on
  the ``optimum.rbln`` logger for the KV-sizing debug lines when OPTIMUM_RBLN_VERBOSE=debug.
- Importing optimum-rbln's model classes takes seconds; ``import_stage`` gives it a stage of its own.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
from collections.abc import Iterator
from typing import Any


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


def import_stage(progress: Any, model_cls: Any = None) -> None:
    """Importing optimum-rbln's model classes (with torch, transformers and the compiler's Python side) takes
    seconds on the first compile of a process: its own stage, so it is not counted in the stage before it."""
    if model_cls is None and "optimum.rbln.modeling_base" not in sys.modules:
        progress.stage("importing optimum-rbln", "optimum.rbln with torch and transformers, once per process")


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
        if hasattr(progress, "graph_done"):  # the LM graphs and the ViT's one compiled_model
            progress.graphs_planned = len(plan.resolved.graph_names) + 1

        def compile_with_progress(cls: Any, model: Any, rbln_compile_config: Any = None, *args: Any, **kwargs: Any):
            name = getattr(rbln_compile_config, "compiled_model_name", None) or "compiled_model"
            progress.stage(*_stage_label(cls, name, rbln_compile_config, plan))
            result = func(cls, model, rbln_compile_config, *args, **kwargs)
            if hasattr(progress, "graph_done"):
                progress.graph_done()
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
