"""`qvl eval` end to end on the offline tiny Qwen3-VL and the bundled five easy-VQA questions (tests/data/easy-vqa-mini,
so the package need not be installed): the reference backend, then the same artifact under --emulate (optimum-rbln's
real code on qvl's CPU emulator) against it as --baseline: equal predictions, delta_points 0, p = 1, exit 0. And the
batch job's exactly-once guarantee carried through: a run cut mid-line and resumed answers each question once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.fakes_rbln import run_main  # noqa: E402

QUESTIONS = Path(__file__).resolve().parent / "data" / "easy-vqa-mini" / "questions.jsonl"
IDS = [json.loads(x)["id"] for x in QUESTIONS.read_text().splitlines()]
TOKENS = "3"  # new tokens per answer: the tiny model's text is meaningless, agreement is what is checked


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _eval(capsys: Any, *argv: str) -> tuple[int, dict[str, Any] | None, str]:
    code, out, err = run_main(["eval", *argv, "--max-new-tokens", TOKENS, "--json"], capsys)
    return code, (json.loads(out) if out.strip() else None), err


@pytest.fixture(scope="module")
def reference(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One reference-backend run of the five questions (capsys is function-scoped: capture by hand)."""
    from tests.test_batch_job import _Capture

    out = tmp_path_factory.mktemp("ref") / "ref.jsonl"
    mp = pytest.MonkeyPatch()
    cap = _Capture(mp)
    try:
        code, doc, err = _eval(cap, str(tiny_model), "--data", str(QUESTIONS), "--output", str(out))
    finally:
        mp.undo()
    return {"code": code, "doc": doc, "err": err, "out": out}


def test_a_reference_run_writes_one_scored_line_per_question_with_the_batch_records_fields(reference):
    assert reference["code"] == 0, reference["err"]
    doc, lines = reference["doc"], _lines(reference["out"])
    assert [x["id"] for x in lines] == IDS
    for x in lines:
        assert {"question", "answers", "prediction", "correct", "category", "score", "metric"} <= set(x)
        assert x["ok"] is True and len(x["token_ids"]) == int(TOKENS) and x["prediction"] == x["text"].strip()
        assert x["vit_buckets"] and x["decoder_graph"] and x["worker"] == "worker-0"  # the batch record's fields
        assert x["backend"] == "torch" and x["emulated"] is False
    assert doc["n"] == 5 and set(doc["by_category"]) == {"color", "shape", "yes/no"} and doc["backend"] == "torch"
    assert any("tiny model" in n for n in doc["notes"])  # the batch job's notes reach the report
    beside = reference["out"].parent
    # the batch job's own results and its job record (what --resume checks), the questions asked, the scored lines
    want = ["ref.batch.jsonl", "ref.batch.jsonl.qvl-job.json", "ref.jsonl", "ref.requests.jsonl"]
    assert sorted(p.name for p in beside.iterdir()) == want


def test_the_emulated_artifact_matches_the_reference_backend(reference, tiny_rbln, emulated, tmp_path, capsys):
    assert reference["code"] == 0, reference["err"]
    out = tmp_path / "emulated.jsonl"
    argv = [str(tiny_rbln), "--emulate", "--data", str(QUESTIONS), "--output", str(out)]
    code, doc, err = _eval(capsys, *argv, "--baseline", str(reference["out"]), "--max-drop", "0")
    assert code == 0, err
    emulated_lines, reference_lines = _lines(out), _lines(reference["out"])
    assert [x["prediction"] for x in emulated_lines] == [x["prediction"] for x in reference_lines]
    assert [x["token_ids"] for x in emulated_lines] == [x["token_ids"] for x in reference_lines]
    assert doc["emulated"] is True and doc["backend"] == "rbln" and doc["baseline_backend"] == "torch"
    assert doc["n_shared"] == 5 and doc["unshared"]["count"] == 0
    assert doc["delta_points"] == 0 and doc["mcnemar_p"] == 1 and doc["only_this"] == doc["only_baseline"] == 0
    assert doc["gates"][0]["passed"] is True
    assert any(n.startswith("emulated:") for n in doc["notes"])


def test_a_run_cut_mid_line_resumes_and_answers_each_question_exactly_once(reference, tiny_model, tmp_path, capsys):
    assert reference["code"] == 0, reference["err"]
    src = reference["out"].parent
    out = tmp_path / "ref.jsonl"  # the same file names, in a fresh folder: a run killed after 2 answers and a half
    shutil.copy(src / "ref.requests.jsonl", tmp_path / "ref.requests.jsonl")
    done = (src / "ref.batch.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "ref.batch.jsonl").write_text("".join(done[:2]) + done[2][: len(done[2]) // 2])
    argv = [str(tiny_model), "--data", str(QUESTIONS), "--output", str(out)]

    code, _, err = _eval(capsys, *argv)  # without --resume: refused, nothing touched
    assert code == 2 and "already holds the batch job's results" in err and "--resume" in err
    assert not out.exists()

    code, doc, err = _eval(capsys, *argv, "--resume")
    assert code == 0, err
    batch = _lines(tmp_path / "ref.batch.jsonl")
    assert sorted(x["id"] for x in batch) == sorted(IDS)  # the torn line redone, nothing twice
    assert [x["id"] for x in _lines(out)] == IDS
    first = {x["id"]: x["token_ids"] for x in _lines(reference["out"])}
    assert all(x["token_ids"] == first[x["id"]] for x in _lines(out))  # greedy: the redone ones answer the same
    assert any("torn last line" in n for n in doc["notes"]) and doc["n"] == 5

    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    code, _, err = _eval(capsys, *argv)  # finished: a second run is refused, never overwrites
    assert code == 2 and f"{out} already holds eval results" in err
    code, _, err = _eval(capsys, *argv, "--resume", "--limit", "2")  # another question set: refused
    assert code == 2 and "holds other requests than this run's" in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_score_gives_the_same_numbers_without_running_anything(reference, capsys, no_model_load):
    assert reference["code"] == 0, reference["err"]
    code, out, err = run_main(["eval", "--score", str(reference["out"]), "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    for key in ("n", "correct", "accuracy", "ci95", "by_category", "data", "backend"):
        assert doc[key] == reference["doc"][key], key


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--workers", "0"], "--workers 0 must be at least 1"),
        (["--emulate"], "--emulate emulates the NPU backend"),
        (["--device", "0", "--devices", "0,1"], "--device place one run"),
    ],
)
def test_bad_run_flags_are_refused_before_anything_is_written(argv, says, tiny_model, tmp_path, capsys, no_model_load):
    out = tmp_path / "r.jsonl"
    code, _, err = _eval(capsys, str(tiny_model), "--data", str(QUESTIONS), "--output", str(out), *argv)
    assert code == 2 and says in err, err
    assert list(tmp_path.iterdir()) == []


class _Pool:
    """Stands in for the Ray pool behind --workers/--devices (tests/test_batch_ray.py runs the real one): it records
    what the batch job asked of it and answers every request on two named workers."""

    seen: list[Any] = []

    def __init__(self, opts: Any):
        _Pool.seen.append(opts)

    def run(self, items: Any, emit: Any, event: Any) -> None:
        from qwenvl_rbln.batch.records import ok_record

        for n, item in enumerate(items):
            worker = f"worker-{n % 2}"
            emit(ok_record(item, text="Red.", token_ids=[1], finish_reason="stop", vision=[], decoder_graph=None,
                           prompt_tokens=9, timings={}, worker=worker, npu=n % 2))  # fmt: skip

    def close(self) -> None:
        pass


def test_pool_flags_reach_the_batch_jobs_pool(tiny_model, tmp_path, capsys, monkeypatch, no_model_load):
    from qwenvl_rbln.batch import driver

    monkeypatch.setattr(driver, "make_executor", lambda opts, per_worker: _Pool(opts))
    _Pool.seen.clear()
    out = tmp_path / "r.jsonl"
    code, doc, err = _eval(capsys, str(tiny_model), "--data", str(QUESTIONS), "-o", str(out), "--devices", "0,1")
    assert code == 0, err
    (opts,) = _Pool.seen
    assert opts.pooled and opts.devices == [0, 1] and opts.output == tmp_path / "r.batch.jsonl"
    lines = _lines(out)
    assert {x["worker"] for x in lines} == {"worker-0", "worker-1"} and [x["id"] for x in lines] == IDS
    assert doc["correct"] == 1 and doc["by_category"]["color"]["correct"] == 1  # "Red." is right once: q 0001


def test_an_emulated_run_says_emulated_whatever_the_manifest_records(tiny_rbln, emulated, tmp_path, capsys):
    """An artifact whose emulator-written graphs are what mark it (its manifest does not say "emulated"): the eval
    lines and the report say this run was emulated, as the batch job's workers ran it."""
    import shutil

    art = tmp_path / "art"
    shutil.copytree(tiny_rbln, art)
    manifest_path = art / "qvl-manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.pop("emulated", None)
    manifest_path.write_text(json.dumps(manifest))
    out = tmp_path / "e.jsonl"
    code, doc, err = _eval(capsys, str(art), "--emulate", "--data", str(QUESTIONS), "--limit", "1", "-o", str(out))
    assert code == 0, err
    assert doc["emulated"] is True and all(x["emulated"] is True for x in _lines(out))


def test_a_question_far_beyond_the_context_is_refused_at_once(tiny_model, tmp_path, capsys, no_model_load):
    """New-user audit's 50 MB question, in small: a prompt with more bytes than max_seq_len tokens can hold is
    refused before any tokenizing or writing; one just under the bound is not refused by this check."""
    import time

    from qwenvl_rbln.evaluation.length import bytes_per_token
    from qwenvl_rbln.inference.target import resolve_target

    max_seq_len = resolve_target(tiny_model, None, []).resolved.max_seq_len
    limit = bytes_per_token(tiny_model) * max_seq_len
    question = "x" * (limit + 1)
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"id": "huge", "question": question, "answers": ["a"]}) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    started = time.monotonic()
    code, _, err = _eval(capsys, str(tiny_model), "--data", str(data), "--output", str(out / "r.jsonl"))
    assert code == 2 and "question 'huge': its prompt is" in err and f"{max_seq_len:,} tokens" in err, err
    assert list(out.iterdir()) == []
    assert time.monotonic() - started < 60  # no tokenizing of the whole text (generous: a loaded 2-core machine)


def test_results_lines_keep_an_excerpt_of_a_long_question(tmp_path):
    from qwenvl_rbln.evaluation.items import EvalItem
    from qwenvl_rbln.evaluation.length import EXCERPT_CHARS
    from qwenvl_rbln.evaluation.results import eval_lines

    item = EvalItem("q1", "why " * 10_000, ["a"])
    batch = tmp_path / "r.batch.jsonl"
    batch.write_text(json.dumps({"id": "q1", "ok": False, "text": None, "error": {"kind": "too-long"}}) + "\n")
    (line,) = eval_lines([item], batch, "vqa", {})
    assert len(line["question"]) < EXCERPT_CHARS + 200 and len(line["prompt"]) < EXCERPT_CHARS + 200
    assert line["question"].startswith("why why") and "40,000 characters in all" in line["question"]
    assert line["prediction"] is None and line["correct"] is False
