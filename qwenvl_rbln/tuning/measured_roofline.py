"""The cost model with measured graphs in it: ``Roofline`` whose ViT call, prefill chunk and decode step use a
``qvl profile`` measurement (a measured point, or the fit over context) where timings.json has one for the graph,
and remembers, per graph key, which source each figure came from so every printed time can say so.

A subclass in its own module rather than an edit of ``roofline.py``: the roofline is the bound and stays one
module; this is the substitution, and the labels (``measured (NPU, date, +-spread)``, ``fitted (..., fit
+-err)``, ``extrapolated (...)``, ``scaled bound (x r ...)``, ``roofline bound``) that tune, its table and its plot
print.

Two guards on a measured figure, beyond the file's own check (``measured_check``):
- it is never faster than a tenth of its roofline bound (``PHYSICAL``): the bound is what the card's peak FLOP/s
  and bandwidth allow, so a figure ten times below it is a damaged file, not a fast card;
- past its measured contexts it is marked ``extrapolated`` and never below the nearest measured time
  (``GraphTiming.seconds``).

One footing (``scale_unmeasured``, what tune asks for): a measured graph is slower than its bound, so a row of
bounds would outrank a measured row without being faster. tune therefore gives every graph of a kind (ViT call,
prefill chunk, decode step) that was measured for some graphs but not for this one its bound times the median
measured / bound ratio of that kind's measured points, labelled ``scaled bound``. Every row is then ranked on
measured figures or on figures scaled to them, kind by kind; a kind nobody measured is a bound in every row.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.memory.calibration import decoder_key, prefill_key
from qwenvl_rbln.tuning.measured import EXTRAPOLATED, RISK, GraphTiming, Measured, bad_value, visual_call_key
from qwenvl_rbln.tuning.measured_check import MAX_CONTEXT
from qwenvl_rbln.tuning.roofline import Roofline

ROOFLINE = "roofline bound"
SCALED = "scaled bound"
PHYSICAL = 0.1  # a measured call may be this fraction of its roofline bound, no less
_KEYS = {
    "vit": re.compile(r"visual/call(\d+)"),
    "prefill": re.compile(r"prefill/chunk(\d+)/block(\d+)"),
    "decoder": re.compile(r"decoder_batch_(\d+)/block(\d+)"),
}
KINDS = {"vit": "ViT call", "prefill": "prefill chunk", "decoder": "decode step"}


def kind_of(key: str) -> tuple[str, tuple[int, ...]] | None:
    """(kind, the key's numbers) of a calibration key; None for another key, or numbers no compiled graph has (a
    bucket of 400 digits would overflow the bound's float arithmetic)."""
    for kind, pattern in _KEYS.items():
        m = pattern.fullmatch(key)
        if m and all(len(g) <= 10 and int(g) <= MAX_CONTEXT for g in m.groups()):
            return kind, tuple(int(g) for g in m.groups())
    return None


@dataclass
class MeasuredRoofline(Roofline):
    measured: Measured = field(default_factory=Measured)
    sources: dict[str, str] = field(default_factory=dict)  # graph key -> label of the figure used
    scale_unmeasured: bool = False  # tune: an unmeasured graph of a measured kind is its bound x that kind's ratio
    # shared by both ends of a MoE (``high_end`` replaces with the same objects): what was checked and found
    hows: dict[str, str] = field(default_factory=dict)  # graph key -> the least sure kind of figure it gave
    checked: set[str] = field(default_factory=set)
    ratios: dict[tuple[str, bool], tuple[float, int] | None] = field(default_factory=dict)

    # --- the bound of a graph, by key ------------------------------------------------------------
    def _bound(self, kind: str, nums: tuple[int, ...], context: float | None) -> float | None:
        """The roofline bound of one call of the graph the key names, as ``qvl profile`` times it (every row of a
        decoder batch at ``context``); None for a prefill chunk of another size than this model's."""
        if kind == "vit":
            return Roofline.vit_call(self, nums[0])
        if kind == "prefill":
            return Roofline.prefill_chunk(self, int(context or 0), nums[1]) if nums[0] == self.chunk else None
        return Roofline.decode_step(self, nums[0], nums[0], float(context or 0), nums[1])

    def _check(self, timing: GraphTiming) -> None:
        """Refuse a measured point faster than PHYSICAL x its bound (at the low end of a MoE: the smaller bound)."""
        parsed = kind_of(timing.key)
        if timing.key in self.checked or parsed is None or self.dense_experts:
            return
        for n, p in sorted(timing.points.items()):
            bound = self._bound(*parsed, n)
            if bound and p["median_s"] < PHYSICAL * bound:
                raise bad_value(
                    Path(timing.path),
                    timing.entry,
                    timing.key,
                    f"context {n} median_s={p['median_s']!r} is {bound / p['median_s']:,.0f}x below the roofline "
                    f"bound {bound:.3g} s (the least time {self.compute.sku}'s peak figures allow)",
                )
        self.checked.add(timing.key)

    def _ratio(self, kind: str) -> tuple[float, int] | None:
        """(median measured / bound over every measured point of this kind, graphs), at this end of a MoE."""
        slot = (kind, self.dense_experts)
        if slot not in self.ratios:
            ratios, graphs = [], 0
            for key, timing in sorted(self.measured.graphs.items()):
                parsed = kind_of(key)
                if parsed is None or parsed[0] != kind:
                    continue
                self._check(timing)
                found = [p["median_s"] / b for n, p in timing.points.items() if (b := self._bound(*parsed, n))]
                ratios += found
                graphs += bool(found)
            self.ratios[slot] = (statistics.median(ratios), graphs) if ratios else None
        return self.ratios[slot]

    def _note(self, key: str, how: str, timing: GraphTiming) -> None:
        """Record the least sure kind of figure a graph gave; its label is built only when it changes."""
        old = self.hows.get(key)
        if old == how:
            return
        if old is None or RISK.get(how, 0) >= RISK.get(old, 0):
            self.hows[key], self.sources[key] = how, timing.label(how)

    def _lookup(self, key: str, context: float | None, bound: Callable[[], float]) -> float:
        timing = self.measured.get(key)
        if timing is not None:
            self._check(timing)
            seconds, how = timing.seconds(context)
            self._note(key, how, timing)
            self.used_measured.add(key)
            return seconds
        parsed = kind_of(key)
        ratio = self._ratio(parsed[0]) if self.scale_unmeasured and parsed is not None else None
        if ratio is None:
            self.sources.setdefault(key, ROOFLINE)
            return bound()
        factor, graphs = ratio
        self.sources[key] = (
            f"{SCALED} (x{factor:.2f}: the median measured/bound ratio of {graphs} measured "
            f"{KINDS[parsed[0]]} graph{'s' if graphs != 1 else ''})"
        )
        return bound() * factor

    def vit_call(self, bucket: int) -> float:
        return self._lookup(visual_call_key(bucket), None, lambda: super(MeasuredRoofline, self).vit_call(bucket))

    def prefill_chunk(self, before: int, block: int) -> float:
        return self._lookup(prefill_key(self.chunk, block), before,
                            lambda: super(MeasuredRoofline, self).prefill_chunk(before, block))  # fmt: skip

    def decode_step(self, graph: int, rows: int, context: float, block: int) -> float:
        return self._lookup(decoder_key(graph, block), context,
                            lambda: super(MeasuredRoofline, self).decode_step(graph, rows, context, block))  # fmt: skip

    def scales(self) -> dict[str, float]:
        """The factor each kind's unmeasured graphs were scaled by (the low end of a MoE), for the document."""
        return {KINDS[k]: r[0] for (k, high), r in sorted(self.ratios.items()) if r is not None and not high}


def row_keys(row: dict[str, Any], chunk: int) -> list[str]:
    """The graph keys one tune row's estimate rests on: its ViT buckets, the prefill chunk, its decoder graphs."""
    block = row["kvcache_partition_len"]
    keys = [visual_call_key(b) for b in row.get("vit_buckets") or []]
    keys.append(prefill_key(chunk, block))
    keys += [decoder_key(g, block) for g in row.get("decoder_batch_sizes") or []]
    return keys


def row_timing(row: dict[str, Any], roof: MeasuredRoofline) -> dict[str, Any]:
    """Which of a row's graphs are measured (or fitted, extrapolated), scaled or bounds, and one summary label."""
    keys = row_keys(row, roof.chunk)
    sources = {k: roof.sources.get(k, ROOFLINE) for k in keys}
    bound = [k for k, s in sources.items() if s == ROOFLINE]
    scaled = [k for k, s in sources.items() if s.startswith(SCALED)]
    measured = [k for k in keys if k not in bound and k not in scaled]
    extrapolated = [k for k in measured if sources[k].startswith(EXTRAPOLATED)]
    if not measured and not scaled:
        summary = ROOFLINE
    elif not bound and not scaled:
        summary = "measured" if all(s.startswith("measured") for s in sources.values()) else "measured/fitted"
    else:
        rest = [f"{len(scaled)} scaled bound{'s' if len(scaled) != 1 else ''}"] if scaled else []
        rest += [f"{len(bound)} roofline bound"] if bound else []
        summary = f"mixed: {len(measured)} of {len(keys)} graphs measured, {' and '.join(rest)}"
    if extrapolated:
        summary += f"; {len(extrapolated)} extrapolated past the measured contexts"
    return {
        "label": summary,
        "rests_on_estimates": bool(bound or scaled),
        "sources": sources,
        "extrapolated": extrapolated,
    }
