"""qvl eval's scoring and statistics against the field's own implementations, on many generated cases and on the
audits' worked examples: the official VQA script, the DocVQA ANLS script and VLMEvalKit's can_infer as literal ports
under tests/oracles/ (source, commit and licence at their top); statsmodels and scipy for the statistics."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.proportion import proportion_confint

from qwenvl_rbln.evaluation.normalize import vqa_normalize
from qwenvl_rbln.evaluation.scoring import anls, choose_option, score_item, vqa_accuracy
from qwenvl_rbln.evaluation.stats import mcnemar_exact, paired_difference, wilson
from tests.oracles import docvqa_anls, newcombe, vlmevalkit_matching, vqa_eval

# the eval-oracles audit's ten VQAv2-style lines: (prediction, answers, the official script's score)
VQAV2_TABLE = [
    ("no", ["yes"] * 9 + ["no"], 0.3),
    ("yes", ["yes"] * 9 + ["no"], 1.0),
    ("3", ["2", "2", "2", "3", "3", "2", "two", "2", "3", "2"], 0.9),
    ("maroon", ["red"] * 7 + ["dark red", "maroon", "burgundy"], 0.3),
    ("dark red", ["red", "red", "dark red", "dark red", "maroon", "red", "red", "burgundy", "red", "red"], 0.6),
    ("Yes", ["yes"] * 10, 0.0),  # ten identical answers: the script normalizes nothing
    ("yes.", ["yes"] * 10, 0.0),
    ("tennis", ["tennis"] * 10, 1.0),
    ("ski", ["skiing"] * 8 + ["ski", "cross country skiing"], 0.3),
    ("dogs", ["dog's", "dogs"] + ["dog"] * 8, 0.3),
]


@pytest.mark.parametrize(("prediction", "answers", "official"), VQAV2_TABLE)
def test_the_audits_vqav2_lines_score_as_the_official_script(prediction, answers, official):
    got = score_item(prediction, answers, None, "vqa")
    assert got.score == pytest.approx(official, abs=1e-12)
    assert got.score == vqa_eval.question_accuracy(prediction, answers)
    assert got.correct is (official > 0)


def test_the_audits_vqav2_file_means_47_percent():
    mean = sum(score_item(p, a, None, "vqa").score for p, a, _ in VQAV2_TABLE) / len(VQAV2_TABLE)
    assert mean == pytest.approx(0.47)


_WORDS = [
    "dog's", "dogs", "dog", "dont", "don't", "it's", "its", "im", "i'm", "Im", "ten", "two", "2", "none", "a", "an",
    "The", "red", "yes", "no", "1,000", "1,,000", "3.5", "t-shirt", "'red'", "black-and-white", "youre", "ten'",
    "a'", "x", "wont", "won't", "oclock", "y'all", "yall", "10", "0",
]  # fmt: skip
_MARKS = list(";/[]\"{}()=+\\_-><@`,?!.'") + [" ", "  ", "\n", "\t", ".."]


@st.composite
def _answer(draw):
    parts = draw(st.lists(st.one_of(st.sampled_from(_WORDS), st.sampled_from(_MARKS)), min_size=1, max_size=6))
    glue = draw(st.sampled_from(["", " "]))
    return glue.join(parts)


@settings(max_examples=600, deadline=None)
@given(_answer())
@example("." * 40 + "x")  # the script strips at most 32 periods (re.UNICODE passed as count)
@example("1,,000")
@example("dog's")
@example("ten'")
def test_vqa_normalization_is_the_official_scripts(text):
    assert vqa_normalize(text) == vqa_eval.normalize(text)


@pytest.mark.parametrize(
    ("pair", "equal"),
    [
        (("dog's", "dogs"), False),
        (("it's", "its"), False),
        (("im", "i'm"), False),  # the table's key is "Im": after lower case it never matches
        (("dont", "don't"), True),  # the contraction table
        (("won't", "wont"), True),
        (("'red'", "red"), False),
        (("1,000", "1000"), True),
        (("1,,000", "1 000"), True),
    ],
)
def test_contractions_follow_the_official_table(pair, equal):
    assert (vqa_normalize(pair[0]) == vqa_normalize(pair[1])) is equal
    assert (vqa_eval.normalize(pair[0]) == vqa_eval.normalize(pair[1])) is equal


def test_a_typographic_apostrophe_reads_as_a_typed_one_the_kept_difference():
    """Chat models write ’; the script never saw one (it would call don’t and don't different)."""
    assert vqa_normalize("Don\u2019t.") == vqa_normalize("dont") == "don't"
    assert vqa_eval.normalize("don\u2019t") != vqa_eval.normalize("dont")
    assert score_item("don\u2019t", ["dont"], None, "vqa").correct


_POOL = ["yes", "no", "Yes", "yes.", "2", "two", "3", "red", "dark red", "the red", "dog's", "dogs", "don't", "dont"]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(_POOL), min_size=10, max_size=10), st.sampled_from([*_POOL, "maroon", " YES "]))
def test_vqa_accuracy_is_the_official_scripts_on_ten_annotators(answers, prediction):
    assert vqa_accuracy(prediction, answers) == vqa_eval.question_accuracy(prediction, answers)
    assert score_item(prediction, answers, None, "vqa").score == vqa_eval.question_accuracy(prediction, answers)


def test_repeated_answers_are_annotators_and_exact_stays_its_own_metric():
    answers = ["red", "red", "red", "maroon"]
    vqa = score_item("maroon", answers, None, "vqa")
    assert vqa.score == vqa_eval.question_accuracy("maroon", answers) == pytest.approx(0.25)  # 3 of 4 subsets: 1/3
    assert score_item("maroon", answers, None, "exact").score == 1.0
    assert score_item("red", ["red", "crimson"], None, "vqa").score == 1.0  # listed once each: any one counts


_TEXT = st.text(alphabet="ab1 .EeIiß$", min_size=0, max_size=8)


@settings(max_examples=800, deadline=None)
@given(_TEXT.filter(lambda s: s.strip()), st.lists(_TEXT.filter(lambda s: s.strip()), min_size=1, max_size=3))
@example("12", ["13"])  # NL exactly 0.5: the script keeps 0.5
@example("hello word", ["hello   world"])  # raw lengths in the denominator
def test_anls_is_the_docvqa_scripts(prediction, answers):
    assert anls(prediction, answers) == docvqa_anls.anls(answers, [prediction])


@pytest.mark.parametrize(
    ("prediction", "answers", "value"),
    [("12", ["13"], 0.5), ("1990", ["1991"], 0.75), ("hello word", ["hello   world"], 1 - 1 / 13), ("ab", ["ab"], 1)],
)
def test_the_audits_anls_lines(prediction, answers, value):
    got = score_item(prediction, answers, None, "anls")
    assert got.score == pytest.approx(value) and got.correct


_OPTIONS = ["cat", "dog", "bird", "fish"]
_MC_WORDS = ["A", "B", "C", "D", "E", "Z", "a", "is", "the", "answer", "Answer:", "(B)", "B.", "**C**", "cat",
             "Dog", "bird", "not", "I", "think", "correct", "answer is B", "Cannot determine the answer", "sits",
             "on", "mat"]  # fmt: skip


@settings(max_examples=800, deadline=None)
@given(st.lists(st.sampled_from(_MC_WORDS), min_size=1, max_size=8), st.integers(2, 4))
def test_multiple_choice_reads_as_vlmevalkits_can_infer(words, count):
    prediction = " ".join(words)
    options = _OPTIONS[:count]
    want = vlmevalkit_matching.can_infer(prediction, {chr(65 + i): o for i, o in enumerate(options)})
    letters = "ABCD"[:count]
    assert choose_option(prediction, options) == (want if want and want in letters else None)


@pytest.mark.parametrize(
    "prediction",
    ["A cat sits on a mat", "A dog is sitting", "A bird is flying over the sea", "A or B? A dog.",
     "Between A and B, the dog", "B and C are wrong; it is a cat", "Not A, not C: a bird", "(B)", "B.", "Answer: B",
     "dog", "A and B", "A is correct", "Dog."],
)  # fmt: skip
def test_the_audits_multiple_choice_rows_read_as_vlmevalkit(prediction):
    want = vlmevalkit_matching.can_infer(prediction, dict(zip("ABCD", _OPTIONS, strict=True)))
    assert choose_option(prediction, _OPTIONS) == (want or None)


# ---- statistics


@pytest.mark.parametrize("n", [1, 2, 3, 10, 1000])
def test_wilson_is_statsmodels_for_every_k(n):
    for k in range(n + 1) if n < 50 else (0, 1, 400, 800, 999, 1000):
        lo, hi = wilson(k, n)
        want = proportion_confint(k, n, alpha=0.05, method="wilson")
        assert (lo, hi) == pytest.approx(want, abs=1e-12)


def test_wilson_800_of_1000_is_77_4_to_82_4_percent():
    lo, hi = wilson(800, 1000)
    assert (f"{lo * 100:.1f}", f"{hi * 100:.1f}") == ("77.4", "82.4")


@pytest.mark.parametrize(("b", "c"), [(0, 0), (0, 1), (8, 1), (6, 16), (5, 5), (1009, 1100), (25, 5), (40, 20)])
def test_exact_mcnemar_is_statsmodels_and_scipy(b, c):
    p = mcnemar_exact(b, c)
    assert p == pytest.approx(mcnemar([[0, b], [c, 0]], exact=True).pvalue, rel=1e-9)
    if b + c:
        assert p == pytest.approx(binomtest(b, b + c, 0.5).pvalue, rel=1e-9)


_TABLES = [
    (59, 6, 16, 80),  # Cavo et al.: ad - bc above n/2
    (36, 12, 2, 0),  # Newcombe 1998's example: ad - bc < 0 (negative correlation)
    (0, 5, 5, 0),  # ad - bc < 0
    (1, 4, 6, 0),
    (3, 1, 1, 3),  # ad - bc = 8 > n/2 = 4: the corrected branch
    (2, 1, 1, 1),  # ad - bc = 1 <= n/2 = 2.5
    (5, 3, 4, 3),  # ad - bc = 3 <= n/2 = 7.5
    (4, 2, 2, 2),  # ad - bc = 4: between n/3 and n/2 (the continuity threshold)
    (10, 0, 0, 0),  # an empty margin
    (1, 0, 0, 0),
    (0, 1, 0, 0),
]


@pytest.mark.parametrize("table", _TABLES)
def test_newcombe_interval_is_the_literal_method_10(table):
    delta, (lo, hi) = paired_difference(*table)
    want = newcombe.interval(*table)
    assert (delta, lo, hi) == pytest.approx(want, abs=1e-12)


@settings(max_examples=400, deadline=None)
@given(st.tuples(*[st.integers(0, 40)] * 4).filter(lambda t: sum(t) > 0))
def test_newcombe_on_generated_tables(table):
    delta, (lo, hi) = paired_difference(*table)
    want = newcombe.interval(*table)
    assert (delta, max(-1.0, lo), min(1.0, hi)) == pytest.approx(
        (want[0], max(-1.0, want[1]), min(1.0, want[2])), abs=1e-12
    )
    assert not math.isnan(lo)
