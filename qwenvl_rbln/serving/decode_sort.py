"""Inside vLLM: every decode batch sorted by sequence length, as optimum-rbln 0.12 requires of a CR13 decoder.

optimum-rbln 0.12 compiles a flash-attention decoder without an attention mask for RBLN-CR13 with
``_requires_batch_sort: true`` (``transformers/models/decoderonly/modeling_decoderonly.py:575``: the NPU's
in-memory batched attention kernel), and its host code refuses a decode batch whose ``cache_position`` is not
in descending order (``decoderonly_runtime_utils.py:312``, ``_require_sorted_cache_position``). Its own
``generate`` sorts once at prefill; vllm-rbln v0.11.1a1's optimum runner does not sort (``VLLM_RBLN_SORT_BATCH``
is read only on the vLLM-model path, ``v1/worker/rbln_model_runner.py:735``), so the second request decoding
beside a longer one ends the engine. Every Model-Zoo preset compiles that way.

The fix, with ``QVL_SORT_DECODE=1`` (set by ``qvl serve`` for an artifact compiled with that requirement and a
batch above 1): qvl's plugin wraps the Qwen-VL model's ``forward`` of vllm-rbln's optimum path
(``model_executor/models/optimum/qwen_vl.py``, ``RBLNOptimumQwenVLForConditionalGeneration.forward``, which the
runner calls once per step with the batch as a ``ModelInputForRBLN``). For a decode step whose positions are not
already descending it reorders the rows (tokens, positions, block tables, request ids, and the LoRA adapter ids
vllm-rbln set on the decoder: each row keeps its own block table and adapter, so the KV cache is read exactly as
before), runs the step, and puts the logits (and the adapter ids) back in the runner's
order. Cost: one ``argsort`` of at most ``batch_size`` numbers and a few row gathers per decode step, microseconds
beside a decoder call; no recompile, no other graph, the tokens unchanged (the engine tests compare them).

A vllm-rbln without that class gets one warning saying what is then at risk; nothing here raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

SORT_ENV = "QVL_SORT_DECODE"  # "1": sort every decode batch (qvl serve sets it from the artifact)
TARGET_MODULE = "vllm_rbln.model_executor.models.optimum.qwen_vl"
TARGET_CLASS = "RBLNOptimumQwenVLForConditionalGeneration"
MARK = "__qvl_sorted_decode__"


def compiled_with_sort(npu: str, attn_impl: str, use_attention_mask: bool = False) -> bool:
    """What optimum-rbln 0.12 resolves ``_requires_batch_sort`` to at compile (``modeling_decoderonly.py:575``:
    a generating model, RBLN-CR13 or later (``npu_is_cr13_or_later``: every CR but CR0x), flash attention, no
    attention mask): for a line built before the compile (``qvl tune``)."""
    later_cr = npu.startswith("RBLN-CR") and not npu.startswith("RBLN-CR0")
    return later_cr and attn_impl == "flash_attn" and not use_attention_mask


def needs_sort(cfg: dict[str, Any]) -> bool:
    """Whether an artifact's decoder refuses unsorted decode batches (and has more than one row to sort)."""
    return bool(cfg.get("_requires_batch_sort")) and int(cfg.get("batch_size") or 1) > 1


def sorted_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` with each unsorted decode batch run longest first and its logits returned in the caller's order."""

    @functools.wraps(original)
    def forward(self: Any, model_input: Any, **kwargs: Any) -> Any:
        positions = getattr(model_input, "input_positions", None)
        if getattr(model_input, "is_prompt", True) or positions is None or positions.shape[0] < 2:
            return original(self, model_input, **kwargs)
        lengths = positions.reshape(positions.shape[0], -1)[:, 0]
        if bool((lengths[:-1] >= lengths[1:]).all()):
            return original(self, model_input, **kwargs)
        import torch

        order = torch.argsort(lengths, descending=True, stable=True)
        ids = list(model_input.running_requests_ids)
        reordered = dataclasses.replace(
            model_input,
            input_tokens=model_input.input_tokens[order],
            input_positions=positions[order],
            block_tables=model_input.block_tables[order],
            running_requests_ids=[ids[i] for i in order.tolist()],
        )
        with _adapters_moved(getattr(self, "model", None), order):
            logits = original(self, reordered, **kwargs)
        return logits[torch.argsort(order)]

    setattr(forward, MARK, True)
    return forward


@contextlib.contextmanager
def _adapters_moved(model: Any, order: Any) -> Iterator[None]:
    """The LoRA adapter ids moved with their rows for one step, then put back in the runner's order.

    vllm-rbln sets them on optimum-rbln's model in its own row order (``optimum_model_runner.py`` ``set_active_loras``
    -> ``set_lora_int_ids``, padded with 0 to the batch), and the decoder reads them from there when the call passes
    none (``decoderonly_runtime_utils.py`` ``decode_forward``), as vllm-rbln's Qwen-VL call does; optimum-rbln's own
    sort moves ``lora_int_ids`` with the rows too (``generation_decoderonly.py`` ``_batch_sortable_kwargs``). Without
    this, a sorted row would decode with another request's adapter. A model without LoRA has none: nothing moves."""
    adapters = getattr(model, "lora_int_ids", None)
    if adapters is None or not hasattr(adapters, "clone") or adapters.shape[0] < order.shape[0]:
        yield
        return
    moved = adapters.clone()
    moved[: order.shape[0]] = adapters[: order.shape[0]][order]
    model.set_lora_int_ids(moved)
    try:
        yield
    finally:
        model.set_lora_int_ids(adapters)


def install(warn: Callable[[str], None]) -> bool:
    """With ``QVL_SORT_DECODE=1``: sort every decode batch in this process (idempotent); False, with one warning,
    when this vllm-rbln has no such class."""
    if os.environ.get(SORT_ENV) != "1":
        return False
    risk = (
        "decode batches reach optimum-rbln unsorted, and a decoder compiled with _requires_batch_sort ends the "
        "engine at the first two requests of different lengths (a batch_size 1 compile avoids it)"
    )
    try:
        cls = getattr(importlib.import_module(TARGET_MODULE), TARGET_CLASS)
    except Exception as exc:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        warn(f"{SORT_ENV}=1: {TARGET_MODULE}.{TARGET_CLASS} is not importable ({type(exc).__name__}: {exc}); {risk}")
        return False
    if not getattr(cls.forward, MARK, False):
        cls.forward = sorted_forward(cls.forward)
    return True
