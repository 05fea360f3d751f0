"""Every figure docs/eval.md quotes from a formula is read out of the page and recomputed with the field's own
implementations (statsmodels, scipy) and qvl's, so a wrong digit in the doc fails here (upstream audit F8: the
page said 82.3 % where Wilson gives 82.4 %)."""

from __future__ import annotations

import re
from pathlib import Path

from scipy.stats import binomtest
from statsmodels.stats.proportion import proportion_confint

from qwenvl_rbln.evaluation.scoring import score_item
from qwenvl_rbln.evaluation.stats import paired_difference
from tests.test_eval_oracles import VQAV2_TABLE

DOC = (Path(__file__).resolve().parents[1] / "docs" / "eval.md").read_text()
TEXT = " ".join(DOC.split())  # the page's sentences, line breaks folded


def _num(text: str) -> int:
    return int(text.replace(",", ""))


def test_the_wilson_examples_are_statsmodels_figures():
    found = re.findall(r"(\d[\d,]*) of (\d[\d,]*) is (\d+\.\d) % to (\d+\.\d) %", TEXT)
    assert len(found) >= 3, found
    for k, n, lo, hi in found:
        want = proportion_confint(_num(k), _num(n), alpha=0.05, method="wilson")
        assert (lo, hi) == (f"{want[0] * 100:.1f}", f"{want[1] * 100:.1f}"), (k, n, lo, hi)


def test_the_paired_examples_on_1000_questions_are_the_formulas_figures():
    """'-2 points on 1,000 questions is p = 0.0003 when it comes from 25 questions lost and 5 gained (CI -3.1 to
    -0.9 points), p = 0.013 from 40 lost and 20 gained (CI -3.5 to -0.5), and -0.4 points from 12 lost and 8 gained
    is p = 0.50 (CI -1.3 to +0.5)'; the intervals with 500 questions right in both runs."""
    found = re.findall(
        r"p = (0\.\d+)(?: when it comes)? from (\d+)(?: questions)? lost and (\d+) gained "
        r"\(CI ([-+]\d\.\d) to ([-+]\d\.\d)",
        TEXT,
    )
    assert len(found) == 2, found
    tail = re.search(r"from 12 lost and 8 gained is p = (0\.\d+) \(CI ([-+]\d\.\d) to ([-+]\d\.\d)\)", TEXT)
    rows = [*found, (tail.group(1), "12", "8", tail.group(2), tail.group(3))]
    for p, lost, gained, lo, hi in rows:
        c, b = int(lost), int(gained)
        got = binomtest(b, b + c, 0.5).pvalue
        digits = len(p.split(".")[1])
        assert f"{got:.{digits}f}" == p or f"{got:.{digits - 1}f}" == p.rstrip("0"), (p, got)
        _, (low, high) = paired_difference(500, b, c, 1000 - 500 - b - c)
        assert (f"{low * 100:+.1f}", f"{high * 100:+.1f}") == (lo if lo[0] in "+-" else lo, hi), (lo, hi, low, high)


def test_the_checked_figures_sentence():
    assert "b = 8, c = 1 is p = 0.0391" in TEXT and f"{binomtest(8, 9, 0.5).pvalue:.4f}" == "0.0391"
    assert "(59, 6, 16, 80) is p = 0.052479" in TEXT and f"{binomtest(6, 22, 0.5).pvalue:.6f}" == "0.052479"
    delta, (lo, hi) = paired_difference(59, 6, 16, 80)
    said = f"a difference of {delta * 100:.2f} points with interval {lo * 100:.2f} to {hi * 100:.2f}"
    assert said in TEXT, said


def test_the_gate_example_is_the_table_5_1_8_6():
    delta, (lo, hi) = paired_difference(5, 1, 8, 6)
    said = f"difference {delta * 100:+.2f} points, 95 % CI {lo * 100:+.2f} to {hi * 100:+.2f}; exact McNemar p = "
    said += f"{binomtest(1, 9, 0.5).pvalue:.4g}"
    assert said in TEXT, said


def test_the_vqav2_example_scores_are_qvls():
    got = [score_item(p, a, None, "vqa") for p, a, _ in VQAV2_TABLE]
    scores = ", ".join(f"{g.score:.10g}" for g in got)
    mean = sum(g.score for g in got) / len(got)
    right = sum(g.correct for g in got) / len(got)
    exact = sum(score_item(p, a, None, "exact").correct for p, a, _ in VQAV2_TABLE) / len(got)
    said = f"score {scores}: `vqa_accuracy` {mean * 100:.1f} %, as the script gives them; `accuracy` (an annotator "
    said += (
        f"gave it) is {right * 100:.0f} %, and exact match against any answer (`--metric exact`) {exact * 100:.0f} %"
    )
    assert said in TEXT, said
