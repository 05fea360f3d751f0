"""``qvl eval``'s CI gates, each with its own exit code (README, "Exit codes"):

- ``--min-accuracy A`` (a fraction, 0..1): fails (exit 8) when the accuracy is below A;
- ``--max-drop POINTS``: fails (exit 9) only when the accuracy fell against ``--baseline`` by more than POINTS
  percentage points on the shared ids AND the fall is significant (exact McNemar p < 0.05); a larger fall that is
  not significant passes with a note saying so: at that size it can be noise.

When both fail, exit 8 (the first gate listed) and the one error line names both.
"""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.errors import EXIT_ACCURACY, EXIT_ACCURACY_DROP, InputError, QvlError

ALPHA = 0.05


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


def _pct(value: float) -> str:
    return f"{value * 100:.2f} %"


def _accuracy_gate(report: dict[str, Any], threshold: float) -> dict[str, Any]:
    acc, ci = report["accuracy"], report["ci95"]
    passed = acc >= threshold
    verb = "is at least" if passed else "is below"
    message = (
        f"accuracy {_pct(acc)} ({report['correct']}/{report['n']}; 95 % CI {_pct(ci[0])} to {_pct(ci[1])}) "
        f"{verb} --min-accuracy {threshold:g} ({_pct(threshold)})"
    )
    return {"gate": "min-accuracy", "threshold": threshold, "value": acc, "passed": passed, "message": message}


def _drop_gate(report: dict[str, Any], points: float) -> dict[str, Any]:
    n, p = report["n_shared"], report["mcnemar_p"]
    if not n:
        raise InputError(
            "--max-drop: this run and the baseline share no id, so there is no paired comparison",
            "compare runs of the same --data",
        )
    drop = -report["delta_points"]
    lo, hi = report["delta_ci95"]
    numbers = (
        f"{_pct(report['baseline_accuracy'])} -> {_pct(report['accuracy_shared'])} on {n} shared questions; "
        f"difference {report['delta_points']:+.2f} points, 95 % CI {lo:+.2f} to {hi:+.2f}; exact McNemar p = {p:.4g}"
    )
    larger, significant = drop > points, p < ALPHA
    passed = not (larger and significant)
    if not larger:
        message = f"accuracy changed {report['delta_points']:+.2f} points ({numbers}): within --max-drop {points:g}"
    elif significant:
        message = (
            f"accuracy fell {drop:.2f} points ({numbers}): more than --max-drop {points:g} and significant "
            f"(p < {ALPHA})"
        )
    else:
        message = (
            f"accuracy fell {drop:.2f} points ({numbers}): more than --max-drop {points:g} but not significant "
            f"(p >= {ALPHA}), so it passes: at {n} questions a fall this size can be noise; more questions would tell"
        )
    return {"gate": "max-drop", "threshold": points, "value": drop, "passed": passed, "message": message}


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
