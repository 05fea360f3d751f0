"""What vllm-rbln imports from ``rebel`` beyond optimum-rbln's surface, on CPU (``qvl serve --emulate``).

vllm-rbln v0.11.1a1 on its optimum path (``../shared/engine/``; paths inside ``vllm_rbln/``):

* ``rebel.manual_seed(seed)``: ``platform.py:111`` (``RblnPlatform.manual_seed_all``). Here: ``torch.manual_seed``.
* ``rebel.core.torch_compile.rbln_backend``: ``torch_compile_backend.py:32`` imports it whenever the optimum model
  runner is imported; the RBLN sampler compiles its two functions with it (``v1/sample/rbln_sampler.py:115-175``,
  ``torch.compile(fn, backend=..., options=...)``). Here the FX graph dynamo hands over runs eagerly: the backend
  returns ``graph_module.forward`` (what vllm-rbln's own ``bypass`` backend does, ``platform.py:48-52``).
* ``torch.ops.rbln.argmax(logits)`` and ``torch.ops.rbln.top_k_top_p(probs, k, p)``: rebel-compiler's sampler ops,
  called inside those compiled functions (``rbln_sampler.py:85, 95``). Inferred semantics (from the call sites and
  vLLM's own sampler, never from NPU documentation): ``argmax`` is the greedy token of each row of ``[B, V]``
  logits; ``top_k_top_p`` keeps, per row, the ``k[b]`` most likely tokens (none dropped when ``k`` is None or
  ``k[b]`` is not in ``1..V-1``) and the smallest set whose probability reaches ``p[b]`` (none dropped when ``p``
  is None or ``p[b] >= 1``), renormalises and draws one token with torch's generator (seeded through
  ``manual_seed``). Both return int64 ``[B]``, which the sampler casts as it does the NPU's output. So vLLM's
  RBLN sampler runs unchanged (``VLLM_RBLN_SAMPLER`` stays at its default, on).

``install()`` adds the first two to the emulated ``rebel`` module (``activate()`` calls it); ``define_ops`` defines the
two ops in the ``torch.ops.rbln`` library that ``ops.register`` creates beside ``rbln_custom_ops``.
"""

from __future__ import annotations

import sys
import time
import types
from typing import Any


def manual_seed(seed: int) -> None:
    """rebel's seed for the NPU's random numbers: here torch's own generator, which the emulated ops draw from."""
    import torch

    torch.manual_seed(int(seed))


def rbln_backend(graph_module: Any, example_inputs: Any, **options: Any) -> Any:
    """The torch.compile backend rebel-compiler registers: here the traced graph runs eagerly on the CPU. Under a
    time model (``timed.py``) each run is a ``sampler`` call in the call log, held for the model's sampler time; at
    device speed it returns zeros of the outputs' shapes and dtypes (learnt from its first run at those inputs)."""
    forward = graph_module.forward
    specs: dict[tuple, tuple[bool, list[tuple[list[int], str]]]] = {}

    def run(*args: Any) -> Any:
        from qwenvl_rbln.backends.emulator import timed

        timer = timed.configured()
        if timer is None:
            return forward(*args)
        start = time.perf_counter()
        key = tuple((tuple(a.shape), str(a.dtype)) if hasattr(a, "shape") else None for a in args)
        if timer.device_speed and key in specs:
            many, spec = specs[key]
            outs = timed.zeros_like_specs(spec)
            result: Any = tuple(outs) if many else outs[0]
        else:
            result = forward(*args)
            outs = list(result) if isinstance(result, list | tuple) else [result]
            specs[key] = (isinstance(result, list | tuple), [(list(t.shape), str(t.dtype)) for t in outs])
        rows = int(args[0].shape[0]) if args and hasattr(args[0], "shape") and args[0].dim() else 1
        timer.hold(start, timed.Call("sampler", rows, 0, rows))
        timed.record_call(time.perf_counter() - start)  # device time in the runtime's reports, as on an NPU
        return result

    return run


def _argmax(logits: Any) -> Any:
    return logits.argmax(dim=-1)


def _top_k_top_p(probs: Any, k: Any = None, p: Any = None) -> Any:
    import torch

    # the engine's warm-up samples from uninitialised logits: NaN or negative entries count as 0, as on a device
    probs = torch.nan_to_num(probs.float(), nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0.0)
    vocab = probs.shape[-1]
    ranked, order = probs.sort(dim=-1, descending=True)
    keep = torch.ones_like(ranked, dtype=torch.bool)
    if k is not None:
        kk = k.reshape(-1, 1).long()
        limit = torch.where((kk > 0) & (kk < vocab), kk, torch.full_like(kk, vocab))
        keep &= torch.arange(vocab).view(1, -1) < limit
    if p is not None:
        pp = p.reshape(-1, 1).float()
        before = ranked.cumsum(dim=-1) - ranked  # probability mass ranked above each token
        keep &= (before < pp) | (pp >= 1.0)
    keep[:, 0] = True  # the most likely token always stays
    kept = torch.where(keep, ranked, torch.zeros_like(ranked))
    kept[:, 0] += (kept.sum(dim=-1) <= 0).float()  # a row with no mass left: its most likely token
    choice = torch.multinomial(kept / kept.sum(dim=-1, keepdim=True), 1)
    return order.gather(-1, choice).reshape(-1)


def _sampled_meta(probs: Any, *args: Any) -> Any:
    import torch

    return torch.empty(probs.shape[:-1], dtype=torch.int64, device=probs.device)


def define_ops(lib: Any) -> None:
    """``argmax`` and ``top_k_top_p`` in the ``rbln`` op library (``ops.register`` creates it, once per process); a
    Meta kernel each, so dynamo can trace the sampler functions that call them."""
    lib.define("argmax(Tensor logits) -> Tensor")
    lib.impl("argmax", _argmax, "CPU")
    lib.impl("argmax", _sampled_meta, "Meta")
    lib.define("top_k_top_p(Tensor probs, Tensor? k=None, Tensor? p=None) -> Tensor")
    lib.impl("top_k_top_p", _top_k_top_p, "CPU")
    lib.impl("top_k_top_p", _sampled_meta, "Meta")


def install(rebel: types.ModuleType) -> None:
    """``rebel.manual_seed`` and ``rebel.core.torch_compile`` on the emulated module, importable by name too."""
    rebel.manual_seed = manual_seed  # type: ignore[attr-defined]
    core = sys.modules.get("rebel.core") or types.ModuleType("rebel.core")
    compile_mod = sys.modules.get("rebel.core.torch_compile") or types.ModuleType("rebel.core.torch_compile")
    compile_mod.rbln_backend = rbln_backend  # type: ignore[attr-defined]
    core.torch_compile = compile_mod  # type: ignore[attr-defined]
    rebel.core = core  # type: ignore[attr-defined]
    sys.modules["rebel.core"] = core
    sys.modules["rebel.core.torch_compile"] = compile_mod
