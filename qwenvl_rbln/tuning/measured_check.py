"""Check one graph record of timings.json before any figure of it is used: every time finite, positive and inside
what a graph call can take, every context a whole token position, the p10-p90 band around its median, and the fit's
numbers finite. A record that fails says which value and why (``BadRecord``); ``measured`` turns that into the
file's usual refusal ("move it aside and profile again").

Why here and not where the figures are used: tune ranks, deploy writes a router config and profile merges new
points into an entry from these numbers, and a NaN, an infinity or a 0 breaks each differently (NaN sorts first,
``int(nan)`` raises, 0 is divided by). One check at the door keeps every reader right.
"""

from __future__ import annotations

import math
from typing import Any

from qwenvl_rbln.tuning.fit import Fit

# No compiled graph call takes less than a microsecond (a launch alone costs more) or more than an hour: a figure
# outside is a damaged or hand-edited file, and would put a 300-digit throughput into a router config.
MIN_S, MAX_S = 1e-6, 3600.0
MAX_CONTEXT = 2**31 - 1  # a token position; no model has more
TIMES = ("median_s", "p10_s", "p90_s")


class BadRecord(ValueError):
    """One value of a graph record that cannot be used, named with the value."""


def shown(value: Any, limit: int = 60) -> str:
    """``repr`` cut to ``limit`` characters: a refusal stays one readable line whatever the file holds."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRecord(f"{what}={shown(value)} is not a number")
    try:
        out = float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise BadRecord(f"{what}={value} is not a finite number") from None
    if not math.isfinite(out):
        raise BadRecord(f"{what}={shown(value)} is not a finite number")
    return out


def seconds_value(value: Any, what: str) -> float:
    """A measured time: finite, and between MIN_S and MAX_S."""
    out = _number(value, what)
    if not MIN_S <= out <= MAX_S:
        raise BadRecord(f"{what}={shown(value)} is outside 1 us .. 1 h (no graph call takes that long or that short)")
    return out


def _context(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_CONTEXT:
        raise BadRecord(f"{what}={shown(value)} is not a token position (a whole number 0 .. {MAX_CONTEXT})")
    return value


def _point(p: Any, i: int) -> tuple[int, dict[str, float]]:
    if not isinstance(p, dict):
        raise BadRecord(f"points[{i}]={shown(p)} is not a table")
    n = _context(p.get("context"), f"points[{i}].context")
    values = {k: seconds_value(p.get(k), f"context {n} {k}") for k in TIMES}
    if not values["p10_s"] <= values["median_s"] <= values["p90_s"]:
        raise BadRecord(
            f"context {n}: p10_s={values['p10_s']!r} <= median_s={values['median_s']!r} <= "
            f"p90_s={values['p90_s']!r} does not hold"
        )
    return n, values


def _fit(d: Any) -> Fit:
    if not isinstance(d, dict):
        raise BadRecord(f"fit={shown(d)} is not a table")
    coef = [_number(d.get(k), f"fit.{k}") for k in ("c0_s", "a_s_per_token", "b_s_per_token2")]
    errors = [_number(d.get(k), f"fit.{k}") for k in ("rms_rel_error", "max_rel_error")]
    if min(errors) < 0:
        raise BadRecord(f"fit rms_rel_error={errors[0]!r}, max_rel_error={errors[1]!r}: an error is never negative")
    count = d.get("points")
    if type(count) is not int or count < 1:
        raise BadRecord(f"fit.points={shown(count)} is not a positive whole number")
    rng = d.get("context_range")
    if not isinstance(rng, list) or len(rng) != 2:
        raise BadRecord(f"fit.context_range={shown(rng)} is not [first, last]")
    lo, hi = _context(rng[0], "fit.context_range[0]"), _context(rng[1], "fit.context_range[1]")
    if lo > hi:
        raise BadRecord(f"fit.context_range={shown(rng)} runs backwards")
    return Fit(*coef, *errors, count, lo, hi)


def check_record(rec: Any) -> tuple[dict[int, dict[str, float]], Fit | None]:
    """(context -> {median_s, p10_s, p90_s}, fit or None) of one graph record, or ``BadRecord`` naming the value."""
    if not isinstance(rec, dict):
        raise BadRecord(f"the record {shown(rec)} is not a table")
    raw = rec.get("points")
    if not isinstance(raw, list) or not raw:
        raise BadRecord(f"points={shown(raw)} is not a non-empty list")
    points: dict[int, dict[str, float]] = {}
    for i, p in enumerate(raw):
        n, values = _point(p, i)
        if n in points:
            raise BadRecord(f"context {n} is measured twice")
        points[n] = values
    fit = _fit(rec["fit"]) if rec.get("fit") is not None else None
    return points, fit
