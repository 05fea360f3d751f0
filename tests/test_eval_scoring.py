"""`qvl eval`'s rules on hand-made cases, and its statistics against figures computed independently of this code:
the Wilson interval (7 of 10: 0.397-0.892, the textbook example), the exact McNemar test (b=8, c=1: 2 x 10/512 =
0.0391; b=6, c=16: 0.052479, and Newcombe's paired interval -0.1186 to -0.0046, both for Cavo et al. 2012's table
[[59, 6], [16, 80]] as the R package contingencytables' tests give them, from Fagerland et al. 2017, ch. 8)."""

from __future__ import annotations

import math

import pytest

from qwenvl_rbln.evaluation.normalize import levenshtein, vqa_normalize
from qwenvl_rbln.evaluation.scoring import anls, answer_letters, choose_option, score_item
from qwenvl_rbln.evaluation.stats import mcnemar_exact, paired_difference, wilson


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("Red", "red"),  # case
        ("red.", "red"),  # a trailing period
        ("  Yes.\n", "yes"),
        ("two", "2"),  # number words
        ("None", "0"),
        ("Ten dogs", "10 dogs"),
        ("a triangle", "triangle"),  # articles
        ("The Red Circle", "red circle"),
        ("an apple", "apple"),
        ("3.5", "3.5"),  # a period between digits stays
        ("1,000", "1000"),  # a number's comma goes
        ("black-and-white", "black and white"),  # punctuation not touching a space becomes a space
        ("red, blue", "red blue"),  # touching a space: removed
        ("(left)", "left"),
        ("dont", "don't"),  # contractions: the official script's table
        ("don't", "don't"),
        ("don\u2019t", "don't"),  # a typographic apostrophe reads as a typed one
        ("yes!", "yes"),
    ],
)
def test_vqa_normalization(raw, normal):
    assert vqa_normalize(raw) == normal


@pytest.mark.parametrize(
    ("prediction", "answers", "right"),
    [
        ("Triangle.", ["triangle"], True),
        ("A triangle", ["triangle"], True),
        ("two", ["2"], True),
        ("2", ["two"], True),
        ("Yes", ["no"], False),
        ("triangles", ["triangle"], False),  # exact match after normalization, not a substring
        ("The answer is red", ["red"], False),
        ("blue", ["navy", "blue"], True),  # any listed answer counts
    ],
)
def test_open_questions_match_any_answer_after_normalization(prediction, answers, right):
    got = score_item(prediction, answers, None, "vqa")
    assert got.correct is right and got.score == (1.0 if right else 0.0) and got.choice is None


@pytest.mark.parametrize("metric", ["vqa", "exact", "anls"])
def test_a_request_that_did_not_run_is_wrong_and_scores_zero(metric):
    for answers, choices in ((["red"], None), (["red"] * 3, None), (["B"], ["cat", "dog"])):
        got = score_item(None, answers, choices, metric)
        assert (got.correct, got.score, got.choice) == (False, 0.0, None)


CHOICES = ["cat", "dog", "bird", "fish"]


@pytest.mark.parametrize(
    ("prediction", "chosen"),
    [
        ("B", "B"),
        ("B.", "B"),
        ("(B)", "B"),
        ("B. dog", "B"),
        ("The answer is B", "B"),
        ("**C**", "C"),
        ("dog", "B"),  # the option's text
        ("It is a dog.", "B"),
        ("A or B", None),  # two letters: no choice
        ("a cat and a dog", None),  # two option texts
        ("A cat sits on the mat", "A"),  # a letter early in a long answer is no choice; then the option text
        ("A is correct", "A"),  # a letter among the last four words chooses it
        ("Dog.", "B"),  # option text in another case
        ("The answer is B because the dog barks loudly at night", "B"),  # VLMEvalKit's "answer is X" rule
        ("Cannot determine the answer", None),  # a refusal chooses nothing
        ("horse", None),
        ("b", None),  # a lower-case letter is not a letter choice, nor an option's text
    ],
)
def test_a_multiple_choice_prediction_chooses_one_option_or_none(prediction, chosen):
    assert choose_option(prediction, CHOICES) == chosen


@pytest.mark.parametrize("answers", [["B"], ["B."], ["dog"], ["Dog."], ["(b)"]])
@pytest.mark.parametrize("metric", ["vqa", "anls"])
def test_an_answer_names_its_option_by_letter_or_by_text(answers, metric):
    assert answer_letters(answers, CHOICES) == {"B"}
    right = score_item("B", answers, CHOICES, metric)
    assert (right.correct, right.score, right.choice) == (True, 1.0, "B")
    assert score_item("dog", answers, CHOICES, metric).correct is True
    wrong = score_item("C", answers, CHOICES, metric)
    assert (wrong.correct, wrong.score, wrong.choice) == (False, 0.0, "C")


def test_multiple_choice_ignores_the_metric():
    assert score_item("B", ["B"], CHOICES, "anls").correct is True


def test_levenshtein_on_known_pairs():
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3
    assert levenshtein("flaw", "lawn") == 2


@pytest.mark.parametrize(
    ("prediction", "answers", "value"),
    [
        ("Total", ["total"], 1.0),  # case-insensitive
        ("  total   due ", ["Total Due"], 1.0),  # whitespace collapsed
        ("totl", ["total"], 1 - 1 / 5),  # one edit in five characters
        ("abcde", ["vwxyz"], 0.0),  # distance 1.0: 1 - NL below 0.5, no credit
        ("ab", ["abcd"], 0.5),  # distance exactly 0.5 scores 0.5, as the DocVQA script keeps it
        ("abc", ["abcd"], 0.75),
        ("invoice", ["bill", "invoices"], 1 - 1 / 8),  # the best answer counts
    ],
)
def test_anls_per_item(prediction, answers, value):
    assert anls(prediction, answers) == pytest.approx(value)
    got = score_item(prediction, answers, None, "anls")
    assert got.score == pytest.approx(value) and got.correct is (value > 0)


def test_wilson_seven_of_ten_is_the_textbook_interval():
    lo, hi = wilson(7, 10)
    assert round(lo, 3) == 0.397 and round(hi, 3) == 0.892


def test_wilson_at_the_edges_stays_inside_zero_one():
    assert wilson(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson(10, 10) == (pytest.approx(0.7225, abs=1e-4), 1.0)
    assert wilson(0, 0) is None


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [
        (8, 1, 0.0390625),  # 2 * (1 + 9) / 2**9
        (1, 8, 0.0390625),  # symmetric
        (6, 16, 0.052479),  # Cavo et al. 2012: contingencytables' McNemar_exact_cond_test_paired_2x2
        (0, 0, 1.0),  # no discordant pair: nothing to test
        (5, 5, 1.0),  # capped at 1
        (0, 5, 0.0625),  # 2 / 32
    ],
)
def test_exact_mcnemar(b, c, p):
    assert mcnemar_exact(b, c) == pytest.approx(p, abs=5e-7)


def test_exact_mcnemar_in_log_space_agrees_with_exact_integers_for_large_counts():
    n, m = 2100, 1000  # above EXACT_LIMIT: the log-space sum
    exact = 2 * sum(math.comb(n, k) for k in range(m + 1)) / 2**n
    assert mcnemar_exact(m, n - m) == pytest.approx(exact, rel=1e-9)


def test_newcombe_paired_interval_for_cavo_2012():
    delta, (lo, hi) = paired_difference(59, 6, 16, 80)
    assert round(delta, 4) == -0.0621
    assert round(lo, 4) == -0.1186 and round(hi, 4) == -0.0046


def test_identical_runs_have_a_zero_difference_with_a_symmetric_interval():
    delta, (lo, hi) = paired_difference(20, 0, 0, 12)
    assert delta == 0.0 and lo == pytest.approx(-hi) and lo < 0 < hi
    assert mcnemar_exact(0, 0) == 1.0
    assert paired_difference(0, 0, 0, 0) is None
