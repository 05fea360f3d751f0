"""``--time-model`` checked against the artifact before any server starts.

Why: a model that reads but cannot time this artifact's calls (a timings file that does not exist, all-zero
coefficients, a call of an hour) would start a server whose run can only end invalid or hang. Each compiled call
kind is asked once at the artifact's shapes (the smallest and largest ViT bucket, the first prefill chunk, every
decoder batch at a full and at its longest context) and every answer must be a finite number of seconds in
(0, 1 h]. Pure: no torch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError, QvlError
from qwenvl_rbln.tuning.artifact_config import read_rbln_config

MAX_CALL_S = 3600.0


def buckets(cfg: dict[str, Any]) -> list[int]:
    """The compiled ViT buckets (patches) of an rbln_config."""
    found: set[int] = set()
    for cc in (cfg.get("visual") or {}).get("_compile_cfgs") or []:
        for info in cc.get("input_info") or []:
            try:
                found.add(int(info[0][1][0]))
            except (TypeError, ValueError, IndexError, KeyError):
                continue
    return sorted(found)


def probes(cfg: dict[str, Any]) -> list[tuple[str, Any]]:
    """(label, call) pairs: each call asks the model one of the artifact's compiled call kinds."""
    chunk = int(cfg.get("prefill_chunk_size") or 128)
    longest = int(cfg.get("max_seq_len") or chunk)
    out: list[tuple[str, Any]] = [(f"prefill({chunk}, {chunk})", lambda m: m.prefill(chunk, chunk))]
    for b in sorted({int(x) for x in cfg.get("decoder_batch_sizes") or [cfg.get("batch_size") or 1]}):
        out.append((f"decode({b}, {chunk})", lambda m, b=b: m.decode(b, chunk, b)))
        out.append((f"decode({b}, {longest})", lambda m, b=b: m.decode(b, longest, b)))
    found = buckets(cfg)
    for bucket in sorted({found[0], found[-1]} if found else set()):
        out.append((f"vit({bucket})", lambda m, bucket=bucket: m.vit(bucket)))
    return out


def check(model: Any, artifact: Path, spec: str) -> None:
    """InputError naming ``--time-model SPEC``, the call and its value when the model cannot time this artifact."""
    kind, _, rest = spec.partition(":")
    if kind == "timings" and rest and not Path(rest).is_file():
        raise InputError(f"--time-model {spec}: {rest} is not a file",
                         "give the timings.json `qvl profile` wrote (default $QVL_HOME/timings.json)")  # fmt: skip
    _, cfg = read_rbln_config(artifact)
    for label, call in probes(cfg):
        try:
            value = call(model)
        except (QvlError, ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
            raise InputError(f"--time-model {spec} cannot time {label} of {artifact} ({exc})",
                             "give a model for this artifact's compiled shapes") from None  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            why = f"gives {value!r} s, not a number"
        elif value <= 0:
            why = f"gives {value!r} s: a call that takes no time cannot be held"
        elif value > MAX_CALL_S:
            why = f"gives {value:g} s, over an hour per call"
        else:
            continue
        raise InputError(f"--time-model {spec}: {label} {why}",
                         "give device seconds > 0 per call (roofline:HUB_ID is a safe start)")  # fmt: skip
