"""`qvl eval --data`: the question file's rules (media relative to it, every bad line at once, before anything
runs), --limit, the prompts handed to the batch job, and easy-VQA read offline from its installed package."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qwenvl_rbln.errors import InputError, InputErrors
from qwenvl_rbln.evaluation import dataset
from qwenvl_rbln.evaluation.items import CHOICE_SUFFIX, OPEN_SUFFIX
from tests.fakes_rbln import run_main

MINI = Path(__file__).resolve().parent / "data" / "easy-vqa-mini"


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    from PIL import Image

    (tmp_path / "img").mkdir()
    Image.new("RGB", (32, 32), (200, 0, 0)).save(tmp_path / "img" / "red.png")
    (tmp_path / "clip.mp4").write_bytes(b"not decoded here: the batch job decodes it")
    return tmp_path


def test_media_paths_are_relative_to_the_file_and_become_absolute_requests(folder):
    path = _write(
        folder / "q.jsonl",
        [
            {"id": "q1", "image": "img/red.png", "question": "What colour?", "answers": ["red"], "category": "color"},
            {"id": 2, "images": ["img/red.png"], "question": "Which?", "choices": ["red", "blue"], "answers": ["A"]},
            "# a comment",
            {"id": "q3", "question": "Say yes.", "answers": ["yes"]},
            {"id": "q4", "video": "clip.mp4", "question": "What happens?", "answers": ["a jump"]},
        ],
    )
    items = dataset.load(str(path)).items
    assert [i.id for i in items] == ["q1", "2", "q3", "q4"]
    assert items[0].request() == {
        "id": "q1",
        "prompt": f"What colour?\n{OPEN_SUFFIX}",
        "images": [str(folder / "img" / "red.png")],
    }
    assert items[1].request()["prompt"] == f"Which?\nA. red\nB. blue\n{CHOICE_SUFFIX}"
    assert items[2].request() == {"id": "q3", "prompt": f"Say yes.\n{OPEN_SUFFIX}"}
    assert items[3].request()["video"] == str(folder / "clip.mp4") and "images" not in items[3].request()
    assert [i.category for i in items] == ["color", None, None, None]


def test_limit_takes_the_first_questions_in_file_order(folder):
    rows = [{"id": f"q{n}", "question": f"Q{n}?", "answers": ["x"]} for n in range(5)]
    path = _write(folder / "q.jsonl", [*rows, "not json"])  # beyond the limit: never read
    assert [i.id for i in dataset.load(str(path), limit=3).items] == ["q0", "q1", "q2"]
    with pytest.raises(InputError, match="--limit 0 must be at least 1"):
        dataset.load(str(path), limit=0)


def test_every_bad_line_is_reported_at_once_naming_the_line_and_key(folder):
    path = _write(
        folder / "q.jsonl",
        [
            {"id": "a", "image": "img/missing.png", "question": "Q?", "answers": ["x"]},
            {"id": "b", "question": "Q?", "answer": ["x"]},
            {"id": "c", "question": "Q?", "answers": "x"},
            {"id": "d", "question": "Q?", "choices": ["cat", "dog"], "answers": ["C"]},
            {"id": "a", "question": "Q?", "answers": ["x"]},
            {"question": "Q?", "answers": ["x"]},
            "[1, 2]",
            {"id": "e", "image": "img/red.png", "video": "v.mp4", "question": "Q?", "answers": ["x"]},
            {"id": "f", "question": "Q?", "choices": ["only"], "answers": ["A"]},
        ],
    )
    with pytest.raises(InputErrors) as caught:
        dataset.load(str(path))
    lines = [p.one_line() for p in caught.value.problems]
    expected = [
        (":1:", "image img/missing.png does not exist"),
        (":2:", "unknown key 'answer'; fix: did you mean 'answers'?"),
        (":3:", "answers='x' must be a non-empty list"),
        (":4:", "answer 'C' names none of the 2 choices; fix: write the option's letter (A, B)"),
        (":5:", "id 'a' is used again (first on line 1)"),
        (":6:", "no id (a non-empty string or an integer)"),
        (":7:", "expected a JSON object, got array"),
        (":8:", "image and video are both given"),
        (":9:", "choices has 1 option; a question needs 2 to 26"),
    ]
    assert len(lines) == len(expected), lines
    for line, (where, says) in zip(lines, expected, strict=True):
        assert where in line and says in line, line


def test_a_missing_or_empty_file_is_one_line(folder, capsys):
    code, out, err = run_main(["eval", "--data", str(folder / "nope.jsonl")], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "does not exist" in err and "easy-vqa" in err
    (folder / "empty.jsonl").write_text("# nothing\n")
    code, _, err = run_main(["eval", "--data", str(folder / "empty.jsonl")], capsys)
    assert code == 2 and "has no questions" in err


def test_eval_without_data_or_score_says_what_it_needs(capsys):
    code, out, err = run_main(["eval", "--json"], capsys)
    assert code == 2 and "needs --data" in err and json.loads(out)["error"]["exit_code"] == 2


def test_easy_vqa_is_read_offline_from_its_package_in_a_stable_order():
    pytest.importorskip("easy_vqa")
    from qwenvl_rbln.evaluation import easy_vqa

    first = dataset.load("easy-vqa", limit=32).items
    assert len(first) == 32 and first[0].id == "easy-vqa-test-0000"
    assert [i.id for i in first] == [f"easy-vqa-test-{n:04d}" for n in range(32)]
    assert [i.id for i in dataset.load("easy-vqa", limit=32).items] == [i.id for i in first]  # the same N every time
    assert {i.category for i in first} == {"shape", "color", "yes/no"}
    assert all(Path(i.images[0]).is_file() and i.images[0].endswith(".png") for i in first)
    assert len(easy_vqa.items()) == 9673  # the whole test set of easy-vqa 1.0


def test_the_bundled_subset_is_the_packages_own_questions_and_images():
    """tests/data/easy-vqa-mini, which the run tests use without the package, equals easy-VQA's items byte for byte."""
    pytest.importorskip("easy_vqa")
    mine = dataset.load(str(MINI / "questions.jsonl")).items
    theirs = {i.id: i for i in dataset.load("easy-vqa", limit=19).items}
    for item in mine:
        other = theirs[item.id]
        assert (item.question, item.answers, item.category) == (other.question, other.answers, other.category)
        assert Path(item.images[0]).read_bytes() == Path(other.images[0]).read_bytes()


def test_easy_vqa_missing_is_exit_3_with_the_install_line(monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def no_easy_vqa(name, *args, **kwargs):
        if name == "easy_vqa":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_easy_vqa)
    code, _, err = run_main(["eval", "--data", "easy-vqa", "--limit", "2"], capsys)
    assert code == 3 and "pip install easy-vqa==1.0" in err


def test_hostile_lines_are_refused_with_their_cause_and_odd_breaks_and_a_bom_are_read(tmp_path):
    """The question file is read as the batch job reads its file: deep nesting and a lone surrogate (which crashed
    the first reader, or the write of the batch file after it) are each a line's refusal; a BOM is skipped and a
    U+2028 inside a string does not split its line."""
    path = tmp_path / "q.jsonl"
    good = {"id": "ok", "question": "Is it\u2028red?", "answers": ["yes"]}
    lines = [
        json.dumps(good, ensure_ascii=False),
        "[" * 100_000 + "]" * 100_000,
        '{"id": "s", "question": "\\ud800?", "answers": ["x"]}',
    ]
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode("utf-8") + b"\n")
    with pytest.raises(InputErrors) as caught:
        dataset.load(str(path))
    said = [p.one_line() for p in caught.value.problems]
    assert len(said) == 2 and ":2:" in said[0] and "nested too deeply" in said[0], said
    assert ":3:" in said[1] and "lone surrogate" in said[1], said
    path.write_bytes(b"\xef\xbb\xbf" + lines[0].encode("utf-8") + b"\n")
    (item,) = dataset.load(str(path)).items
    assert item.id == "ok" and "\u2028" in item.question


def test_every_non_utf8_line_is_reported_at_once_as_the_question_files(tmp_path, capsys):
    """New-user audit N6: two lines that are not UTF-8 are both named, as lines of the question file."""
    path = tmp_path / "nonutf8.jsonl"
    path.write_bytes(
        b'{"id": "n1", "question": "caf\xe9?", "answers": ["x"]}\n'
        b'{"id": "ok", "question": "fine?", "answers": ["x"]}\n'
        b'{"id": "n2", "question": "ok", "answers": ["\xff\xfe"]}\n'
    )
    with pytest.raises(InputErrors) as caught:
        dataset.load(str(path))
    said = [p.one_line() for p in caught.value.problems]
    assert len(said) == 2 and ":1: not UTF-8 text" in said[0] and ":3: not UTF-8 text" in said[1], said
    assert all("question file" in s and "batch file" not in s for s in said), said


@pytest.mark.parametrize("category", ["", "   "])
def test_an_empty_category_is_refused(category, tmp_path):
    """Mutant D08: an empty category would be counted silently under '(none)'."""
    path = _write(tmp_path / "q.jsonl", [{"id": "q1", "question": "Q?", "answers": ["a"], "category": category}])
    with pytest.raises(InputError) as caught:
        dataset.load(str(path))
    assert "category=" in str(caught.value) and "must be a non-empty string" in str(caught.value)


def test_repeated_answers_are_kept_as_annotators_answers(tmp_path):
    """A VQAv2-style line: ten answers with repeats are read as they are (not refused, not deduplicated)."""
    answers = ["yes"] * 9 + ["no"]
    path = _write(tmp_path / "q.jsonl", [{"id": "q1", "question": "Q?", "answers": answers}])
    (item,) = dataset.load(str(path)).items
    assert item.answers == answers
