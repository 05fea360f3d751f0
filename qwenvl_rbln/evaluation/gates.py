"""``qvl eval``'s CI gates, each with its own exit code (docs/reference.md, "Exit codes"):

- ``--min-accuracy A`` (a fraction, 0..1): fails (exit 8) when the accuracy is below A;
- ``--max-drop POINTS``: fails (exit 9) only when the accuracy fell against ``--baseline`` by more than POINTS
  percentage points on the shared ids AND the fall is significant (exact McNemar p < 0.05); a larger fall that is
  not significant passes with a note saying so: at that size it can be noise.

When both fail, exit 8 (the first gate listed) and the one error line names both. Both decide in exact arithmetic
on the counts (``fractions.Fraction``): the flag's value as typed (its shortest decimal), the accuracy ``k/n``, the
drop ``100 (c - b) / n`` points, the exact McNemar p; a drop exactly equal to POINTS is not "more than" it. The
messages print each number with as many digits as it takes to show the comparison that decided.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from qwenvl_rbln.errors import EXIT_ACCURACY, EXIT_ACCURACY_DROP, InputError, QvlError
from qwenvl_rbln.evaluation.stats import mcnemar_below

ALPHA = 0.05
_ALPHA = Fraction(1, 20)


class GateFailed(QvlError):
    """A CI gate of ``qvl eval`` is broken; the exit code says which."""


def check_thresholds(min_accuracy: float | None, max_drop: float | None, baseline: Any) -> None:
    """The gate flags refused before any work: a fraction for the accuracy, points >= 0 that need a baseline."""
    if min_accuracy is not None and not 0.0 <= min_accuracy <= 1.0:
        raise InputError(
            f"--min-accuracy {min_accuracy:g} is not a fraction between 0 and 1", "e.g. --min-accuracy 0.85 for 85 %"
        )
    if max_drop is not None:
        if not 0.0 <= max_drop <= 100.0:
            raise InputError(
                f"--max-drop {max_drop:g} is not a number of percentage points between 0 and 100",
                "e.g. --max-drop 2 (fail on a significant fall of more than 2 points)",
            )
        if baseline is None:
            raise InputError(
                "--max-drop compares against a baseline and needs --baseline B.jsonl",
                "add --baseline with an earlier qvl eval results file, or drop --max-drop",
            )


def typed(value: float) -> Fraction:
    """A flag's value as the user typed it: the shortest decimal that reads back as the same float."""
    return Fraction(repr(float(value)))


def flag_text(value: float) -> str:
    """The flag's value as typed (``20``, ``0.85``, ``0.33333333333333337``)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def decimal(value: Fraction, digits: int) -> str:
    """``value`` rounded to ``digits`` decimals, exactly (no float on the way)."""
    q = round(value * 10**digits)
    sign, q = ("-" if q < 0 else ""), abs(q)
    return f"{sign}{q // 10**digits}.{str(q % 10**digits).zfill(digits)}"


def shown(value: Fraction, other: Fraction, scale: int = 1) -> tuple[str, str]:
    """``value`` and ``other`` (times ``scale``) with two decimals, or as many more as it takes for the printed
    numbers to compare as the exact ones do (never "20.00 ... more than 20.00")."""
    value, other = value * scale, other * scale
    want = (value > other) - (value < other)
    for digits in range(2, 40):
        a, b = decimal(value, digits), decimal(other, digits)
        if (Fraction(a) > Fraction(b)) - (Fraction(a) < Fraction(b)) == want:
            return a, b
    return str(value), str(other)


def p_text(p: float, significant: bool) -> str:
    """The p-value with 4 significant digits, or more where fewer would read on the other side of 0.05."""
    for digits in range(4, 18):
        text = f"{p:.{digits}g}"
        if (Fraction(text) < _ALPHA) == significant:
            return text
    return repr(p)


def _accuracy_gate(report: dict[str, Any], threshold: float) -> dict[str, Any]:
    k, n, ci = report["correct"], report["n"], report["ci95"]
    exact, bar = Fraction(k, n), typed(threshold)
    passed = exact >= bar
    verb = "is at least" if passed else "is below"
    acc_text, bar_text = shown(exact, bar, 100)
    message = (
        f"accuracy {acc_text} % ({k}/{n}; 95 % CI {ci[0] * 100:.2f} % to {ci[1] * 100:.2f} %) "
        f"{verb} --min-accuracy {flag_text(threshold)} ({bar_text} %)"
    )
    return {"gate": "min-accuracy", "threshold": threshold, "value": report["accuracy"], "passed": passed,
            "message": message}  # fmt: skip


def _drop_gate(report: dict[str, Any], points: float) -> dict[str, Any]:
    n = report["n_shared"]
    if not n:
        raise InputError(
            "--max-drop: this run and the baseline share no id, so there is no paired comparison",
            "compare runs of the same --data",
        )
    b, c, p = report["only_this"], report["only_baseline"], report["mcnemar_p"]
    drop, bar = Fraction(100 * (c - b), n), typed(points)
    larger, significant = drop > bar, mcnemar_below(b, c, _ALPHA)
    drop_text, _ = shown(drop, bar)
    lo, hi = report["delta_ci95"]
    numbers = (
        f"{report['baseline_accuracy'] * 100:.2f} % -> {report['accuracy_shared'] * 100:.2f} % on {n} shared "
        f"questions; difference {report['delta_points']:+.2f} points, 95 % CI {lo:+.2f} to {hi:+.2f}; "
        f"exact McNemar p = {p_text(p, significant)}"
    )
    passed = not (larger and significant)
    flag = flag_text(points)
    if not larger:
        digits = len(drop_text.partition(".")[2])
        change = decimal(-drop, digits)
        message = (
            f"accuracy changed {'' if change.startswith('-') else '+'}{change} points ({numbers}): within "
            f"--max-drop {flag}"
        )
    elif significant:
        message = (
            f"accuracy fell {drop_text} points ({numbers}): more than --max-drop {flag} and significant (p < {ALPHA})"
        )
    else:
        message = (
            f"accuracy fell {drop_text} points ({numbers}): more than --max-drop {flag} but not significant "
            f"(p >= {ALPHA}), so it passes: at {n} questions a fall this size can be noise; more questions would tell"
        )
    return {"gate": "max-drop", "threshold": points, "value": float(drop), "passed": passed, "message": message}


def check(report: dict[str, Any], min_accuracy: float | None, max_drop: float | None) -> GateFailed | None:
    """Fill ``report["gates"]``; the error to raise when one is broken (after the report is printed), else None."""
    gates = []
    if min_accuracy is not None:
        gates.append(_accuracy_gate(report, min_accuracy))
    if max_drop is not None:
        gates.append(_drop_gate(report, max_drop))
    report["gates"] = gates
    broken = [g for g in gates if not g["passed"]]
    if not broken:
        return None
    code = EXIT_ACCURACY if broken[0]["gate"] == "min-accuracy" else EXIT_ACCURACY_DROP
    hint = f"the questions answered wrong: jq -c 'select(.correct == false)' {report['results']}"
    return GateFailed("; and ".join(f"--{g['gate']} failed: {g['message']}" for g in broken), hint, exit_code=code)
