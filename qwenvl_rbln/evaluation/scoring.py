"""One item right or wrong, by the rule its kind calls for (docs/eval.md, "Scoring rules").

- An open question under ``vqa``: right when the normalized prediction equals one normalized answer
  (``normalize.vqa_normalize``; exact match against any listed answer, as lmms-eval scores single-answer sets).
- An open question under ``anls``: the item's ANLS is the best ``1 - NL`` over the answers, 0 where ``NL >= 0.5``
  (Biten et al. 2019); it is right when that is above 0, i.e. the nearest answer is within the threshold.
- A multiple-choice item (it has ``choices``): the option the prediction chose, read with VLMEvalKit's rule-based
  matching (``can_infer``: one option letter standing alone, else one option whose text the answer contains;
  never a judge model), must be an answer. Answers name options by letter (``"B"``) or by text.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from qwenvl_rbln.evaluation.normalize import anls_normalize, normalized_levenshtein, vqa_normalize

METRICS = ("vqa", "anls")
ANLS_THRESHOLD = 0.5
LETTERS = string.ascii_uppercase
_LETTER_NOISE = str.maketrans({c: " " for c in ".()[],:;!*#{}"})  # VLMEvalKit's can_infer_option characters


@dataclass(frozen=True)
class Score:
    """``correct``: counted right; ``score``: 1/0, or the item's ANLS; ``choice``: the option chosen (MC only)."""

    correct: bool
    score: float
    choice: str | None = None


def option_letters(count: int) -> str:
    return LETTERS[:count]


def answer_letters(answers: list[str], choices: list[str]) -> set[str]:
    """The options the answers name: a letter in range, or an option's text (compared VQA-normalized)."""
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


def choose_option(prediction: str, choices: list[str]) -> str | None:
    """The option the prediction chose, or None (none, or more than one, can be read from it)."""
    letters = option_letters(len(choices))
    words = prediction.translate(_LETTER_NOISE).split()
    hits = [letter for letter in letters if letter in words]
    if len(hits) == 1:
        if "A" in words and len(words) > 3:  # "A" in a sentence may be the article, not option A
            return None
        return hits[0]
    if hits:
        return None
    low = prediction.lower()
    contained = [letters[i] for i, c in enumerate(choices) if c.strip() and c.strip().lower() in low]
    return contained[0] if len(contained) == 1 else None


def anls(prediction: str, answers: list[str]) -> float:
    """The item's ANLS: the best ``1 - NL`` over the answers, 0 where the distance reaches the threshold."""
    pred = anls_normalize(prediction)
    best = 0.0
    for answer in answers:
        distance = normalized_levenshtein(pred, anls_normalize(answer))
        if distance < ANLS_THRESHOLD:
            best = max(best, 1.0 - distance)
    return best


def score_item(prediction: str | None, answers: list[str], choices: list[str] | None, metric: str) -> Score:
    """Score one item; a request that did not run (``prediction`` None) is wrong."""
    if prediction is None:
        return Score(False, 0.0, None)
    if choices:
        choice = choose_option(prediction, choices)
        right = choice is not None and choice in answer_letters(answers, choices)
        return Score(right, 1.0 if right else 0.0, choice)
    if metric == "anls":
        value = anls(prediction, answers)
        return Score(value > 0.0, value)
    right = vqa_normalize(prediction) in {vqa_normalize(a) for a in answers}
    return Score(right, 1.0 if right else 0.0)
