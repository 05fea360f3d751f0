"""The question set of ``qvl eval --data``: a JSONL file, or ``easy-vqa`` (``evaluation/easy_vqa.py``).

A line of the file::

    {"id": "q1", "image": "img/1.png", "question": "What colour is the car?", "answers": ["red"], "category": "color"}
    {"id": "q2", "images": ["a.png", "b.png"], "question": "Which is larger?", "choices": ["left", "right"],
     "answers": ["B"]}

``image`` (one path), ``images`` (a list) or ``video`` (one path), relative to the file's folder; ``answers`` a
non-empty list (any one counts); ``choices`` makes it multiple choice (answers name options by letter or by text);
``category`` is optional. Every bad line is reported at once, naming ``file:line`` and the key; media must exist.

Each item becomes one request of the batch job: its prompt is the question with the instruction lmms-eval uses for
the task kind (``items.prompt_for``), its media as absolute paths.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError, QvlError, raise_all
from qwenvl_rbln.evaluation.items import Dataset, EvalItem
from qwenvl_rbln.evaluation.scoring import LETTERS, answer_letters
from qwenvl_rbln.inference.requests import line_object, read_lines_or_errors, request_id
from qwenvl_rbln.paths import user_path

EASY_VQA = "easy-vqa"
KEYS = ("id", "image", "images", "video", "question", "answers", "choices", "category")
_EXAMPLE = '{"id": "q1", "image": "a.png", "question": "What colour is it?", "answers": ["red"]}'


def load(data: str, limit: int | None = None) -> Dataset:
    """``--data``: the easy-VQA test set or a JSONL file, its first ``limit`` items (file order)."""
    if limit is not None and limit < 1:
        raise InputError(f"--limit {limit} must be at least 1", "e.g. --limit 32 (the first 32 items)")
    if data == EASY_VQA:
        from qwenvl_rbln.evaluation import easy_vqa

        return Dataset(EASY_VQA, easy_vqa.items(limit))
    return Dataset(data, load_jsonl(user_path(data, "--data"), limit))


def load_jsonl(path: Path, limit: int | None = None) -> list[EvalItem]:
    """The first ``limit`` items of a question file; every bad line among them is reported at once. Lines are read
    as the batch job reads its file (``inference.requests``: ``\n`` only, a BOM skipped, any JSON text refused with
    its cause, never a crash)."""
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise InputError(
            f"--data {path} {what}", f"pass a JSONL question file (one {_EXAMPLE} a line) or --data {EASY_VQA}"
        )
    items: list[EvalItem] = []
    problems: list[QvlError] = []
    seen: dict[str, int] = {}
    for lineno, text in read_lines_or_errors(path):  # every non-UTF-8 line reported with the others
        if limit is not None and len(items) + len(problems) >= limit:
            break
        where = f"{path}:{lineno}"
        try:
            if isinstance(text, UnicodeDecodeError):
                raise InputError(
                    f"{where}: not UTF-8 text ({text.reason} at byte {text.start} of the line)",
                    "save the question file as UTF-8 JSONL",
                )
            obj = line_object(where, text, f"one object a line: {_EXAMPLE}")
            _plain_unicode(where, obj)
            if "id" not in obj:
                raise InputError(
                    f"{where}: no id (a non-empty string or an integer)",
                    'write "id": "q1" (a baseline is paired by id)',
                )
            rid = request_id(where, obj, lineno)
            if rid in seen:
                raise InputError(
                    f"{where}: id '{rid}' is used again (first on line {seen[rid]})", "give each question its own id"
                )
            seen[rid] = lineno
            items.append(_item(where, obj, rid, path.parent.absolute()))
        except InputError as exc:
            problems.append(exc)
    raise_all(problems, f"bad lines in {path}", "correct each line listed; nothing ran")
    if not items:
        raise InputError(f"--data {path} has no questions", f"write one JSON object per line, e.g. {_EXAMPLE}")
    return items


def _plain_unicode(where: str, obj: dict[str, Any]) -> None:
    """A lone \\ud800-\\udfff escape is valid JSON but no text: refused here, before it reaches a file qvl writes."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            f"{where}: a string holds a lone surrogate escape (\\ud800-\\udfff), which is not text",
            "write the text as plain UTF-8 (such an escape is only valid as the first of a pair)",
        ) from None


def _item(where: str, obj: dict[str, Any], rid: str, base: Path) -> EvalItem:
    _known_keys(where, obj)
    question = obj.get("question")
    if not isinstance(question, str) or not question.strip():
        raise InputError(
            f"{where}: question={question!r} must be a non-empty string", 'write "question": "What colour is it?"'
        )
    answers = _strings(where, "answers", obj.get("answers"), '"answers": ["red"]')
    choices = None if obj.get("choices") is None else _choices(where, obj["choices"], answers)
    category = obj.get("category")
    if category is not None and (not isinstance(category, str) or not category.strip()):
        raise InputError(
            f"{where}: category={category!r} must be a non-empty string", 'write "category": "color", or leave it out'
        )
    images, video = _media(where, obj, base)
    return EvalItem(rid, question.strip(), answers, choices, category and category.strip(), images, video)


def _known_keys(where: str, obj: dict[str, Any]) -> None:
    from qwenvl_rbln.planning.presets import closest

    for key in obj:
        if key not in KEYS:
            near = closest(str(key), list(KEYS))
            raise InputError(
                f"{where}: unknown key '{key}'", f"did you mean '{near}'?" if near else f"use only {', '.join(KEYS)}"
            )


def _strings(where: str, key: str, value: Any, example: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise InputError(f"{where}: {key}={value!r} must be a non-empty list of non-empty strings", f"write {example}")
    return [v.strip() for v in value]


def _choices(where: str, value: Any, answers: list[str]) -> list[str]:
    choices = _strings(where, "choices", value, '"choices": ["cat", "dog"]')
    if not 2 <= len(choices) <= len(LETTERS):
        raise InputError(
            f"{where}: choices has {len(choices)} option{'' if len(choices) == 1 else 's'}; a question needs 2 to 26",
            "list each option once",
        )
    for answer in answers:
        if not answer_letters([answer], choices):
            letters = ", ".join(LETTERS[: len(choices)])
            raise InputError(
                f"{where}: answer {answer!r} names none of the {len(choices)} choices",
                f"write the option's letter ({letters}) or its text exactly as in choices",
            )
    return choices


def _media(where: str, obj: dict[str, Any], base: Path) -> tuple[list[str], str | None]:
    """(images, video) as absolute paths that exist; at most one of image/images/video."""
    given = [k for k in ("image", "images", "video") if k in obj]
    if len(given) > 1:
        raise InputError(f"{where}: {' and '.join(given)} are both given", "give one of image, images or video")
    if not given:
        return [], None
    key = given[0]
    value = obj[key]
    paths = value if key == "images" else [value]
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p.strip() for p in paths):
        shape = '["a.png", "b.png"]' if key == "images" else '"a.png"'
        raise InputError(
            f"{where}: {key}={value!r} must be {'a list of paths' if key == 'images' else 'a path'}",
            f'write "{key}": {shape}',
        )
    out = []
    for p in paths:
        full = user_path(p, f"{where}: {key}")
        full = full if full.is_absolute() else base / full
        if not full.is_file():
            raise InputError(
                f"{where}: {key} {p} does not exist ({full})", f"media paths are relative to the file's folder, {base}"
            )
        out.append(str(full))
    return (out, None) if key != "video" else ([], out[0])
