"""Answer normalization, as the field compares answers (docs/eval.md names each rule and its source).

VQA (``vqa``): the rules of the official VQA evaluation script (Antol et al., "VQA: Visual Question Answering",
ICCV 2015; ``vqaEval.py`` of the VQA API), which lmms-eval applies too (``EvalAIAnswerProcessor``):

1. lower case; newlines and tabs become spaces;
2. punctuation (the script's list) is removed where it touches a space or the text holds a ``1,000``-style
   number, else it becomes a space;
3. a period is removed unless a digit follows it (``3.5`` stays, ``red.`` is ``red``);
4. number words ``none``/``zero`` .. ``ten`` become digits, the articles ``a``, ``an``, ``the`` are dropped;
5. apostrophes are dropped (``dont`` = ``don't``): where the script maps apostrophe-less contractions onto the
   spelled ones with a table, dropping them on both sides gives the same comparison without the table.

ANLS (``anls``): Biten et al., "Scene Text Visual Question Answering", ICCV 2019: both sides lower-cased with
their whitespace collapsed; the normalized Levenshtein distance is the edit distance over the longer length.
"""

from __future__ import annotations

import re

PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
NUMBER_WORDS = {
    "none": "0",
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}
ARTICLES = frozenset({"a", "an", "the"})
_DIGIT_COMMA = re.compile(r"(?<=\d),+(?=\d)")  # 1,000: the script then removes punctuation rather than spacing it
_PERIOD = re.compile(r"\.(?!\d)")
_APOSTROPHES = str.maketrans("", "", "'\u2019")


def vqa_normalize(text: str) -> str:
    """``text`` as the VQA evaluation compares it (rules 1-5 above)."""
    text = text.lower().replace("\n", " ").replace("\t", " ").strip()
    glue = _DIGIT_COMMA.search(text) is not None
    out = text
    for p in PUNCTUATION:
        if p not in out:
            continue
        touching = f"{p} " in text or f" {p}" in text
        out = out.replace(p, "" if (touching or glue) else " ")
    out = _PERIOD.sub("", out).translate(_APOSTROPHES)
    words = [NUMBER_WORDS.get(w, w) for w in out.split()]
    return " ".join(w for w in words if w not in ARTICLES)


def anls_normalize(text: str) -> str:
    """ANLS's comparison form: lower case, whitespace collapsed."""
    return " ".join(text.lower().split())


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions: one each), two rows of the classic table."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def normalized_levenshtein(a: str, b: str) -> float:
    """The edit distance over the longer length (0 for two empty strings)."""
    longest = max(len(a), len(b))
    return levenshtein(a, b) / longest if longest else 0.0
