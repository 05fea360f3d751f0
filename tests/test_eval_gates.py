"""`qvl eval`'s gates decide in exact arithmetic on the counts: a drop exactly equal to --max-drop is "within" it,
--min-accuracy compares k/n with the typed fraction, significance is the exact rational McNemar p against 1/20
(scipy's binomtest as the oracle), and the messages never print a number that reads on the other side of the
comparison that decided (eval-oracles audit, findings 4, 7 and 8; mutants G02 and G05)."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest

from qwenvl_rbln.evaluation import gates
from qwenvl_rbln.evaluation.stats import mcnemar_below, mcnemar_exact, paired_difference
from tests.fakes_rbln import run_main
from tests.test_eval_report import _eval, _file, _line, _paired


def _report(a: int, b: int, c: int, d: int) -> dict[str, Any]:
    n = a + b + c + d
    delta, (lo, hi) = paired_difference(a, b, c, d)
    return {
        "n_shared": n, "only_this": b, "only_baseline": c, "mcnemar_p": mcnemar_exact(b, c),
        "delta_ci95": [lo * 100, hi * 100], "baseline_accuracy": (a + c) / n, "accuracy_shared": (a + b) / n,
        "delta_points": delta * 100,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("table", "points"),
    [((70, 0, 20, 10), 20), ((50, 0, 20, 30), 20), ((14, 0, 6, 0), 30), ((8, 0, 6, 10), 25), ((3, 0, 6, 1), 60)],
)
def test_a_drop_exactly_equal_to_max_drop_is_within_it(table, points, tmp_path, capsys):
    this, base = _paired(tmp_path, *table)
    code, doc, err = _eval(capsys, "--score", str(this), "--baseline", str(base), "--max-drop", str(points))
    assert code == 0, err
    (gate,) = doc["gates"]
    assert gate["passed"] and f"within --max-drop {points}" in gate["message"], gate["message"]
    assert f"changed -{points}.00 points" in gate["message"]
    # one question more lost is more than POINTS (and significant): fails
    a, b, c, d = table
    this, base = _paired(tmp_path, a - 1 if a else a, b, c + 1, d if a else d - 1)
    assert _eval(capsys, "--score", str(this), "--baseline", str(base), "--max-drop", str(points))[0] == 9


@settings(max_examples=300, deadline=None)
@given(st.tuples(*[st.integers(0, 60)] * 4).filter(lambda t: sum(t) > 0), st.integers(0, 10000))
def test_the_drop_gate_is_the_exact_comparison(table, hundredths):
    a, b, c, d = table
    points = hundredths / 100
    gate = gates._drop_gate(_report(*table), points)
    n = a + b + c + d
    larger = Fraction(100 * (c - b), n) > Fraction(hundredths, 100)
    significant = b + c > 0 and Fraction(binomtest(b, b + c, 0.5).pvalue).limit_denominator(10**15) < Fraction(1, 20)
    assert gate["passed"] is not (larger and significant)


@pytest.mark.parametrize(("b", "c"), [(1009, 1100), (1753, 1872), (1814, 1935), (0, 0), (8, 1), (6, 16), (12, 8)])
def test_significance_is_decided_on_the_exact_p_value(b, c):
    n = b + c
    exact = min(Fraction(1), Fraction(2 * sum(math.comb(n, k) for k in range(min(b, c) + 1)), 2**n)) if n else 1
    assert mcnemar_below(b, c, Fraction(1, 20)) is (exact < Fraction(1, 20))
    if n:
        assert bool(binomtest(b, n, 0.5).pvalue < 0.05) is (exact < Fraction(1, 20))


def test_p_just_below_005_is_not_printed_as_005(tmp_path, capsys):
    this, base = _paired(tmp_path, 0, 1009, 1100, 0)
    code, doc, err = _eval(capsys, "--score", str(this), "--baseline", str(base), "--max-drop", "1")
    assert code == 9
    message = doc["gates"][0]["message"]
    assert "p = 0.049997" in message and "p = 0.05)" not in message and "significant (p < 0.05)" in message


@pytest.mark.parametrize(
    ("k", "n", "typed", "code", "says"),
    [
        (1, 3, "0.33333333333333337", 8, "33.33333333333333 % (1/3; "),
        (1, 3, "0.3333333333333333", 0, "is at least --min-accuracy 0.3333333333333333"),
        (17, 20, "0.85", 0, "accuracy 85.00 % (17/20;"),
        (7, 10, "0.7", 0, "is at least --min-accuracy 0.7 (70.00 %)"),
        (16, 20, "0.85", 8, "is below --min-accuracy 0.85 (85.00 %)"),
    ],
)
def test_min_accuracy_compares_k_over_n_with_the_typed_fraction(k, n, typed, code, says, tmp_path, capsys):
    path = _file(tmp_path / "r.jsonl", [_line(f"q{i}", i < k) for i in range(n)])
    got, doc, err = _eval(capsys, "--score", str(path), "--min-accuracy", typed)
    assert got == code, err
    assert says in doc["gates"][0]["message"], doc["gates"][0]["message"]
    if code:
        assert f"is below --min-accuracy {typed} (" in err


@pytest.mark.parametrize("value", ["-2", "-0.5", "nan", "101"])
def test_a_negative_or_impossible_max_drop_is_refused_exit_2(value, tmp_path, capsys):
    this, base = _paired(tmp_path, 5, 0, 0, 5)
    code, out, err = run_main(["eval", "--score", str(this), "--baseline", str(base), f"--max-drop={value}"], capsys)
    assert code == 2 and out == "" and "is not a number of percentage points between 0 and 100" in err, err


def test_no_gate_message_prints_two_sides_the_same(tmp_path: Path, capsys):
    """A drop of 20 + 1/300 points against --max-drop 20 prints enough digits to show it is more."""
    this, base = _paired(tmp_path, 0, 0, 6001, 23999)  # drop = 100 * 6001 / 30000 = 20.00333...
    code, doc, _ = _eval(capsys, "--score", str(this), "--baseline", str(base), "--max-drop", "20")
    message = doc["gates"][0]["message"]
    assert code == 9 and "fell 20.003 points" in message and "more than --max-drop 20 " in message, message
    assert json.dumps(doc["gates"][0]["value"]) == json.dumps(float(Fraction(6001, 300)))
