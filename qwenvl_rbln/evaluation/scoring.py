"""One item's score, by the rule its kind calls for (docs/eval.md, "Scoring rules"); each is the field's own rule.

- ``vqa`` (default), an open question whose answers are annotators' (an answer repeated, or ten answers: VQAv2,
  TextVQA, VizWiz): the official VQA accuracy (``vqaEval.py``): ``min(#other annotators who gave it / 3, 1)``
  averaged over the ten leave-one-out subsets; normalized only when the annotators disagree, as the script does.
  It counts as ``correct`` when that is above 0 (an annotator gave the answer). Otherwise (each acceptable answer
  listed once): 1 when the normalized prediction equals a normalized answer, else 0.
- ``exact``: that exact match against any listed answer, for every open question (annotators' or not).
- ``anls``: the DocVQA / InfographicVQA scripts' ANLS: ``1 - min NL`` over the answers, kept when at least 0.5,
  else 0; NL over the raw lengths, as the scripts divide. ``correct`` when above 0.
- Multiple choice (the item has ``choices``): VLMEvalKit's ``can_infer`` (``vlmeval/utils/matching_util.py``; its
  rules without a judge model), which must choose an option the answers name.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from qwenvl_rbln.evaluation.normalize import (
    anls_normalize,
    levenshtein,
    process_digit_article,
    process_punctuation,
    vqa_normalize,
    vqa_prepare,
)

METRICS = ("vqa", "exact", "anls")
ANLS_THRESHOLD = 0.5
ANNOTATORS = 10  # VQAv2, TextVQA and VizWiz ask ten people per question
LETTERS = string.ascii_uppercase
_LETTER_NOISE = ".()[],:;!*#{}"  # VLMEvalKit's can_infer_option characters
_REFUSALS = (
    "Sorry, I can't help with images of people yet.",
    "I can't process this file.",
    "I'm sorry, but without the image provided",
    "Cannot determine the answer",
)
_VERBOSE_ANSWER = re.compile(r"(?i)(?:correct\s+)?answer\s+is\s+\**([ABCD])\**")
REFUSED = "Z"  # VLMEvalKit's mark for an answer that refuses or names no option


@dataclass(frozen=True)
class Score:
    """``correct``: counted right; ``score``: the item's metric value; ``choice``: the option chosen (MC only)."""

    correct: bool
    score: float
    choice: str | None = None


def option_letters(count: int) -> str:
    return LETTERS[:count]


def answer_letters(answers: list[str], choices: list[str]) -> set[str]:
    """The options the answers name: a letter in range (``B``, ``B.``, ``(B)``), or an option's text."""
    letters = option_letters(len(choices))
    texts = {vqa_normalize(c): letters[i] for i, c in enumerate(choices)}
    named: set[str] = set()
    for answer in answers:
        key = answer.strip().rstrip(".").strip("()")
        if len(key) == 1 and key.upper() in letters:
            named.add(key.upper())
        elif vqa_normalize(answer) in texts:
            named.add(texts[vqa_normalize(answer)])
    return named


def _infer_option(answer: str, letters: str) -> str | None:
    """VLMEvalKit's ``can_infer_option`` (VERBOSE unset: its default)."""
    if "Failed to obtain answer via API" in answer:
        return None
    if any(err in answer for err in _REFUSALS):
        return REFUSED
    mod = answer
    for ch in _LETTER_NOISE:
        mod = mod.replace(ch, " ")
    splits = [x.strip() for x in mod.split()]
    count = sum(1 for c in letters if c in splits)
    if count == 1:
        for ch in letters:
            if ch in splits and splits.index(ch) > len(splits) - 5:
                return ch
    elif count == 0 and sum(1 for c in (REFUSED, "") if c in splits) == 1:
        return REFUSED
    match = _VERBOSE_ANSWER.search(answer or "")
    if match and match.group(1).upper() in letters:
        return match.group(1).upper()
    return None


def _infer_text(answer: str, choices: list[str]) -> str | None:
    """VLMEvalKit's ``can_infer_text``: exactly one option whose text (lower case) the answer contains."""
    answer = answer.lower()
    if len(answer) > 2 * sum(len(c) for c in choices):
        return None
    found = [LETTERS[i] for i, c in enumerate(choices) if c.lower() in answer]
    return found[0] if len(found) == 1 else None


def choose_option(prediction: str, choices: list[str]) -> str | None:
    """The option the prediction chose (VLMEvalKit's ``can_infer``), or None: none can be read, or it refused."""
    letters = option_letters(len(choices))
    chosen = _infer_option(prediction, letters) or _infer_text(prediction, choices)
    return chosen if chosen is not None and chosen in letters else None


def anls(prediction: str, answers: list[str]) -> float:
    """The DocVQA scripts' ANLS of one item: distances on the normalized strings over the raw lengths."""
    det = anls_normalize(prediction)
    values = []
    for answer in answers:
        length = max(len(answer.upper()), len(prediction.upper()))
        values.append(0.0 if length == 0 else levenshtein(anls_normalize(answer), det) / length)
    result = 1 - min(values)
    return 0.0 if result < ANLS_THRESHOLD else result


def annotator_answers(answers: list[str]) -> bool:
    """Answers from annotators (scored with the VQA accuracy): one given more than once, or ten of them."""
    return len(answers) == ANNOTATORS or len(set(answers)) < len(answers)


def vqa_accuracy(prediction: str, answers: list[str]) -> float:
    """The official VQA accuracy of one question (``vqaEval.py`` ``evaluate``): normalized only when the
    annotators disagree; per left-out annotator ``min(1, matches among the others / 3)``, averaged."""
    gts = [vqa_prepare(a) for a in answers]
    res = vqa_prepare(prediction)
    if len(set(gts)) > 1:
        gts = [process_digit_article(process_punctuation(a)) for a in gts]
        res = process_digit_article(process_punctuation(res))
    accs = [min(1, float(sum(1 for j, g in enumerate(gts) if j != i and g == res)) / 3) for i in range(len(gts))]
    return float(sum(accs)) / len(accs)


def exact_match(prediction: str, answers: list[str]) -> bool:
    return vqa_normalize(prediction) in {vqa_normalize(a) for a in answers}


def score_item(prediction: str | None, answers: list[str], choices: list[str] | None, metric: str) -> Score:
    """Score one item; a request that did not run (``prediction`` None) is wrong and scores 0."""
    if prediction is None:
        return Score(False, 0.0, None)
    if choices:
        choice = choose_option(prediction, choices)
        right = choice is not None and choice in answer_letters(answers, choices)
        return Score(right, 1.0 if right else 0.0, choice)
    if metric == "anls":
        value = anls(prediction, answers)
        return Score(value > 0.0, value)
    if metric == "vqa" and annotator_answers(answers):
        value = vqa_accuracy(prediction, answers)
        return Score(value > 0.0, value)
    right = exact_match(prediction, answers)
    return Score(right, 1.0 if right else 0.0)
