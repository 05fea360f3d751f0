"""Intervals and the paired test, with the standard library only (docs/eval.md, "Reading the numbers").

- ``wilson``: the Wilson score interval for one proportion (Wilson, JASA 22:209, 1927).
- ``mcnemar_exact``: McNemar's test, exact: the two-sided binomial test of ``b`` against ``c`` on the discordant
  pairs (``b + c`` trials, p = 1/2), doubled one tail capped at 1 (as R's ``mcnemar.exact`` / Fagerland, Lydersen
  and Laake, "Statistical Analysis of Contingency Tables", 2017, §8.6, the "exact conditional" test).
- ``paired_difference``: the difference of two paired proportions with Newcombe's square-and-add (hybrid score)
  interval: Newcombe, "Improved confidence intervals for the difference between binomial proportions based on
  paired data", Statistics in Medicine 17:2635-2650 (1998), method 10, with the correlation term as Fagerland et
  al. 2017 §8.5.4 give it (and their R package ``contingencytables``).
"""

from __future__ import annotations

import math
from fractions import Fraction
from statistics import NormalDist

Z95 = NormalDist().inv_cdf(0.975)  # 1.959963984540054
EXACT_LIMIT = 2000  # discordant pairs summed in exact integers; above, in log space (relative error ~1e-12)
EXACT_DECISION_LIMIT = 20000  # discordant pairs up to which the gate decides on the exact rational p-value


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of ``k`` successes in ``n`` (None for ``n == 0``)."""
    if n <= 0:
        return None
    p = k / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def _lower_tail(m: int, n: int) -> float:
    """P(X <= m) for X ~ Binomial(n, 1/2)."""
    if n <= EXACT_LIMIT:
        return sum(math.comb(n, k) for k in range(m + 1)) / 2**n
    logs = [math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2) for k in range(m + 1)]
    top = max(logs)
    return math.exp(top) * math.fsum(math.exp(x - top) for x in logs)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts ``b`` and ``c`` (1 when there are none)."""
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * _lower_tail(min(b, c), n))


def _phi(a: int, b: int, c: int, d: int) -> float:
    """The correlation term of Newcombe's paired interval (Fagerland et al. 2017, eq. 8.8): 0 when a margin is
    empty; ``ad - bc`` lowered by ``n/2`` when above it, 0 between 0 and ``n/2``, as it is when negative."""
    n = a + b + c + d
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    if margins == 0:
        return 0.0
    cross = a * d - b * c
    if cross > n / 2:
        return (cross - n / 2) / math.sqrt(margins)
    if cross >= 0:
        return 0.0
    return cross / math.sqrt(margins)


def paired_difference(a: int, b: int, c: int, d: int, z: float = Z95) -> tuple[float, tuple[float, float]] | None:
    """``p1 - p2`` and its Newcombe interval for a paired table: ``a`` both right, ``b`` right only in the first
    run, ``c`` right only in the second, ``d`` both wrong (p1 = (a+b)/n, p2 = (a+c)/n). None when n is 0."""
    n = a + b + c + d
    if n == 0:
        return None
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n, z) or (0.0, 1.0)
    l2, u2 = wilson(a + c, n, z) or (0.0, 1.0)
    phi = _phi(a, b, c, d)
    below = math.sqrt(max(0.0, (p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2)))
    above = math.sqrt(max(0.0, (p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1)))
    delta = p1 - p2
    return delta, (max(-1.0, delta - below), min(1.0, delta + above))


def mcnemar_below(b: int, c: int, alpha: Fraction) -> bool:
    """Whether the exact McNemar p-value is below ``alpha``, decided in exact rational arithmetic on the counts
    (p = min(1, 2 * sum_{k <= min(b, c)} C(n, k) / 2^n)); above EXACT_DECISION_LIMIT discordant pairs, on the
    log-space value (relative error ~1e-12)."""
    n = b + c
    if n > EXACT_DECISION_LIMIT:
        return mcnemar_exact(b, c) < alpha
    term, tail = 1, 0
    for k in range(min(b, c) + 1):
        tail += term
        term = term * (n - k) // (k + 1)
    return min(Fraction(1), Fraction(2 * tail, 2**n)) < alpha
