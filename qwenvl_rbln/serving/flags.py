"""The pass-through flags after ``--``: parsed as vLLM parses them, refused when they conflict with the artifact.

vllm-rbln overwrites several flags with the compiled values and fails late on others; this module is the one place
that knows which, so both commands refuse the same flags with the same message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.serving.options import Artifact


def parse_flags(tokens: Sequence[str]) -> list[tuple[str, str | None, int, int]]:
    """(normalised flag, value, first index, token count) for every ``--flag value`` / ``--flag=value`` / ``-tp N``.

    vLLM's parser accepts ``_`` for ``-`` in flag names and dotted JSON keys (``--mm-processor-kwargs.max_pixels``);
    both are normalised to the base flag here.
    """
    out = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("-") and not _is_number(tok):
            name, eq, value = tok.partition("=")
            if name.startswith("--"):  # the flag's own name, not a dotted JSON key after it
                head, dot, key = name.partition(".")
                name = head.replace("_", "-") + dot + key
            if eq:
                out.append((name, value, i, 1))
            elif i + 1 < len(tokens) and (not tokens[i + 1].startswith("-") or _is_number(tokens[i + 1])):
                out.append((name, tokens[i + 1], i, 2))
                i += 1
            else:
                out.append((name, None, i, 1))
        i += 1
    return out


def _is_number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def parse_count(value: str | None) -> int | None:
    """vLLM's human-readable integers: 4096, 32k (x1000), 32K (x1024), 1m, 1M; None when it is not one."""
    if value is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", value)
    if not m:
        return None
    scale = {"": 1, "k": 10**3, "K": 2**10, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30}[m.group(2)]
    number = float(m.group(1)) * scale
    return int(number) if number == int(number) else None


def refuse(flag: str, value: str | None, why: str, fix: str, *, outcome: str = "nothing was started") -> InputError:
    shown = flag if value is None else f"{flag} {value}"
    return InputError(f"pass-through flag `{shown}` {why}; {outcome}", fix)


def owned_refusal(
    flag: str,
    value: str | None,
    owned: Mapping[str, str],
    *,
    by: str = "qvl",
    fix: str = "use {} instead",
    outcome: str = "nothing was started",
) -> InputError | None:
    """The refusal of a pass-through flag that ``by`` sets itself (``owned``: base flag -> what to use instead,
    put into ``fix``), or None. The one rule serve, bench-serve and deploy refuse their own flags by; an API key's
    value is never shown."""
    base = flag.split(".", 1)[0]
    if base not in owned:
        return None
    value = "<hidden>" if base == "--api-key" and value is not None else value
    return refuse(flag, value, f"is set by {by}", fix.format(owned[base]), outcome=outcome)


def refuse_owned(extra: Sequence[str], owned: Mapping[str, str], **how: str) -> None:
    """``owned_refusal`` over every pass-through flag, in order: the first one ``by`` sets is refused."""
    for flag, value, _, _ in parse_flags(extra):
        problem = owned_refusal(flag, value, owned, **how)
        if problem is not None:
            raise problem


def _must_equal(flag: str, value: str | None, want: int, what: str) -> None:
    if parse_count(value) != want:
        raise refuse(
            flag,
            value,
            f"conflicts with the artifact: {what} is {want} (vllm-rbln overwrites it or fails on it)",
            f"drop {flag} (qvl passes the compiled value) or recompile with the value you want",
        )


def check_pass_through(extra: Sequence[str], art: Artifact, owned: Mapping[str, str]) -> set[str]:
    """Refuse pass-through flags that conflict with the artifact or with qvl's own options.

    Returns the replaceable flags the user gave (their value replaces qvl's).
    """
    cfg = art.cfg
    block = cfg.get("kvcache_block_size") or cfg.get("kvcache_partition_len")
    replaced: set[str] = set()
    for flag, value, _, _ in parse_flags(extra):
        base = flag.split(".", 1)[0]
        if base in ("--tensor-parallel-size", "-tp"):
            if parse_count(value) != 1:
                raise refuse(
                    flag,
                    value,
                    "is refused by vllm-rbln on a compiled artifact (tensor parallelism is fixed at 1)",
                    "drop it; the artifact's num_devices decides how many NPUs a graph uses",
                )
        elif base in ("--pipeline-parallel-size", "-pp"):
            if parse_count(value) != 1:
                raise refuse(flag, value, "is refused by vllm-rbln (no pipeline parallelism)", "drop it")
        elif base == "--speculative-config":
            raise refuse(flag, value, "is refused by vllm-rbln (no speculative decoding)", "drop it")
        elif base == "--max-num-batched-tokens":
            _must_equal(flag, value, cfg["prefill_chunk_size"], "the compiled prefill_chunk_size")
        elif base == "--max-model-len":
            _must_equal(flag, value, cfg["max_seq_len"], "the compiled max_seq_len")
        elif base in ("--api-key",):
            raise refuse(
                flag,
                "<hidden>" if value is not None else None,
                "would put the key in vLLM's argv, which any process list shows",
                "export VLLM_API_KEY=KEY or pass --api-key-file FILE (qvl hands it to vLLM in its environment)",
            )
        elif base == "--max-num-seqs":
            _must_equal(flag, value, cfg["batch_size"], "the compiled batch_size")
        elif base == "--block-size":
            _must_equal(flag, value, block, "the compiled kvcache_block_size")
        elif (owned_flag := owned_refusal(flag, value, owned)) is not None:
            raise owned_flag
        elif base == "--mm-processor-kwargs":
            _check_max_pixels(flag, value, art)
            replaced.add(base)
        elif base == "--limit-mm-per-prompt":
            replaced.add(base)
    return replaced


def _check_max_pixels(flag: str, value: str | None, art: Artifact) -> None:
    """A user's --mm-processor-kwargs replaces qvl's: refused when it lets images past the largest bucket, or when
    the processor files need a per-request cap and it gives none transformers applies."""
    cap = art.max_pixels
    if flag != "--mm-processor-kwargs":  # a dotted key: --mm-processor-kwargs.max_pixels N
        pixels = parse_count(value) if flag.endswith((".max_pixels", ".longest_edge")) else None
        if pixels is not None and pixels > cap:
            raise _too_large(flag, value, art)
        return
    try:
        data = json.loads(value or "")
    except ValueError:
        raise refuse(flag, value, "is not a JSON object", "pass JSON, e.g. '{\"max_pixels\": 802816}'") from None
    data = data if isinstance(data, dict) else {}
    inner = data.get("images_kwargs") if isinstance(data.get("images_kwargs"), dict) else {}
    found = [_longest(data), _longest(inner), _number(data.get("max_pixels")), _number(inner.get("max_pixels"))]
    if any(p is not None and p > cap for p in found):
        raise _too_large(flag, value, art)
    per_call = [_longest(inner), _longest(data)]  # transformers 5 reads size, or min_pixels with max_pixels, per call
    for part in (inner, data):
        if _number(part.get("min_pixels")) is not None and _number(part.get("max_pixels")) is not None:
            per_call.append(_number(part["max_pixels"]))
    if art.processor_fix.get("image") and all(p is None for p in per_call):
        raise refuse(
            flag,
            value,
            "does not cap images per request, and the processor files let images past the largest ViT bucket "
            "(transformers 5 ignores max_pixels alone at call time)",
            f"drop it (qvl passes the cap) or pass e.g. '{json.dumps(image_kwargs(65536, cap))}'",
        )


def image_kwargs(min_pixels: int, max_pixels: int) -> dict[str, Any]:
    """The --mm-processor-kwargs that cap images (and only images) at ``max_pixels`` per request and at load."""
    return {
        "max_pixels": max_pixels,
        "images_kwargs": {"size": {"shortest_edge": min_pixels, "longest_edge": max_pixels}},
    }


def _number(value: Any) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _longest(part: dict[str, Any]) -> int | float | None:
    size = part.get("size")
    return _number(size.get("longest_edge")) if isinstance(size, dict) else None


def _too_large(flag: str, value: str | None, art: Artifact) -> InputError:
    return refuse(
        flag,
        value,
        f"lets images exceed the largest compiled ViT bucket ({art.buckets[-1]} patches = max_pixels "
        f"{art.max_pixels}); vllm-rbln would fail on such an image with 'Required seq_len(N) is larger than "
        "available max_seq_len'",
        f"use max_pixels <= {art.max_pixels}, or drop it (qvl passes {art.max_pixels})",
    )
