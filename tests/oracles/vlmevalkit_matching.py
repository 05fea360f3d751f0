"""Oracle: VLMEvalKit's rule-based multiple-choice reader, ported literally.

Source: open-compass/VLMEvalKit, ``vlmeval/utils/matching_util.py`` (``can_infer_option``, ``can_infer_text``,
``can_infer``), commit e8e78f05f3080fe28154f2130321f17951c3be94. Licence: Apache License 2.0 ("Copyright 2023
VLMEvalKit Authors. All rights reserved."). Changes: its logger call under VERBOSE replaced by nothing (the
function returns False there, as before); ``verbose`` is a parameter instead of the VERBOSE environment variable
(qvl compares with it unset, VLMEvalKit's default). Nothing of qvl is imported.
"""

# ruff: noqa
import copy as cp
import re
import string

_VERBOSE_ANSWER_RE = re.compile(r"(?i)(?:correct\s+)?answer\s+is\s+\**([ABCD])\**")


def can_infer_option(answer, choices, verbose=0):
    # Choices is a dictionary
    if "Failed to obtain answer via API" in answer:
        return False

    reject_to_answer = [
        "Sorry, I can't help with images of people yet.",
        "I can't process this file.",
        "I'm sorry, but without the image provided",
        "Cannot determine the answer",
    ]
    for err in reject_to_answer:
        if err in answer:
            return "Z"

    def count_choice(splits, choices, prefix="", suffix=""):
        cnt = 0
        for c in choices:
            if prefix + c + suffix in splits:
                cnt += 1
        return cnt

    answer_mod = cp.copy(answer)
    chars = ".()[],:;!*#{}"
    for c in chars:
        answer_mod = answer_mod.replace(c, " ")

    splits = [x.strip() for x in answer_mod.split()]
    count = count_choice(splits, choices)

    if count == 1:
        for ch in choices:
            if "A" in splits and len(splits) > 3 and verbose:
                return False
            if ch in splits and splits.index(ch) > (len(splits) - 5):
                return ch
    elif count == 0 and count_choice(splits, {"Z", ""}) == 1:
        return "Z"

    match = _VERBOSE_ANSWER_RE.search(answer or "")
    if match and match.group(1).upper() in choices:
        return match.group(1).upper()

    return False


def can_infer_text(answer, choices):
    answer = answer.lower()
    if len(answer) > 2 * sum(len(str(v)) for v in choices.values()):
        return False
    assert isinstance(choices, dict)
    for k in choices:
        assert k in string.ascii_uppercase
        choices[k] = str(choices[k]).lower()
    cands = []
    for k in choices:
        if choices[k] in answer:
            cands.append(k)
    if len(cands) == 1:
        return cands[0]
    return False


def can_infer(answer, choices, verbose=0):
    answer = str(answer)
    copt = can_infer_option(answer, choices, verbose)
    return copt if copt else can_infer_text(answer, choices)
