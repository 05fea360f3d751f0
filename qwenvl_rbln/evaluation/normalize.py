"""Answer normalization, as the field compares answers (docs/eval.md names each rule, its source and the one
difference qvl keeps).

VQA: the official VQA evaluation script (Antol et al., ICCV 2015; GT-Vision-Lab/VQA
``PythonEvaluationTools/vqaEvaluation/vqaEval.py`` at a013f00), rule for rule: newlines and tabs become spaces and
the text is stripped; ``processPunctuation`` (its punctuation list, removed where a mark touches a space or the text
holds a ``1,000``-style number, else spaced; a period not followed by a digit removed, at most 32 of them: the
script passes ``re.UNICODE`` (32) as ``count``); ``processDigitArticle`` (lower case, ``manualMap``'s number words,
the articles dropped, then the ``contractions`` table). The one difference: a typographic apostrophe (U+2019,
U+2018, as chat models write ``don’t``) is read as ``'`` first; the script, fed typed annotator answers, never saw
one.

ANLS: lower case, whitespace collapsed (the DocVQA / InfographicVQA scripts' comparison form).
"""

from __future__ import annotations

import re

PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
NUMBER_WORDS = {  # the script's manualMap
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
_CONTRACTION_PAIRS = (
    "aint ain't|arent aren't|cant can't|couldve could've|couldnt couldn't|couldn'tve couldn't've|"
    "couldnt've couldn't've|didnt didn't|doesnt doesn't|dont don't|hadnt hadn't|hadnt've hadn't've|"
    "hadn'tve hadn't've|hasnt hasn't|havent haven't|hed he'd|hed've he'd've|he'dve he'd've|hes he's|howd how'd|"
    "howll how'll|hows how's|Id've I'd've|I'dve I'd've|Im I'm|Ive I've|isnt isn't|itd it'd|itd've it'd've|"
    "it'dve it'd've|itll it'll|let's let's|maam ma'am|mightnt mightn't|mightnt've mightn't've|"
    "mightn'tve mightn't've|mightve might've|mustnt mustn't|mustve must've|neednt needn't|notve not've|"
    "oclock o'clock|oughtnt oughtn't|ow's'at 'ow's'at|'ows'at 'ow's'at|'ow'sat 'ow's'at|shant shan't|"
    "shed've she'd've|she'dve she'd've|she's she's|shouldve should've|shouldnt shouldn't|"
    "shouldnt've shouldn't've|shouldn'tve shouldn't've|somebody'd somebodyd|somebodyd've somebody'd've|"
    "somebody'dve somebody'd've|somebodyll somebody'll|somebodys somebody's|someoned someone'd|"
    "someoned've someone'd've|someone'dve someone'd've|someonell someone'll|someones someone's|"
    "somethingd something'd|somethingd've something'd've|something'dve something'd've|somethingll something'll|"
    "thats that's|thered there'd|thered've there'd've|there'dve there'd've|therere there're|theres there's|"
    "theyd they'd|theyd've they'd've|they'dve they'd've|theyll they'll|theyre they're|theyve they've|"
    "twas 'twas|wasnt wasn't|wed've we'd've|we'dve we'd've|weve we've|werent weren't|whatll what'll|"
    "whatre what're|whats what's|whatve what've|whens when's|whered where'd|wheres where's|whereve where've|"
    "whod who'd|whod've who'd've|who'dve who'd've|wholl who'll|whos who's|whove who've|whyll why'll|"
    "whyre why're|whys why's|wont won't|wouldve would've|wouldnt wouldn't|wouldnt've wouldn't've|"
    "wouldn'tve wouldn't've|yall y'all|yall'll y'all'll|y'allll y'all'll|yall'd've y'all'd've|"
    "y'alld've y'all'd've|y'all'dve y'all'd've|youd you'd|youd've you'd've|you'dve you'd've|youll you'll|"
    "youre you're|youve you've"
)
CONTRACTIONS = dict(pair.split(" ") for pair in _CONTRACTION_PAIRS.split("|"))  # the script's table, verbatim
_COMMA_STRIP = re.compile(r"(\d)(\,)(\d)")
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
_PERIODS_PER_PASS = int(re.UNICODE)  # the script's count argument (32)
_TYPOGRAPHIC = str.maketrans({"\u2019": "'", "\u2018": "'"})


def vqa_prepare(text: str) -> str:
    """What the script does to every answer and prediction before anything else (plus qvl's apostrophe rule)."""
    return text.translate(_TYPOGRAPHIC).replace("\n", " ").replace("\t", " ").strip()


def process_punctuation(text: str) -> str:
    """The script's ``processPunctuation``."""
    out = text
    glue = _COMMA_STRIP.search(text) is not None
    for p in PUNCTUATION:
        out = out.replace(p, "" if (f"{p} " in text or f" {p}" in text or glue) else " ")
    return _PERIOD_STRIP.sub("", out, count=_PERIODS_PER_PASS)


def process_digit_article(text: str) -> str:
    """The script's ``processDigitArticle``: lower case, number words, articles dropped, contractions."""
    words = [NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    return " ".join(CONTRACTIONS.get(w, w) for w in words if w not in ARTICLES)


def vqa_normalize(text: str) -> str:
    """``text`` as the VQA evaluation compares it (every rule above)."""
    return process_digit_article(process_punctuation(vqa_prepare(text)))


def anls_normalize(text: str) -> str:
    """ANLS's comparison form: lower case, whitespace collapsed."""
    return " ".join(text.strip().lower().split())


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
