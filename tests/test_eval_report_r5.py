"""The report's numbers and files on hand-made results files (round 5): annotators' answers scored with the VQA
accuracy through the CLI, a one-question file's interval, failed requests, categories, emulated baselines,
run-wide fields, the results files' mode and torn lines. Each pins a mutant that survived the mutation audit."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from statsmodels.stats.proportion import proportion_confint

from qwenvl_rbln.evaluation.results import write_text_atomic
from tests.fakes_rbln import run_main
from tests.test_eval_oracles import VQAV2_TABLE
from tests.test_eval_report import _eval, _file, _line


def test_a_vqav2_file_reports_the_official_vqa_accuracy(tmp_path, capsys):
    lines = [
        {**_line(f"v{i}", True), "answers": answers, "prediction": pred}
        for i, (pred, answers, _) in enumerate(VQAV2_TABLE, start=1)
    ]
    path = _file(tmp_path / "vqav2.jsonl", lines)
    code, doc, err = _eval(capsys, "--score", str(path))
    assert code == 0, err
    assert doc["vqa_accuracy"] == pytest.approx(0.47) and doc["annotated"] == 10
    assert doc["correct"] == 8  # right when an annotator gave it: v6/v7 score 0 (ten identical 'yes')
    assert any("official VQA accuracy" in note for note in doc["notes"])
    code, doc, _ = _eval(capsys, "--score", str(path), "--metric", "exact")
    assert doc["correct"] == 10 and "vqa_accuracy" not in doc  # exact match against any answer: its own metric
    code, out, _ = run_main(["eval", "--score", str(path)], capsys)
    assert "VQA accuracy 47.00 %" in out


def test_a_one_question_file_has_its_wilson_interval_and_gates_work(tmp_path, capsys):
    path = _file(tmp_path / "one.jsonl", [_line("q1", True)])
    code, doc, err = _eval(capsys, "--score", str(path), "--min-accuracy", "0.9")
    assert code == 0, err
    assert doc["ci95"] == pytest.approx(proportion_confint(1, 1, method="wilson"), abs=1e-12)
    assert doc["by_category"] == {"color": {"n": 1, "correct": 1, "accuracy": 1.0, "ci95": doc["ci95"]}}
    path = _file(tmp_path / "wrong.jsonl", [_line("q1", False)])
    code, doc, err = _eval(capsys, "--score", str(path), "--min-accuracy", "0.5")
    assert code == 8 and "(0/1; 95 % CI 0.00 % to 79.35 %)" in err, err


@pytest.mark.parametrize("metric", ["vqa", "anls"])
def test_failed_counts_requests_that_did_not_run_not_wrong_answers(metric, tmp_path, capsys):
    lines = [{**_line("q1", True), "prediction": "red"}, _line("q2", False), _line("q3", False)]
    lines.append({**_line("q4", True), "prediction": None})
    code, doc, err = _eval(capsys, "--score", str(_file(tmp_path / "r.jsonl", lines)), "--metric", metric)
    assert code == 0, err
    assert (doc["n"], doc["correct"], doc["failed"]) == (4, 1, 1)
    if metric == "anls":
        assert doc["anls"] == pytest.approx(0.25)  # the failed request scores 0, not 1


def test_questions_without_a_category_form_none_and_the_rows_add_up(tmp_path, capsys):
    lines = [_line("q1", True), _line("q2", False, "shape"), {**_line("q3", True), "category": None}]
    code, doc, _ = _eval(capsys, "--score", str(_file(tmp_path / "r.jsonl", lines)))
    assert sorted(doc["by_category"]) == ["(none)", "color", "shape"]
    assert sum(b["n"] for b in doc["by_category"].values()) == doc["n"] == 3


def test_a_shared_id_with_other_choices_is_another_question_set(tmp_path, capsys):
    mc = {**_line("q1", True), "answers": ["B"], "choices": ["cat", "dog"], "prediction": "B"}
    this = _file(tmp_path / "a.jsonl", [mc])
    other = _file(tmp_path / "b.jsonl", [{**mc, "choices": ["dog", "cat"]}])
    code, _, err = run_main(["eval", "--score", str(this), "--baseline", str(other)], capsys)
    assert code == 2 and "shared ids carry other answers or choices" in err


def test_an_emulated_baseline_brings_the_emulated_note(tmp_path, capsys):
    this = _file(tmp_path / "a.jsonl", [_line("q1", True)])
    base = _file(tmp_path / "b.jsonl", [{**_line("q1", True), "emulated": True, "backend": "rbln"}])
    code, doc, _ = _eval(capsys, "--score", str(this), "--baseline", str(base))
    assert code == 0 and doc["emulated"] is False and doc["baseline_emulated"] is True
    assert any(note.startswith("emulated:") for note in doc["notes"])
    code, doc, _ = _eval(capsys, "--score", str(this))
    assert not any(note.startswith("emulated:") for note in doc["notes"])


def test_run_wide_fields_name_one_run_or_say_mixed_or_not_recorded(tmp_path, capsys):
    joined = _file(tmp_path / "j.jsonl", [_line("q1", True), {**_line("q2", True), "backend": "rbln"}])
    code, doc, _ = _eval(capsys, "--score", str(joined))
    assert doc["backend"] is None and doc["backend_mixed"] is True
    code, out, _ = run_main(["eval", "--score", str(joined)], capsys)
    assert "mixed backends" in out
    bare = [{k: v for k, v in _line(f"q{i}", True).items() if k != "backend"} for i in range(2)]
    code, out, _ = run_main(["eval", "--score", str(_file(tmp_path / "b.jsonl", bare))], capsys)
    assert "backend not recorded" in out and "mixed" not in out
    code, doc, _ = _eval(capsys, "--score", str(_file(tmp_path / "t.jsonl", [_line("q1", True)] * 1)))
    assert doc["backend"] == "torch" and doc["backend_mixed"] is False


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_results_files_get_the_umasks_mode_not_mkstemps(umask, tmp_path):
    old = os.umask(umask)
    try:
        write_text_atomic(tmp_path / "r.jsonl", "{}\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.jsonl").stat().st_mode) == 0o666 & ~umask


def test_a_torn_last_line_is_left_out_and_the_complete_lines_scored(tmp_path: Path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_line("q1", True)) + "\n" + json.dumps(_line("q2", False))[:40])
    code, doc, err = _eval(capsys, "--score", str(path))
    assert code == 0, err
    assert (doc["n"], doc["correct"]) == (1, 1)


@pytest.mark.parametrize(
    "flag",
    [["--max-new-tokens", "8"], ["--device", "0"], ["--visual-device", "1"], ["--torch-device", "cpu"],
     ["--no-vit-packing"], ["--emulate"], ["--limit", "3"], ["--workers", "2"]],
)  # fmt: skip
def test_score_refuses_run_only_flags_in_one_line(flag, tmp_path, capsys):
    path = _file(tmp_path / "r.jsonl", [_line("q1", True)])
    code, out, err = run_main(["eval", "--score", str(path), *flag], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"{flag[0]} only applies to a run" in err, err
