"""Whether an explicit --preset / --set agrees with what an artifact was compiled with, key by compiled key.

Its own module because infer must refuse every disagreement, not only the batch: a context, a ViT bucket list or
an attention setting the graphs were not compiled for is silently ignored otherwise (the compiled graphs win), and
a run then quietly does something other than what the command line says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError

# (--set key, ResolvedLM attribute): every value rbln_config.json records and the graphs are compiled for
COMPILED_KEYS = [
    ("batch_size", "batch_size"),
    ("decoder_batch_sizes", "decoder_batch_sizes"),
    ("max_seq_len", "max_seq_len"),
    ("visual.max_seq_len", "vit_buckets"),
    ("attn_impl", "attn_impl"),
    ("kvcache_partition_len", "kvcache_partition_len"),
    ("kvcache_block_size", "kvcache_block_size"),
    ("prefill_chunk_size", "prefill_chunk_size"),
    ("kvcache_num_blocks", "kvcache_num_blocks"),
    ("num_devices", "num_devices"),
    ("visual.num_devices", "visual_num_devices"),
    ("quantization", "quantization"),
    ("use_attention_mask", "use_attention_mask"),
    ("use_position_ids", "use_position_ids"),
]
SORTED = {"decoder_batch_sizes", "vit_buckets"}


def _value(resolved: Any, attr: str) -> Any:
    value = getattr(resolved, attr, None)
    return sorted(value) if attr in SORTED and value is not None else value


def _arg(value: Any) -> str:
    """A value as --set takes it: JSON without spaces, one shell word."""
    return json.dumps(value, separators=(",", ":"))


def disagreements(compiled: Any, asked: Any, baseline: Any | None) -> list[tuple[str, Any, Any]]:
    """(key, compiled value, asked value) for each compiled key the command line disagrees on.

    ``baseline``: the plan without the user's --set (the artifact's own values on its preset); a key counts as
    asked for when the --set changed it, or for every key when ``baseline`` is None (an explicit --preset).
    An automatic KV block count (0) asks for nothing: optimum-rbln sizes the pool at compile."""
    out = []
    for key, attr in COMPILED_KEYS:
        want, have = _value(asked, attr), _value(compiled, attr)
        if attr == "kvcache_num_blocks" and not want:
            continue
        if baseline is not None and want == _value(baseline, attr):
            continue
        if want != have:
            out.append((key, have, want))
    return out


def conflict(
    directory: Path, compiled: Any, plan: Any, diffs: list[tuple[str, Any, Any]], explicit_preset: bool, sets: list[str]
) -> InputError:
    """The refusal: each key the artifact was compiled with against what the command line says, the exact --set
    that agree, and the recompile for the user's values."""

    def show(key: str, value: Any, resolved: Any) -> str:
        if key == "batch_size":
            return f"batch_size {value} (decoder graphs {resolved.decoder_batch_sizes})"
        return f"{key} {value}"

    keys = [k for k, _, _ in diffs]
    if {"batch_size", "decoder_batch_sizes"} & set(keys):  # the batch and its graphs go together
        batch = [
            ("batch_size", compiled.batch_size, plan.resolved.batch_size),
            ("decoder_batch_sizes", sorted(compiled.decoder_batch_sizes), sorted(plan.resolved.decoder_batch_sizes)),
        ]
        diffs = batch + [d for d in diffs if d[0] not in ("batch_size", "decoder_batch_sizes")]
    shown = [d for d in diffs if d[0] != "decoder_batch_sizes"]  # named with the batch
    was = ", ".join(show(k, have, compiled) for k, have, _ in shown)
    says = ", ".join(show(k, want, plan.resolved) for k, _, want in shown)
    exact = " ".join(f"--set {k}={_arg(have)}" for k, have, _ in diffs)
    drop = " and ".join(
        ([f"--preset {plan.preset}"] if explicit_preset else []) + (["the --set that change them"] if sets else [])
    )
    recompile = f"qvl compile --preset {plan.preset}{''.join(f' --set {s}' for s in sets)} -o {directory} --force"
    return InputError(
        f"{directory} was compiled for {was} but preset {plan.preset}{' with your --set' if sets else ''} says {says}",
        f"drop {drop} (infer then uses the artifact's own values), or pass what it was compiled with: {exact}, "
        f"or recompile for yours: `{recompile}`",
    )
