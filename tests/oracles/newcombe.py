"""Oracle: Newcombe's square-and-add (hybrid score) interval for a paired difference, method 10, written from the
paper (Newcombe, Statistics in Medicine 17:2635-2650, 1998, section 2, method 10) with the correlation term phi as
Fagerland, Lydersen and Laake, "Statistical Analysis of Contingency Tables" (CRC 2017) eq. 8.8 give it: the Wilson
limits from statsmodels, z from scipy. Nothing of qvl is imported.

phi = (AD - BC - N/2) / sqrt(EFGH) when AD - BC > N/2; 0 when 0 <= AD - BC <= N/2; (AD - BC) / sqrt(EFGH) when
AD - BC < 0; 0 when a margin (E, F, G, H) is empty.
"""

import math

from scipy.stats import norm
from statsmodels.stats.proportion import proportion_confint


def phi(a, b, c, d):
    n = a + b + c + d
    e, f, g, h = a + b, c + d, a + c, b + d
    if e * f * g * h == 0:
        return 0.0
    cross = a * d - b * c
    if cross > n / 2:
        return (cross - n / 2) / math.sqrt(e * f * g * h)
    if cross >= 0:
        return 0.0
    return cross / math.sqrt(e * f * g * h)


def interval(a, b, c, d, alpha=0.05):
    """(delta, lower, upper) of p1 - p2, p1 = (a+b)/n, p2 = (a+c)/n."""
    n = a + b + c + d
    z = norm.ppf(1 - alpha / 2)
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = proportion_confint(a + b, n, alpha=alpha, method="wilson")
    l2, u2 = proportion_confint(a + c, n, alpha=alpha, method="wilson")
    assert z > 0
    ph = phi(a, b, c, d)
    delta = p1 - p2
    lower = delta - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * ph * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    upper = delta + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * ph * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return delta, lower, upper
