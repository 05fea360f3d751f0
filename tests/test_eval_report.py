"""`qvl eval --score R.jsonl [--baseline B.jsonl]` on hand-made results files (no model runs): today's rules score
the stored predictions again, the --json keys, the paired comparison (counts, points, interval, McNemar), unshared
ids named, the CI gates with their exit codes and messages, the picture, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fakes_rbln import run_main


def _line(rid: str, right: bool, category: str = "color", **extra: Any) -> dict[str, Any]:
    """A results line as qvl eval writes it; the stored ``correct`` is deliberately stale (--score recomputes it)."""
    return {
        "id": rid,
        "question": "What colour?",
        "answers": ["red"],
        "category": category,
        "prediction": "Red." if right else "blue",
        "correct": not right,
        "metric": "vqa",
        "backend": "torch",
        "emulated": False,
        "data": "colours.jsonl",
        "ok": True,
        **extra,
    }


def _file(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _paired(tmp_path: Path, a: int, b: int, c: int, d: int) -> tuple[Path, Path]:
    """This run and a baseline over a+b+c+d shared ids: a both right, b only this, c only baseline, d both wrong."""
    this, base = [], []
    for kind, count in (("a", a), ("b", b), ("c", c), ("d", d)):
        for n in range(count):
            rid = f"{kind}{n}"
            this.append(_line(rid, kind in "ab"))
            base.append(_line(rid, kind in "ac"))
    return _file(tmp_path / "this.jsonl", this), _file(tmp_path / "base.jsonl", base)


def _eval(capsys: Any, *argv: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = run_main(["eval", *argv, "--json"], capsys)
    return code, json.loads(out), err


def test_score_applies_todays_rules_and_reports_accuracy_with_its_wilson_interval(tmp_path, capsys):
    lines = [_line(f"q{n}", n < 7, "color" if n < 5 else "shape") for n in range(10)]
    code, doc, err = _eval(capsys, "--score", str(_file(tmp_path / "r.jsonl", lines)))
    assert code == 0, err
    assert doc["n"] == 10 and doc["correct"] == 7 and doc["accuracy"] == 0.7  # "Red." = "red": the stale flags lose
    assert [round(x, 3) for x in doc["ci95"]] == [0.397, 0.892]
    assert doc["by_category"]["color"]["correct"] == 5 and doc["by_category"]["shape"]["n"] == 5
    assert doc["data"] == "colours.jsonl" and doc["metric"] == "vqa" and doc["gates"] == [] and "baseline" not in doc


def test_a_baseline_is_compared_on_the_shared_ids_and_the_others_are_named(tmp_path, capsys):
    this, base = _paired(tmp_path, a=5, b=8, c=1, d=6)
    extra_here = [*map(json.loads, this.read_text().splitlines()), _line("new-1", True)]
    extra_base = [*map(json.loads, base.read_text().splitlines()), _line("old-1", True), _line("old-2", False)]
    _file(this, extra_here)
    _file(base, extra_base)
    code, doc, err = _eval(capsys, "--score", str(this), "--baseline", str(base))
    assert code == 0, err
    assert (doc["both_right"], doc["only_this"], doc["only_baseline"], doc["both_wrong"]) == (5, 8, 1, 6)
    assert doc["n_shared"] == 20 and doc["baseline_accuracy"] == 6 / 20 and doc["accuracy_shared"] == 13 / 20
    assert doc["delta_points"] == pytest.approx(35.0)
    lo, hi = doc["delta_ci95"]
    assert 0 < lo < 35 < hi < 100
    assert doc["mcnemar_p"] == pytest.approx(0.0390625)
    assert doc["unshared"] == {"count": 3, "only_this_run": ["new-1"], "only_baseline": ["old-1", "old-2"]}
    code, out, _ = run_main(["eval", "--score", str(this), "--baseline", str(base)], capsys)
    assert (
        "1 only in this run (not compared): new-1" in out
        and "2 only in the baseline (not compared): old-1, old-2" in out
    )


def test_a_significant_drop_beyond_max_drop_exits_9_and_names_the_numbers(tmp_path, capsys):
    this, base = _paired(tmp_path, a=5, b=1, c=8, d=6)  # baseline 13 of 20, this run 6: -35 points, p = 0.039
    code, doc, err = _eval(capsys, "--score", str(this), "--baseline", str(base), "--max-drop", "2")
    assert code == 9, err
    (gate,) = doc["gates"]
    assert gate["gate"] == "max-drop" and gate["passed"] is False and gate["value"] == pytest.approx(35.0)
    assert doc["error"]["exit_code"] == 9 and doc["n"] == 20  # the report is printed whole, the error beside it
    line = err.strip().splitlines()[-1]
    for says in ("--max-drop failed", "fell 35.00 points", "65.00 % -> 30.00 %", "p = 0.03906", "significant"):
        assert says in line, line


def test_a_larger_drop_that_is_not_significant_passes_and_says_why(tmp_path, capsys):
    this, base = _paired(tmp_path, a=10, b=0, c=3, d=7)  # -15 points, but 3 discordant pairs: p = 0.25
    code, doc, err = _eval(capsys, "--score", str(this), "--baseline", str(base), "--max-drop", "2")
    assert code == 0, err
    (gate,) = doc["gates"]
    assert gate["passed"] is True and "not significant" in gate["message"] and "p = 0.25" in gate["message"]
    code, doc, _ = _eval(capsys, "--score", str(this), "--baseline", str(base), "--max-drop", "20")
    assert code == 0 and "within --max-drop 20" in doc["gates"][0]["message"]


def test_accuracy_below_min_accuracy_exits_8_and_both_broken_gates_are_named(tmp_path, capsys):
    lines = [_line(f"q{n}", n < 7) for n in range(10)]
    path = _file(tmp_path / "r.jsonl", lines)
    code, doc, err = _eval(capsys, "--score", str(path), "--min-accuracy", "0.8")
    assert code == 8 and doc["error"]["exit_code"] == 8
    assert "accuracy 70.00 % (7/10; 95 % CI 39.68 % to 89.22 %) is below --min-accuracy 0.8" in err
    assert _eval(capsys, "--score", str(path), "--min-accuracy", "0.7")[0] == 0  # at the threshold: passes
    this, base = _paired(tmp_path, a=0, b=1, c=9, d=10)
    code, doc, err = _eval(
        capsys, "--score", str(this), "--baseline", str(base), "--min-accuracy", "0.5", "--max-drop", "1"
    )
    assert code == 8 and "--min-accuracy failed" in err and "--max-drop failed" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--max-drop", "2"], "--max-drop compares against a baseline and needs --baseline"),
        (["--min-accuracy", "85"], "--min-accuracy 85 is not a fraction between 0 and 1"),
        (["--metric", "bleu"], "--metric 'bleu' is not one of vqa, exact, anls"),
        (["--data", "easy-vqa"], "--score scores a results file again without running anything; --data only applies"),
        (["--plot", "x.gif"], "the file must end in .png or .svg"),
    ],
)
def test_bad_flags_are_one_line_exit_2(argv, says, tmp_path, capsys):
    path = _file(tmp_path / "r.jsonl", [_line("q1", True)])
    code, out, err = run_main(["eval", "--score", str(path), *argv], capsys)
    assert code == 2 and out == "" and says in err and err.count("\n") == 1, err


def test_score_refuses_a_file_that_is_not_eval_results_naming_the_line(tmp_path, capsys):
    batch = _file(tmp_path / "r.batch.jsonl", [{"id": "q1", "ok": True, "text": "red"}])
    code, _, err = run_main(["eval", "--score", str(batch)], capsys)
    assert code == 2 and "r.batch.jsonl:1: not a qvl eval result line (no answers, prediction)" in err
    assert "not its R.batch.jsonl" in err
    twice = _file(tmp_path / "twice.jsonl", [_line("q1", True), _line("q1", False)])
    code, _, err = run_main(["eval", "--score", str(twice)], capsys)
    assert code == 2 and "twice.jsonl:2: id 'q1' is there twice" in err


def test_a_baseline_of_another_question_set_is_refused(tmp_path, capsys):
    this = _file(tmp_path / "a.jsonl", [_line("q1", True)])
    other = _file(tmp_path / "b.jsonl", [{**_line("q1", True), "answers": ["green"]}])
    code, _, err = run_main(["eval", "--score", str(this), "--baseline", str(other)], capsys)
    assert code == 2 and "shared ids carry other answers" in err and "'q1'" in err


def test_anls_scores_text_answers_and_reports_the_mean(tmp_path, capsys):
    lines = [
        {**_line("q1", True), "answers": ["total due"], "prediction": "Total Due"},
        {**_line("q2", True), "answers": ["invoice"], "prediction": "invoce"},
        {**_line("q3", True), "answers": ["abc"], "prediction": "xyz"},
    ]
    code, doc, err = _eval(capsys, "--score", str(_file(tmp_path / "r.jsonl", lines)), "--metric", "anls")
    assert code == 0, err
    assert doc["metric"] == "anls" and doc["correct"] == 2
    assert doc["anls"] == pytest.approx((1 + (1 - 1 / 7) + 0) / 3)


def test_plot_draws_both_runs_per_category(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    this, base = _paired(tmp_path, a=5, b=8, c=1, d=6)
    picture = tmp_path / "eval.svg"
    code, out, err = run_main(["eval", "--score", str(this), "--baseline", str(base), "--plot", str(picture)], capsys)
    assert code == 0, err
    svg = picture.read_text()
    assert "this run (torch)" in svg and "baseline, shared ids (torch)" in svg
    assert ">65.0<" in svg and ">30.0<" in svg  # this run's and the baseline's accuracy, in points
    assert f"plot: {picture}" in err and "baseline" in out


def test_the_eval_doc_cites_only_tests_that_exist():
    from tests.test_docs_cite_real_tests import ROOT, _defined, cited

    found = cited((ROOT / "docs" / "eval.md").read_text(encoding="utf-8"))
    assert len(found) >= 6, found
    missing = [f"{f}::{t}" for f, t in found if t not in _defined(ROOT / "tests" / f)]
    assert not missing, missing


def test_help_lists_eval_and_names_the_plot_extra(monkeypatch, capsys):
    import re

    monkeypatch.setenv("COLUMNS", "400")  # one line per option: nothing wraps inside the hint
    code, out, err = run_main(["--help"], capsys)
    assert code == 0 and re.search(r"\beval\b", out), err
    code, out, err = run_main(["eval", "--help"], capsys)
    assert code == 0, err
    (line,) = [ln for ln in out.splitlines() if "--plot" in ln]
    assert 'pip install "qwenvl-rbln[plot]"' in re.sub(r"\s+", " ", line), line
