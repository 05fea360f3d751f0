"""Least-squares fit of a graph's time over context, ``t(n) = c0 + a*n + b*n^2``, with the fit's own error.

A decoder step reads ``n`` tokens of KV per row (linear in ``n``); a prefill chunk's attention grows with the
tokens before it (linear) and its scores with their square at long context, so a quadratic covers both without
pretending to know the device's constants. The error is the relative residual at the measured points (RMS and
worst), so a caller can say "fitted, +-x %" and knows when the fit is not worth trusting (few points, noise).
Pure Python: three unknowns, solved from the normal equations with ``n`` scaled to [0, 1] for conditioning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Fit:
    c0: float
    a: float
    b: float
    rms_rel_error: float  # RMS of (fit - measured) / measured over the points
    max_rel_error: float
    points: int
    lo: int  # the measured context range: outside it the fit extrapolates
    hi: int

    def __call__(self, n: float) -> float:
        return self.c0 + self.a * n + self.b * n * n

    def extrapolates(self, n: float) -> bool:
        return n < self.lo or n > self.hi

    def to_dict(self) -> dict[str, Any]:
        return {
            "c0_s": self.c0,
            "a_s_per_token": self.a,
            "b_s_per_token2": self.b,
            "rms_rel_error": self.rms_rel_error,
            "max_rel_error": self.max_rel_error,
            "points": self.points,
            "context_range": [self.lo, self.hi],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Fit:
        lo, hi = d["context_range"]
        return cls(
            float(d["c0_s"]),
            float(d["a_s_per_token"]),
            float(d["b_s_per_token2"]),
            float(d["rms_rel_error"]),
            float(d["max_rel_error"]),
            int(d["points"]),
            int(lo),
            int(hi),
        )


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    size = len(v)
    rows = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(size):
        piv = max(range(col, size), key=lambda r: abs(rows[r][col]))
        if abs(rows[piv][col]) < 1e-300:
            return None
        rows[col], rows[piv] = rows[piv], rows[col]
        for r in range(size):
            if r != col:
                f = rows[r][col] / rows[col][col]
                rows[r] = [x - f * y for x, y in zip(rows[r], rows[col], strict=True)]
    return [rows[i][size] / rows[i][i] for i in range(size)]


def fit_quadratic(points: list[tuple[float, float]]) -> Fit | None:
    """``c0 + a*n + b*n^2`` through (context, seconds) points by least squares; fewer than 3 distinct contexts
    fit a line (2) or a constant (1). None without points."""
    pts = [(float(n), float(t)) for n, t in points]
    if not pts:
        return None
    distinct = len({n for n, _ in pts})
    degree = min(2, distinct - 1)
    scale = max(abs(n) for n, _ in pts) or 1.0
    xs = [n / scale for n, _ in pts]
    ys = [t for _, t in pts]
    k = degree + 1
    m = [[sum(x ** (i + j) for x in xs) for j in range(k)] for i in range(k)]
    v = [sum(y * x**i for x, y in zip(xs, ys, strict=True)) for i in range(k)]
    coef = _solve(m, v) or [sum(ys) / len(ys)] + [0.0] * degree
    coef += [0.0] * (3 - len(coef))
    c0, a, b = coef[0], coef[1] / scale, coef[2] / scale**2
    rel = [(c0 + a * n + b * n * n - t) / t for n, t in pts if t > 0]
    rms = math.sqrt(sum(r * r for r in rel) / len(rel)) if rel else 0.0
    worst = max((abs(r) for r in rel), default=0.0)
    lo, hi = int(min(n for n, _ in pts)), int(max(n for n, _ in pts))
    return Fit(c0, a, b, rms, worst, len(pts), lo, hi)
