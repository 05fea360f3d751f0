"""The batch job's core without a model: the streamed source and its duplicate check, the append-only results
file and --resume's reading of it (a torn last line cut and redone), the driver with a stand-in executor
(a line written as each request completes, Ctrl-C leaving only complete lines, exactly once across resumes), the
flag checks, and the one-NPU path never importing Ray."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from qwenvl_rbln.batch import driver, results, source
from qwenvl_rbln.batch.driver import BatchInterrupted, BatchOptions, run_batch
from qwenvl_rbln.batch.records import error_dict, error_record, failed_twice, ok_record
from qwenvl_rbln.batch.worker import WorkerSpec
from qwenvl_rbln.errors import InputError, InputErrors
from tests.fakes_rbln import refused_infer as refused
from tests.fakes_rbln import run_main


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


class Echo:
    """A stand-in executor: one ok record per item, in order; ``stop_after`` raises KeyboardInterrupt (Ctrl-C)
    after that many records; ``seen`` checks what the file holds while the job runs."""

    def __init__(self, stop_after: int | None = None, output: Path | None = None):
        self.stop_after, self.output = stop_after, output
        self.closed = False
        self.in_file: list[int] = []

    def run(self, items, emit, event) -> None:
        event("worker.state", {"worker": "echo", "npu": 0, "state": "busy"})
        for n, item in enumerate(items):
            if self.stop_after is not None and n == self.stop_after:
                raise KeyboardInterrupt
            emit(_ok(item))
            if self.output is not None:  # flushed as it completes: the line is in the file already
                self.in_file.append(len(self.output.read_text().splitlines()))

    def close(self) -> None:
        self.closed = True


def _ok(item: Any) -> dict[str, Any]:
    vision = [{"bucket": 256}]
    return ok_record(
        item,
        text=f"echo {item.id}",
        token_ids=[1, 2],
        finish_reason="length",
        vision=vision,
        decoder_graph="decoder_batch_1",
        prompt_tokens=3,
        timings={},
        worker="echo",
        npu=0,
    )


def _job(batch: Path, out: Path, resume: bool = False) -> BatchOptions:
    return BatchOptions(WorkerSpec(), batch, out, resume=resume)


# ------------------------------------------------------------------------------------------------- source


def test_items_stream_with_ids_lines_and_the_default_system(tmp_path):
    batch = _write(tmp_path / "b.jsonl", [{"id": "a", "prompt": "x"}, "# note", "", {"prompt": "y"}, {"id": 7}])
    items = list(source.iter_items(batch, default_system="S"))
    assert [(i.id, i.line) for i in items] == [("a", 1), ("2", 4), ("7", 5)]  # position among requests, as infer
    assert items[1].raw == {"prompt": "y", "system": "S"}
    assert source.check_unique_ids(batch).count == 3


def test_duplicate_ids_are_refused_before_any_work_naming_the_lines(tmp_path):
    rows = [{"id": "a"}, {"id": "b"}, {"id": "a"}, "[1]", {"id": "b"}, {"id": "a"}]
    batch = _write(tmp_path / "b.jsonl", rows)
    with pytest.raises(InputErrors) as exc:
        source.check_unique_ids(batch)
    lines = exc.value.detail_lines()
    assert any(f"{batch}:1: id 'a' is used again on lines 3, 6" in x for x in lines), lines
    assert any(f"{batch}:2: id 'b' is used again on line 5" in x for x in lines), lines
    assert any(f"{batch}:4: expected a JSON object" in x for x in lines), lines


def test_a_hash_shared_by_two_ids_is_no_duplicate_and_resume_tells_them_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(source, "id_hash", lambda rid: len(rid))  # "ab" and "cd" share a hash
    monkeypatch.setattr(results, "id_hash", lambda rid: len(rid))
    batch = _write(tmp_path / "b.jsonl", [{"id": "ab"}, {"id": "cd"}, {"id": "e"}])
    check = source.check_unique_ids(batch)
    assert check.count == 3 and check.shared_hashes == {2}
    out = _write(tmp_path / "r.jsonl", [_ok(source.WorkItem("ab", 1, {}))])
    done = results.completed_ids(out, check.shared_hashes)
    assert "ab" in done and "cd" not in done and "e" not in done


def test_resume_of_two_ids_sharing_a_hash_runs_the_unfinished_one(tmp_path, monkeypatch):
    monkeypatch.setattr(source, "id_hash", lambda rid: len(rid))
    monkeypatch.setattr(results, "id_hash", lambda rid: len(rid))
    batch = _write(tmp_path / "b.jsonl", [{"id": "ab"}, {"id": "cd"}, {"id": "e"}])
    out = _write(tmp_path / "r.jsonl", [_ok(source.WorkItem("ab", 1, {}))])
    summary = run_batch(_job(batch, out, resume=True), executor=Echo())
    assert sorted(r["id"] for r in _lines(out)) == ["ab", "cd", "e"]
    assert summary["counts"]["skipped_by_resume"] == 1 and summary["counts"]["done"] == 2


# ------------------------------------------------------------------------------------------------ results


def test_resume_cuts_a_torn_last_line_and_counts_only_complete_ones(tmp_path):
    out = tmp_path / "r.jsonl"
    good = [_ok(source.WorkItem(x, n, {})) for n, x in enumerate("ab", 1)]
    torn = json.dumps(_ok(source.WorkItem("c", 3, {})), separators=(",", ":"))[:40]
    out.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in good) + torn)
    done = results.completed_ids(out)
    assert ("a" in done, "b" in done, "c" in done, len(done)) == (True, True, False, 2)
    assert done.torn == len(torn) and out.read_text().endswith("\n") and len(_lines(out)) == 2


def test_resume_refuses_a_file_qvl_did_not_write_and_leaves_it_as_it_was(tmp_path):
    out = tmp_path / "notes.txt"
    out.write_text('{"id":"a","ok":true}\nmy notes, no newline at the end')
    before = out.read_bytes()
    with pytest.raises(InputError, match=r"notes.txt:2: not a qvl result line"):
        results.completed_ids(out)
    assert out.read_bytes() == before


def test_a_line_cut_by_ctrl_c_mid_write_is_removed_on_close(tmp_path, monkeypatch):
    out = tmp_path / "r.jsonl"
    writer = results.ResultsWriter(out)
    writer.write({"id": "a", "ok": True})
    real = os.write

    def half_then_interrupt(fd, data):
        real(fd, data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(results.os, "write", half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        writer.write({"id": "b", "ok": True})
    monkeypatch.setattr(results.os, "write", real)
    writer.close()
    assert out.read_text() == '{"id":"a","ok":true}\n'


def test_records_have_the_same_keys_ok_or_failed_and_a_second_failure_keeps_both():
    item = source.WorkItem("x", 4, {})
    ok, bad = _ok(item), error_record(item, error_dict("missing-media", "gone", "w0", 0))
    assert set(ok) == set(bad) and ok["vit_buckets"] == [256] and bad["error"]["cause"] == "missing-media"
    twice = failed_twice(
        item, [error_dict("worker-failed", "died", "w0", 0), error_dict("worker-failed", "oom", "w1", 1)]
    )
    assert [a["worker"] for a in twice["error"]["attempts"]] == ["w0", "w1"] and twice["worker"] == "w1"


# ------------------------------------------------------------------------------------------------- driver


def test_each_line_is_in_the_file_as_its_request_completes(tmp_path):
    batch = _write(tmp_path / "b.jsonl", [{"id": str(n)} for n in range(5)])
    out = tmp_path / "r.jsonl"
    echo = Echo(output=out)
    summary = run_batch(_job(batch, out), executor=echo)
    assert echo.in_file == [1, 2, 3, 4, 5] and echo.closed
    assert [r["id"] for r in _lines(out)] == ["0", "1", "2", "3", "4"]
    assert summary["counts"] == {"total": 5, "done": 5, "ok": 5, "failed": 0, "skipped_by_resume": 0, "left": 0}
    assert summary["workers"][0]["worker"] == "echo" and summary["workers"][0]["npu"] == 0


def test_ctrl_c_leaves_complete_lines_and_resume_finishes_each_id_exactly_once(tmp_path):
    batch = _write(tmp_path / "b.jsonl", [{"id": str(n)} for n in range(9)])
    out = tmp_path / "r.jsonl"
    with pytest.raises(BatchInterrupted, match="holds only complete lines") as exc:
        run_batch(_job(batch, out), executor=Echo(stop_after=4))
    assert exc.value.exit_code == 130 and "--resume" in exc.value.hint
    with open(out, "a") as fh:
        fh.write('{"id":"4","li')  # and a kill -9 mid-line on top
    with pytest.raises(BatchInterrupted):
        run_batch(_job(batch, out, resume=True), executor=Echo(stop_after=2))
    summary = run_batch(_job(batch, out, resume=True), executor=Echo())
    assert summary["notes"] == []  # the torn line was cut by the run before
    ids = [r["id"] for r in _lines(out)]
    assert sorted(ids, key=int) == [str(n) for n in range(9)]  # every id exactly once
    assert summary["counts"]["skipped_by_resume"] == 6 and summary["counts"]["done"] == 3


def test_resume_into_results_of_another_batch_file_says_so(tmp_path):
    batch = _write(tmp_path / "b.jsonl", [{"id": "a"}, {"id": "b"}])
    out = _write(tmp_path / "r.jsonl", [_ok(source.WorkItem(x, 1, {})) for x in ("a", "zz")])
    summary = run_batch(_job(batch, out, resume=True), executor=Echo())
    assert summary["counts"]["skipped_by_resume"] == 1 and summary["counts"]["done"] == 1
    assert any("1 results whose ids are not in" in n for n in summary["notes"]), summary["notes"]


def test_an_existing_output_is_never_overwritten_without_resume(tmp_path):
    batch = _write(tmp_path / "b.jsonl", [{"id": "a"}])
    out = _write(tmp_path / "r.jsonl", [{"id": "z", "ok": True}])
    with pytest.raises(InputError, match="already holds results"):
        run_batch(_job(batch, out), executor=Echo())
    assert _lines(out) == [{"id": "z", "ok": True}]


# ------------------------------------------------------------------------------------------------ flags


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--workers", "0"], "--workers 0 must be at least 1"),
        (["--devices", "0,x"], "--devices '0,x': 'x' is not an NPU id"),
        (["--devices", "1,1"], "lists NPU 1 twice"),
        (["--devices", "0,,1"], "has an empty entry"),
        (["--ray-address", "not an address"], "is not a Ray address"),
        (["--ray-address", "head:99999"], "is not a Ray address"),
        (["--devices", "0,1", "--ray-address", "auto"], "--devices pins NPUs of this host"),
        (["--devices", "0", "--workers", "2"], "1 NPUs cannot hold 2 workers"),
        (["--workers", "2", "--device", "1"], "--device place one run"),
    ],
)
def test_bad_pool_flags_are_one_line_each(tmp_path, capsys, args, says):
    batch = _write(tmp_path / "b.jsonl", [{"prompt": "x"}])
    line = refused(capsys, "--batch-file", str(batch), "--output", str(tmp_path / "r.jsonl"), *args)
    assert says in line, line
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--resume"], "--resume needs --output"),
        (["--workers", "2"], "--workers needs --output"),
        (["--output", "r.jsonl", "--prompt", "x"], "--output writes a batch job's results and needs --batch-file"),
    ],
)
def test_job_flags_need_output_and_a_batch_file(capsys, args, says):
    assert says in refused(capsys, *args)


def test_pool_flags_without_the_ray_pool_fail_with_a_clear_line(tmp_path, capsys, monkeypatch, tiny_model):
    import sys

    import qwenvl_rbln.batch

    monkeypatch.setitem(sys.modules, "qwenvl_rbln.batch.ray_pool", None)  # as if the module were missing
    monkeypatch.delattr(qwenvl_rbln.batch, "ray_pool", raising=False)
    batch = _write(tmp_path / "b.jsonl", [{"prompt": "x"}])
    code, out, err = run_main(
        ["infer", str(tiny_model), "--batch-file", str(batch), "--output", str(tmp_path / "r.jsonl"), "--workers", "2"],
        capsys,
    )
    assert code == 3 and "qwenvl_rbln.batch.ray_pool" in err and "Traceback" not in err, err
    assert driver.RAY_INSTALL.startswith("pip install")


# ----------------------------------------------------------------------------------------------- progress


def test_plain_progress_lines_come_every_n_requests_or_seconds_not_per_request():
    from qwenvl_rbln.batch.tally import Tally
    from qwenvl_rbln.views.batch_live import PlainLines

    now = [0.0]
    lines: list[str] = []
    watch = PlainLines(lines.append, every_n=3, every_s=10.0, clock=lambda: now[0])
    tally = Tally(total=10, skipped=2, clock=lambda: now[0])
    watch(tally, "start")
    for n in range(5):
        tally.record({"id": str(n), "worker": "w0", "npu": 0, "num_tokens": 4, "error": None})
        watch(tally, "record")
    now[0] = 11.0
    tally.record({"id": "5", "worker": "w0", "npu": 0, "num_tokens": 0, "error": {"cause": "too-long"}})
    watch(tally, "record")
    watch(tally, "end")
    assert lines[0] == "qvl infer: 8 of 10 requests to run (2 already in the output: skipped)"
    assert len(lines) == 4, lines  # start, after 3 requests, after 10 s, end
    assert lines[1].startswith("qvl infer: 5/10 requests") and "2 skipped (--resume)" in lines[1]
    assert "1 failed" in lines[2] and "tokens/s" in lines[2] and "ETA" in lines[2]


def test_the_live_board_shows_totals_rate_eta_and_each_worker():
    import io

    from rich.console import Console

    from qwenvl_rbln.batch.tally import Tally
    from qwenvl_rbln.views.batch_live import BatchBoard

    now = [0.0]
    tally = Tally(total=100, clock=lambda: now[0])
    tally.event("worker.state", {"worker": "worker-0", "npu": 0, "state": "busy"})
    tally.event("worker.state", {"worker": "worker-1", "npu": 1, "state": "dead"})
    now[0] = 10.0
    for n in range(20):
        tally.record({"id": str(n), "worker": "worker-0", "npu": 0, "num_tokens": 5, "error": None})
    buf = io.StringIO()
    Console(file=buf, width=160).print(BatchBoard(tally))
    text = buf.getvalue()
    assert "20/100 requests" in text and "80 left" in text and "2.00 requests/s" in text
    assert "10.0 tokens/s" in text and "ETA 40.0s" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith("worker-")}
    assert rows["worker-0"][1:4] == ["0", "busy", "20"] and rows["worker-1"][1:3] == ["1", "dead"]
