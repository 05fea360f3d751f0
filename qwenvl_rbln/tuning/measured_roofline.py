"""The cost model with measured graphs in it: ``Roofline`` whose ViT call, prefill chunk and decode step use a
``qvl profile`` measurement (a measured point, or the fit over context) where timings.json has one for the graph,
and remembers, per graph key, which source each figure came from so every printed time can say so.

A subclass in its own module rather than an edit of ``roofline.py``: the roofline is the bound and stays one
module; this is the substitution, and the labels (``measured (NPU, date, +-spread)``, ``fitted (..., fit
+-err)``, ``roofline bound``) that tune, its table and its plot print.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qwenvl_rbln.memory.calibration import decoder_key, prefill_key
from qwenvl_rbln.tuning.measured import Measured, visual_call_key
from qwenvl_rbln.tuning.roofline import Roofline

ROOFLINE = "roofline bound"


@dataclass
class MeasuredRoofline(Roofline):
    measured: Measured = field(default_factory=Measured)
    sources: dict[str, str] = field(default_factory=dict)  # graph key -> label of the figure used

    def _lookup(self, key: str, context: float | None) -> float | None:
        timing = self.measured.get(key)
        if timing is None:
            self.sources.setdefault(key, ROOFLINE)
            return None
        seconds, how = timing.seconds(context)
        self.sources[key] = timing.label(how)
        self.used_measured.add(key)
        return seconds

    def vit_call(self, bucket: int) -> float:
        value = self._lookup(visual_call_key(bucket), None)
        return value if value is not None else super().vit_call(bucket)

    def prefill_chunk(self, before: int, block: int) -> float:
        value = self._lookup(prefill_key(self.chunk, block), before)
        return value if value is not None else super().prefill_chunk(before, block)

    def decode_step(self, graph: int, rows: int, context: float, block: int) -> float:
        value = self._lookup(decoder_key(graph, block), context)
        return value if value is not None else super().decode_step(graph, rows, context, block)


def row_keys(row: dict[str, Any], chunk: int) -> list[str]:
    """The graph keys one tune row's estimate rests on: its ViT buckets, the prefill chunk, its decoder graphs."""
    block = row["kvcache_partition_len"]
    keys = [visual_call_key(b) for b in row.get("vit_buckets") or []]
    keys.append(prefill_key(chunk, block))
    keys += [decoder_key(g, block) for g in row.get("decoder_batch_sizes") or []]
    return keys


def row_timing(row: dict[str, Any], roof: MeasuredRoofline) -> dict[str, Any]:
    """Which of a row's graphs are measured or fitted and which rest on the roofline bound, and one summary label."""
    keys = row_keys(row, roof.chunk)
    sources = {k: roof.sources.get(k, ROOFLINE) for k in keys}
    estimated = [k for k, s in sources.items() if s == ROOFLINE]
    measured = [k for k in keys if k not in estimated]
    if not measured:
        summary = ROOFLINE
    elif not estimated:
        summary = "measured" if all(s.startswith("measured") for s in sources.values()) else "measured/fitted"
    else:
        summary = f"mixed: {len(measured)} of {len(keys)} graphs measured, the rest roofline bound"
    return {"label": summary, "rests_on_estimates": bool(estimated), "sources": sources}
