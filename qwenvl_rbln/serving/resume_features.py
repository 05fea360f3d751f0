"""Inside vLLM: a preempted image or video request is recomputed with its pixels and grid, not as text.

When a decode step needs a KV block and none is free, vLLM's scheduler preempts a running request: its blocks are
freed and it is recomputed later, its prompt and the tokens it generated prefilled again. vllm-rbln 0.11.1a1's
optimum runner sends that recompute as a cached request (``v1/worker/optimum_model_runner.py``, ``_prepare_prefill``:
"Request ... is resumed."), and ``_extract_mm_kwargs`` reads the multimodal inputs of new requests only. So the
recompute gets no pixels and no grid: on Qwen3-VL transformers' ``get_rope_index`` raises (``'NoneType' object is
not an iterator``), the EngineCore dies, and every request in flight gets 500; where it did not raise, the image
placeholders would be prefilled as text and the answer would change silently (upstream audit 2026-12-06, W4).

The fix, with ``QVL_RESUME_MM=1`` (set by ``qvl serve`` for an artifact whose KV pool can preempt,
``can_preempt``): qvl's plugin wraps ``RBLNOptimumModelRunner._extract_mm_kwargs``. For a prefill step that resumes
a request and got nothing from the original method, it calls it again with that request's kept state standing as
the step's new request: the runner's ``self.requests[req_id]``, whose ``mm_features`` (pixels, grid) the runner
stored from the request's ``NewRequestData`` when it was first scheduled and keeps across a preemption ("keep their
cached states since they will be scheduled again"). That is the per-request cache: the runner fills it when a
request is first scheduled and pops it when the request finishes or is aborted (both come as ``finished_req_ids``),
so it holds only requests the runner knows, and qvl keeps no second copy that could outlive them. The same batching
code (``group_and_batch_mm_kwargs``) then builds the step's kwargs, so the recompute runs the ViT again on the same
pixels and rebuilds the same M-RoPE positions: the answer equals the uninterrupted one (the engine test compares).

Cost: one dictionary look-up per prefill step, and a second call of the method on a resumed one; nothing else
changes. A vllm-rbln that fixes this itself returns the features on the first call, and qvl adds nothing. A
vllm-rbln without that method gets one warning saying what is then at risk; nothing here raises.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
from collections.abc import Callable
from typing import Any

RESUME_ENV = "QVL_RESUME_MM"  # "1": a resumed request gets its multimodal features again (qvl serve sets it)
TARGET_MODULE = "vllm_rbln.v1.worker.optimum_model_runner"
TARGET_CLASS = "RBLNOptimumModelRunner"
TARGET_METHOD = "_extract_mm_kwargs"
MARK = "__qvl_resumed_features__"


def pool_blocks(cfg: dict[str, Any]) -> tuple[int, int, int]:
    """(blocks in the compiled pool, blocks one sequence of max_seq_len takes, blocks the batch takes at once)."""
    block = cfg.get("kvcache_block_size") or cfg.get("kvcache_partition_len") or cfg["max_seq_len"]
    per_seq = math.ceil(cfg["max_seq_len"] / block)
    return int(cfg.get("kvcache_num_blocks") or 0), per_seq, int(cfg.get("batch_size") or 1) * per_seq


def can_preempt(cfg: dict[str, Any]) -> bool:
    """Whether vLLM can preempt on this artifact: its pool is short of batch_size x max_seq_len. A full pool never
    preempts (vllm-rbln then hands vLLM one block more for its null block, so every row fits at max_seq_len);
    ``kvcache_num_blocks`` 0 (not yet resolved) is taken as full."""
    blocks, _, full = pool_blocks(cfg)
    return 0 < blocks < full


def check_line(cfg: dict[str, Any], plugin: str) -> str:
    """Serve's dry-run line for an artifact that ``can_preempt``: the pool, what vllm-rbln does, what qvl does."""
    blocks, per_seq, full = pool_blocks(cfg)
    return (
        f"{RESUME_ENV}=1: the KV pool ({blocks} blocks) is short of batch_size {cfg['batch_size']} x {per_seq} blocks "
        f"({full}), so vLLM preempts a running request when blocks run out and recomputes it later; vllm-rbln's "
        "optimum runner gives that recompute no images or videos (the engine dies on it), so the "
        f"{plugin} plugin gives it its pixels and grid again in every vLLM process (its ViT runs again)"
    )


def resumed_request(scheduler_output: Any) -> str | None:
    """The id of the request a prefill step resumes from preemption; None for any other step (vllm-rbln prefills
    one request per step: a new one, or one cached request that was resumed)."""
    if scheduler_output is None or getattr(scheduler_output, "scheduled_new_reqs", None):
        return None
    cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
    resumed = list(getattr(cached, "resumed_req_ids", None) or ())
    if cached is None or getattr(cached, "num_reqs", 0) != 1 or len(resumed) != 1:
        return None
    return resumed[0]


class _Resumed:
    """The step's scheduler output as vllm-rbln's method reads it, with the resumed request's kept state (which has
    the ``req_id`` and ``mm_features`` a ``NewRequestData`` has) standing as its one new request."""

    def __init__(self, output: Any, state: Any) -> None:
        self._output = output
        self.scheduled_new_reqs = [state]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._output, name)


def with_resumed_features(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` that, for a resumed request it found nothing for, reads the features the runner kept for it.
    A vllm-rbln that already gives a resumed request its features is left to do so (never twice)."""

    @functools.wraps(original)
    def extract(self: Any, scheduler_output: Any) -> Any:
        found = original(self, scheduler_output)
        req_id = resumed_request(scheduler_output) if not found else None
        state = getattr(self, "requests", {}).get(req_id) if req_id is not None else None
        if not getattr(state, "mm_features", None):  # not a resumed step, or a text request: vllm-rbln's answer
            return found
        return original(self, _Resumed(scheduler_output, state))

    setattr(extract, MARK, True)
    return extract


def install(warn: Callable[[str], None]) -> bool:
    """With ``QVL_RESUME_MM=1``: resumed requests get their features in this process (idempotent); False, with one
    warning, when this vllm-rbln has no such method."""
    if os.environ.get(RESUME_ENV) != "1":
        return False
    risk = (
        "a preempted image or video request is recomputed without its images (vllm-rbln passes none) and ends the "
        "engine; a full KV pool (kvcache_num_blocks >= batch_size x max_seq_len / block) never preempts"
    )
    try:
        cls = getattr(importlib.import_module(TARGET_MODULE), TARGET_CLASS)
        method = getattr(cls, TARGET_METHOD)
    except Exception as exc:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        where = f"{TARGET_MODULE}.{TARGET_CLASS}.{TARGET_METHOD}"
        warn(f"{RESUME_ENV}=1: {where} is not importable ({type(exc).__name__}: {exc}); {risk}")
        return False
    if not getattr(method, MARK, False):
        setattr(cls, TARGET_METHOD, with_resumed_features(method))
    return True
