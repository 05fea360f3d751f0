"""The steps of ``ResolvedLM.from_rbln_config``: the values a compile saved in rbln_config.json, read back with
optimum-rbln's defaults; each failure names the artifact file and says to recompile.

Its own module: reading a compiled artifact is a different job (and a different error) from validating a preset
(``lm.checks``); both feed the one derivation in ``lm.resolved``.
"""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.lm.rules import default_attn_impl, default_block_size, quant_with_defaults

_KIND_WORDS: dict[Any, str] = {int: "an integer", str: "a string", list: "a list", dict: "an object"}


def need(cfg: dict[str, Any], key: str, source: str, kind: type | tuple[type, ...] = int) -> Any:
    value = cfg.get(key)
    if value is None or isinstance(value, bool) or not isinstance(value, kind):
        raise InputError(
            f"{source}: {key}={value!r} is missing or not {_KIND_WORDS.get(kind, 'a value')}",
            "the artifact config is damaged: recompile it (`qvl compile --force`)",
        )
    return value


def _positive_or_none(cfg: dict[str, Any], key: str, source: str) -> None:
    value = cfg.get(key)
    if value is not None and (type(value) is not int or value < 1):
        raise InputError(f"{source}: {key}={value!r} is not a positive integer", "recompile the artifact")


def saved_attention(cfg: dict[str, Any], max_seq_len: int, source: str) -> tuple[str, Any, Any]:
    """(attn_impl, kvcache_partition_len, kvcache_block_size) as saved, with optimum-rbln's defaults."""
    partition = cfg.get("kvcache_partition_len")
    attn = cfg.get("attn_impl") or default_attn_impl(partition)
    if attn not in ("eager", "flash_attn"):
        raise InputError(f"{source}: attn_impl={attn!r} is not eager or flash_attn", "recompile the artifact")
    for key in ("max_seq_len", "kvcache_partition_len", "kvcache_block_size", "prefill_chunk_size"):
        _positive_or_none(cfg, key, source)
    if attn == "flash_attn" and not partition:
        raise InputError(f"{source}: attn_impl=flash_attn without kvcache_partition_len", "recompile the artifact")
    block = cfg.get("kvcache_block_size") or default_block_size(attn, partition, max_seq_len)
    return attn, partition, block


def saved_vit_buckets(cfg: dict[str, Any], source: str) -> list[int]:
    """visual.max_seq_len as saved (one int or a list)."""
    visual = cfg.get("visual")
    if not isinstance(visual, dict):
        raise InputError(f"{source}: no 'visual' section", "recompile the artifact with optimum-rbln 0.12.0")
    buckets = visual.get("max_seq_len")
    buckets = [buckets] if isinstance(buckets, int) and not isinstance(buckets, bool) else buckets
    if not isinstance(buckets, list) or not buckets or not all(type(b) is int and b > 0 for b in buckets):
        raise InputError(f"{source}: visual.max_seq_len={buckets!r} is not a list of integers", "recompile")
    return buckets


def saved_quantization(cfg: dict[str, Any], source: str) -> dict[str, Any] | None:
    """quantization as RBLNQuantizationConfig._prepare_for_serialization saved it; unset fields mean fp16."""
    quant = cfg.get("quantization")
    if quant is not None and not isinstance(quant, dict):
        raise InputError(f"{source}: quantization={quant!r} is not a mapping", "recompile the artifact")
    if not quant:
        return None
    return {**quant_with_defaults(quant), "dynamic": bool(quant.get("dynamic"))}
