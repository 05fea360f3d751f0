"""Inside vLLM: keep ``max_model_len`` at what the KV block pool really holds (vllm-rbln issue #957).

``qvl serve`` passes ``--max-model-len`` lowered to ``(kvcache_num_blocks - 1) x block`` for a short pool
(``preflight.pool_max_model_len``), but vllm-rbln's ``sync_from_optimum`` resets ``model_config.max_model_len`` to
rbln_config.json's ``max_seq_len`` when it reads a compiled artifact (RBLN-SW/vllm-rbln 95c7a25a, v0.11.0:
vllm_rbln/utils/optimum/converter/from_optimum.py:88-97, called from ``sync_vllm_and_optimum`` in
vllm_rbln/utils/optimum/converter/dispatch.py:114-124 through its module-level name). So ``qvl serve`` also hands the
length over as ``QVL_MAX_MODEL_LEN`` and qvl's plugin, which vLLM loads before it builds its config, wraps that name:
after vllm-rbln's sync, ``max_model_len`` is lowered again, so vLLM's own length check refuses a prompt the pool
cannot hold instead of admitting it and hanging. Never raises: a vllm-rbln without that function gets one warning
that says what is then at risk.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

MAX_MODEL_LEN_ENV = "QVL_MAX_MODEL_LEN"  # a positive int from qvl serve: the longest sequence the pool holds
DISPATCH = "vllm_rbln.utils.optimum.converter.dispatch"
MARK = "__qvl_max_model_len__"


def positive_int_env(name: str, what: str, warn: Callable[[str], None]) -> int | None:
    """Environment variable ``name`` as a positive int; None when unset, or (with one warning saying ``what`` then
    happens) when it is not one. The plugin's switches all read their numbers this way."""
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


def _capped(original: Callable[..., Any], cap: int) -> Callable[..., Any]:
    def sync_from_optimum(vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(vllm_config, *args, **kwargs)
        model_config = getattr(vllm_config, "model_config", None)
        current = getattr(model_config, "max_model_len", None)
        if isinstance(current, int) and current > cap:
            model_config.max_model_len = cap
        return result

    setattr(sync_from_optimum, MARK, cap)
    sync_from_optimum.__wrapped__ = original  # type: ignore[attr-defined]
    return sync_from_optimum


def install(warn: Callable[[str], None]) -> bool:
    """Wrap vllm-rbln's ``sync_from_optimum`` so ``max_model_len`` stays at ``QVL_MAX_MODEL_LEN``; False (with one
    warning when it was asked for) when it cannot be."""
    cap = positive_int_env(MAX_MODEL_LEN_ENV, "--max-model-len stays as vllm-rbln sets it", warn)
    if cap is None:
        return False
    risk = (
        f"vllm-rbln may reset --max-model-len to the compiled max_seq_len, so a prompt above {cap} tokens could be "
        "admitted and hang (vllm-rbln issue #957); recompile with a full KV pool to be safe"
    )
    try:
        dispatch = importlib.import_module(DISPATCH)
    except Exception as exc:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        warn(f"{MAX_MODEL_LEN_ENV}={cap}: {DISPATCH} is not importable ({type(exc).__name__}: {exc}); {risk}")
        return False
    original = getattr(dispatch, "sync_from_optimum", None)
    if not callable(original):
        warn(f"{MAX_MODEL_LEN_ENV}={cap}: this vllm-rbln has no {DISPATCH}.sync_from_optimum; {risk}")
        return False
    if getattr(original, MARK, None) == cap:
        return True  # register runs more than once per process
    dispatch.sync_from_optimum = _capped(getattr(original, "__wrapped__", original), cap)
    return True
