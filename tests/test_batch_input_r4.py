"""Round 4 of the batch job's input side and results file against hostile input (issue 37): one writer per results
file, write failures as one line, valid-JSON lines the pre-pass crashed on, complete lines never cut, ids that
cannot reach the terminal raw, the --resume hint only when it helps, BOM/CR/pipes/100,000 bad lines, and a test
for each mutant the 2026-12-04 mutation audit saw survive (B2-B6, B8, B10)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qwenvl_rbln.batch import driver, results, source
from qwenvl_rbln.batch.driver import run_batch
from qwenvl_rbln.batch.npus import WorkerNpus
from qwenvl_rbln.errors import BackendError, BusyError, InputError, InputErrors, QvlError
from qwenvl_rbln.inference import requests as rq
from tests.fakes_rbln import run_main
from tests.helpers_cli import readline_within
from tests.test_batch_core import Echo, _job, _lines, _ok, _write

REPO = Path(__file__).resolve().parent.parent


class Failing(Echo):
    """Writes ``after`` records, then raises ``exc`` (a worker that cannot go on)."""

    def __init__(self, after: int, exc: QvlError):
        super().__init__()
        self.after, self.exc = after, exc

    def run(self, items, emit, event) -> None:
        for n, item in enumerate(items):
            if n == self.after:
                raise self.exc
            emit(_ok(item))
        raise self.exc


def _cli(capsys, monkeypatch, batch: Path, out: Path, *extra: str, executor: Any = None) -> tuple[int, str, str]:
    """`qvl infer DIR --batch-file F --output R` through the real CLI edge, with a stand-in executor (no model)."""
    monkeypatch.setattr(driver, "_target_check", lambda spec, system: (WorkerNpus(), str(batch.parent), None))
    monkeypatch.setattr(driver, "make_executor", lambda opts, n: executor if executor is not None else Echo())
    argv = ["infer", str(batch.parent), "--batch-file", str(batch), "--output", str(out), *extra]
    return run_main(argv, capsys)


def _error_lines(err: str) -> list[str]:
    lines = [ln for ln in err.splitlines() if ln.startswith("qvl: ")]
    assert len(lines) == 1 and "internal error" not in err and "Traceback" not in err, err
    return lines


# ------------------------------------------------------------------------------------ H4: one writer per file


def test_a_second_job_on_the_same_output_is_refused_at_once_naming_the_first(tmp_path, capsys, monkeypatch):
    batch = _write(tmp_path / "b.jsonl", [{"id": "a"}, {"id": "b"}])
    out = tmp_path / "r.jsonl"
    holder = (  # the first job: holds the results file's lock until its stdin closes
        "import sys\nfrom qwenvl_rbln.batch.results import results_lock\n"
        f"with results_lock({str(out)!r}):\n    print('held', flush=True)\n    sys.stdin.read()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert readline_within(proc.stdout).strip() == b"held"
        code, stdout, err = _cli(capsys, monkeypatch, batch, out)
        (line,) = _error_lines(err)
        assert code == 6 and f"results file {out} is being written by pid {proc.pid}" in line, err
        assert "pass another --output" in line and not out.exists()  # nothing ran, nothing written
        code, _, err = _cli(capsys, monkeypatch, batch, out, "--resume")
        assert code == 6 and not out.exists(), err
    finally:
        proc.communicate(b"", timeout=300)
    assert _cli(capsys, monkeypatch, batch, out)[0] == 0  # the lock went with its holder
    assert [r["id"] for r in _lines(out)] == ["a", "b"]


def test_the_files_own_lock_keeps_out_a_writer_with_another_qvl_home(tmp_path):
    out = tmp_path / "r.jsonl"
    first, second = results.ResultsWriter(out), results.ResultsWriter(out)
    first.write({"id": "a", "ok": True})
    with pytest.raises(BusyError, match="being written by another process"):
        second.write({"id": "b", "ok": True})
    with open(out, "ab") as fh:
        fh.write(b'{"id":"b","li')  # the other job's line as --resume would see it mid-write
    before = out.read_bytes()
    with pytest.raises(BusyError):
        results.completed_ids(out)  # would cut that "torn" line: refused while the file is held
    assert out.read_bytes() == before
    first.close()
    assert results.completed_ids(out).torn == len('{"id":"b","li')


def test_resume_names_ids_found_twice_in_the_results_file(tmp_path):
    batch = _write(tmp_path / "b.jsonl", [{"id": x} for x in "abc"])
    out = _write(tmp_path / "r.jsonl", [_ok(source.WorkItem(x, 1, {})) for x in "abab"])
    summary = run_batch(_job(batch, out, resume=True), executor=Echo())
    (note,) = [n for n in summary["notes"] if "more than one line" in n]
    assert "2 ids on more than one line ('a' on lines 1, 3; 'b' on lines 2, 4)" in note, note
    assert not any("not in" in n for n in summary["notes"]), summary["notes"]  # not called foreign
    assert summary["counts"]["skipped_by_resume"] == 2 and summary["counts"]["done"] == 1
    assert [r["id"] for r in _lines(out)] == ["a", "b", "a", "b", "c"]  # none of them written again


# ------------------------------------------------------------------------------ H5: failed writes, one line


def _disk_full_after(monkeypatch, lines: int, *, half: bool = False) -> None:
    """os.write in the results file fails with ENOSPC after ``lines`` lines (``half``: after half the next)."""
    real, count = os.write, [0]

    def write(fd, data):
        if count[0] >= lines:
            if half:
                real(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        count[0] += 1
        return real(fd, data)

    monkeypatch.setattr(results.os, "write", write)


@pytest.mark.parametrize("half", [False, True])
def test_a_full_disk_is_one_line_with_the_count_and_resume_goes_on(tmp_path, capsys, monkeypatch, half):
    batch = _write(tmp_path / "b.jsonl", [{"id": str(n)} for n in range(5)])
    out = tmp_path / "r.jsonl"
    _disk_full_after(monkeypatch, 2, half=half)
    code, stdout, err = _cli(capsys, monkeypatch, batch, out, "--json")
    (line,) = _error_lines(err)
    assert code == 5 and line.startswith(f"qvl: error: disk full writing {out} (No space left on device)"), line
    assert line.endswith(
        f"free space on that filesystem; then rerun with --resume (the 2 finished requests are in {out})"
    )
    assert json.loads(stdout)["error"]["exit_code"] == 5
    assert [r["id"] for r in _lines(out)] == ["0", "1"] and out.read_text().endswith("}\n")  # complete lines only
    monkeypatch.undo()  # the disk has room again
    assert _cli(capsys, monkeypatch, batch, out, "--resume")[0] == 0
    assert [r["id"] for r in _lines(out)] == [str(n) for n in range(5)]  # each id exactly once


@pytest.mark.parametrize("device", ["/dev/full", "/dev/null"])
def test_a_device_as_output_is_refused_before_any_work(tmp_path, capsys, monkeypatch, device):
    batch = _write(tmp_path / "b.jsonl", [{"id": "a"}])
    monkeypatch.setattr(driver, "_target_check", lambda *a: pytest.fail("the artifact was resolved"))
    code, _, err = run_main(["infer", str(tmp_path), "--batch-file", str(batch), "--output", device], capsys)
    (line,) = _error_lines(err)
    assert code == 2 and f"--output {device} is not a regular file (a device or a pipe)" in line, line


def test_an_unwritable_output_folder_is_refused_up_front(tmp_path, capsys, monkeypatch):
    batch = _write(tmp_path / "b.jsonl", [{"id": "a"}])
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(driver.os, "access", lambda p, mode: False if Path(p) == ro else real(p, mode))  # root
    code, _, err = _cli(capsys, monkeypatch, batch, ro / "r.jsonl", executor=Failing(0, AssertionError()))
    (line,) = _error_lines(err)
    assert code == 2 and f"--output {ro / 'r.jsonl'}: cannot write in {ro} (permission denied)" in line, line


@pytest.mark.parametrize(
    ("call", "which", "err", "code", "says"),
    [
        ("open", "r.jsonl", errno.EROFS, 2, "cannot write the results file"),
        ("open", ".lock", errno.EACCES, 2, "cannot take the lock for"),
        ("fsync", "", errno.EIO, 5, "failed (Input/output error); it holds only complete lines"),
    ],
)
def test_a_failing_open_lock_or_sync_is_one_line_not_internal(
    tmp_path, capsys, monkeypatch, call, which, err, code, says
):
    batch = _write(tmp_path / "b.jsonl", [{"id": "a"}, {"id": "b"}])
    real = getattr(os, call)

    def fail(target, *a, **k):
        if call == "open" and not str(target).endswith(which):
            return real(target, *a, **k)
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, call, fail)
    got, _, stderr = _cli(capsys, monkeypatch, batch, tmp_path / "r.jsonl")
    (line,) = _error_lines(stderr)
    assert got == code and says in line, line


# --------------------------------------------------------------------- H6: valid JSON the pre-pass crashed on


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"id":"b\\ud800","prompt":"x"}', "id 'b\\ud800' is not valid Unicode (a lone surrogate \\ud800)"),
        ('{"id":"x","n":' + "9" * 5000 + "}", "a number with more than 4300 digits"),
        ('{"id":"x","n":' + "[" * 200000 + "]" * 200000 + "}", "nested too deeply"),
        ("null", "expected a JSON object, got null"),
        ('"text"', "expected a JSON object, got string"),
        ("[1]", "expected a JSON object, got array"),
        ('{"id": null}', "id=null must be a non-empty string or an integer"),
        ('{"id": true}', "id=true must be a non-empty string or an integer"),
        ('{"id": 1.5}', "id=1.5 must be"),
        ('{"id": {"a": [1]}}', 'id={"a": [1]} must be'),
    ],
)
def test_valid_json_lines_the_pre_pass_crashed_on_are_refused_with_their_cause(
    tmp_path, capsys, monkeypatch, line, says
):
    batch = tmp_path / "b.jsonl"
    batch.write_text(line + "\n")
    with pytest.raises(InputError) as exc:
        source.check_unique_ids(batch)
    assert exc.value.message.startswith(f"{batch}:1: ") and says in exc.value.message, exc.value.message
    with pytest.raises(InputError, match="1: "):
        rq.parse_batch_file(batch)  # the in-memory --batch-file reads it the same way
    code, _, err = _cli(capsys, monkeypatch, batch, tmp_path / "r.jsonl")
    assert code == 2 and says in _error_lines(err)[0] and not (tmp_path / "r.jsonl").exists()


# -------------------------------------------------------------------- H7, B5, B6: what --resume may cut


@pytest.mark.parametrize(
    "text",
    [
        '{"id": "mine", "note": "my own notes, valid JSON, no trailing newline"}',  # H7: complete JSON, "ours" prefix
        '{"model": "my notes"}',  # B6: complete JSON
        '{"model": "my notes"',  # B6: not JSON, starts with "{" but not with a result's '{"id":'
    ],
)
def test_resume_never_cuts_a_last_line_qvl_did_not_write(tmp_path, text):
    out = tmp_path / "notes.jsonl"
    out.write_text(text)
    with pytest.raises(InputError, match=r"notes.jsonl:1: not a qvl result line"):
        results.completed_ids(out)
    assert out.read_text() == text


def test_a_whole_result_missing_only_its_newline_is_counted_and_the_newline_added(tmp_path):
    batch = _write(tmp_path / "b.jsonl", [{"id": "a"}, {"id": "b"}])
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(_ok(source.WorkItem("a", 1, {})), separators=(",", ":")))
    summary = run_batch(_job(batch, out, resume=True), executor=Echo())
    assert summary["counts"]["skipped_by_resume"] == 1 and summary["counts"]["done"] == 1
    assert [r["id"] for r in _lines(out)] == ["a", "b"]
    assert any("the newline was added" in n for n in summary["notes"]), summary["notes"]


def test_a_torn_line_below_a_blank_line_is_cut_at_its_own_start(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"id":"a","ok":true}\n\n{"id":"b","ok":true}\n{"id":"c","li')
    done = results.completed_ids(out)
    assert out.read_text() == '{"id":"a","ok":true}\n\n{"id":"b","ok":true}\n'  # B5: keep counts blank lines
    assert ("a" in done, "b" in done, "c" in done, done.torn) == (True, True, False, len('{"id":"c","li'))


def test_a_line_torn_inside_its_first_bytes_is_still_ours(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"id":"a","ok":true}\n{"i')
    assert results.completed_ids(out).torn == 3 and out.read_text() == '{"id":"a","ok":true}\n'


# ---------------------------------------------------------------- B2, B3, B4: the writer's syncs and writes


def _count_fsyncs(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(results.os, "fsync", lambda fd: calls.append(fd) or real(fd))
    return calls


def test_a_write_exactly_fsync_every_s_after_the_last_sync_syncs(tmp_path, monkeypatch):
    calls = _count_fsyncs(monkeypatch)
    clock = iter([0.0, results.FSYNC_EVERY_S, results.FSYNC_EVERY_S])
    writer = results.ResultsWriter(tmp_path / "r.jsonl", clock=lambda: next(clock))
    writer.write({"id": "a", "ok": True})
    assert len(calls) == 1  # B2
    writer._clock = lambda: results.FSYNC_EVERY_S
    writer.close()


def test_close_syncs_what_the_last_seconds_wrote(tmp_path, monkeypatch):
    calls = _count_fsyncs(monkeypatch)
    writer = results.ResultsWriter(tmp_path / "r.jsonl", clock=lambda: 0.0)
    writer.write({"id": "a", "ok": True})
    assert calls == []
    writer.close()
    assert len(calls) == 1  # B3


def test_a_short_write_is_finished_before_the_next_line(tmp_path, monkeypatch):
    out = tmp_path / "r.jsonl"
    real = os.write
    monkeypatch.setattr(results.os, "write", lambda fd, data: real(fd, data[:7]))
    writer = results.ResultsWriter(out)
    writer.write({"id": "a", "ok": True})
    writer.write({"id": "b", "ok": True})
    writer.close()
    assert out.read_text() == '{"id":"a","ok":true}\n{"id":"b","ok":true}\n'  # B4


def test_a_string_no_utf8_can_hold_is_written_escaped_and_read_back(tmp_path):
    out = tmp_path / "r.jsonl"
    with results.ResultsWriter(out) as writer:  # a non-UTF-8 file name quoted in an error message
        writer.write({"id": "a", "ok": False, "error": {"message": "/data/\udcff.jpg: no such file"}})
    assert "a" in results.completed_ids(out) and json.loads(out.read_bytes())["error"]["message"].startswith("/data/")


# -------------------------------------------------------------------- B8, B10: ids by position, counts


def test_an_id_less_line_takes_its_position_even_after_an_integer_id(tmp_path):
    batch = _write(tmp_path / "b.jsonl", [{"id": 2, "prompt": "a"}, {"prompt": "b"}])
    with pytest.raises(InputError, match="id '2' is used again on line 2"):
        source.check_unique_ids(batch)
    batch = _write(tmp_path / "c.jsonl", [{"id": "a"}, "[bad]", {"prompt": "b"}])
    with pytest.raises(InputError):
        source.check_unique_ids(batch)  # line 2 is refused, but is still a request line: the next one is "3"
    batch = _write(tmp_path / "d.jsonl", [{"id": "a"}, {"prompt": "b"}])
    assert source.check_unique_ids(batch, done={"2"}).already == 1  # B8


def test_a_resume_that_finishes_the_file_is_complete_with_nothing_left(tmp_path):
    batch = _write(tmp_path / "b.jsonl", [{"id": "a"}, {"id": "b"}])
    out = _write(tmp_path / "r.jsonl", [_ok(source.WorkItem("a", 1, {}))])
    summary = run_batch(_job(batch, out, resume=True), executor=Echo())
    assert summary["complete"] is True and summary["counts"]["left"] == 0  # B10


# ------------------------------------------------------------------------ H12, L10: how ids are printed


def test_ids_with_terminal_escapes_reach_the_terminal_escaped(tmp_path, capsys, monkeypatch):
    batch = tmp_path / "esc.jsonl"
    batch.write_text('{"id":"a\\u001b[31mRED","prompt":"x"}\n{"id":"a\\u001b[31mRED","prompt":"y"}\n')
    code, _, err = _cli(capsys, monkeypatch, batch, tmp_path / "r.jsonl")
    (line,) = _error_lines(err)
    assert code == 2 and "\x1b" not in err and "id 'a\\x1b[31mRED' is used again on line 2" in line, line
    # any message, whoever wrote it (a backend naming the requests it ran): no control character leaves raw
    assert BackendError("generate failed for request(s) a\x1b[31m, b\x9b2J\x07").one_line() == (
        "generate failed for request(s) a\u241b[31m, b\ufffd2J\u2407"
    )


def test_a_huge_id_is_quoted_short(tmp_path):
    batch = _write(tmp_path / "b.jsonl", [{"id": "x" * 100000}, {"id": "x" * 100000}])
    with pytest.raises(InputError) as exc:
        source.check_unique_ids(batch)
    assert len(exc.value.message) < 200 and "is used again on line 2" in exc.value.message


def test_a_directory_given_as_an_image_is_a_bad_request(tmp_path):
    from qwenvl_rbln.batch.worker import BatchWorker, WorkerSpec

    (tmp_path / "photos").mkdir()
    worker = object.__new__(BatchWorker)  # only what a request's checks before the model need
    worker.spec, worker.base, worker.npu = WorkerSpec(batch_file=str(tmp_path / "b.jsonl")), tmp_path, 0
    record = worker._checked(source.WorkItem("a", 3, {"prompt": "x", "images": ["photos"]}))
    assert record["error"]["cause"] == "bad-request", record
    assert "b.jsonl:3: images: 'photos' is a directory, not a file" in record["error"]["message"]


# ---------------------------------------------------------------------- M8: the hint, and no empty file


def test_an_error_before_any_request_finished_leaves_no_file_and_no_resume_hint(tmp_path):
    batch = _write(tmp_path / "b.jsonl", [{"id": "a"}])
    out = tmp_path / "r.jsonl"
    refusal = InputError("--workers 5 ask for 5 workers, the cluster holds 4", "use --workers 4 or fewer")
    with pytest.raises(InputError) as exc:
        run_batch(_job(batch, out), executor=Failing(0, refusal))
    assert exc.value.hint == "use --workers 4 or fewer" and not out.exists()


def test_an_error_after_some_finished_says_how_many_and_resume_once(tmp_path):
    batch = _write(tmp_path / "b.jsonl", [{"id": str(n)} for n in range(4)])
    out = tmp_path / "r.jsonl"
    with pytest.raises(BackendError) as exc:
        run_batch(_job(batch, out), executor=Failing(2, BackendError("the runtime died", "check the NPU")))
    assert exc.value.hint == f"check the NPU; then rerun with --resume (the 2 finished requests are in {out})"
    pool = BackendError("no live worker left", "fix the cause above, then rerun with --resume (completed lines kept)")
    with pytest.raises(BackendError) as exc:
        run_batch(_job(batch, out, resume=True), executor=Failing(1, pool))
    assert exc.value.hint.count("--resume") == 1 and "(the 3 finished requests are in" in exc.value.hint


# ------------------------------------------------------------------------------- L1-L5: the batch file


def test_a_byte_order_mark_is_read_as_one(tmp_path):
    batch = tmp_path / "bom.jsonl"
    batch.write_bytes(b'\xef\xbb\xbf{"id":"a","prompt":"x"}\r\n{"id":"b","prompt":"y"}\r\n')
    assert [(i.id, i.line) for i in source.iter_items(batch)] == [("a", 1), ("b", 2)]  # CRLF stripped too
    assert source.check_unique_ids(batch).count == 2 and [r.id for r in rq.parse_batch_file(batch)] == ["a", "b"]


def test_a_lone_cr_or_a_unicode_line_break_does_not_split_a_line(tmp_path):
    batch = tmp_path / "cr.jsonl"
    batch.write_bytes('{"id":"a",\r"prompt":"x\u2028y"}\n{"id":"b","prompt":"z\x85"}\n'.encode())
    assert [(i.id, i.line) for i in source.iter_items(batch)] == [("a", 1), ("b", 2)]
    reqs = rq.parse_batch_file(batch)
    assert [(r.id, r.source) for r in reqs] == [("a", f"{batch}:1"), ("b", f"{batch}:2")]
    assert reqs[0].prompt == "x\u2028y"


def test_many_bad_lines_say_how_many_and_how_many_are_listed(tmp_path, capsys, monkeypatch):
    n = 2500
    batch = tmp_path / "bad.jsonl"
    batch.write_text("".join("x" + json.dumps({"id": str(i)}) + "\n" for i in range(n)))
    with pytest.raises(InputErrors) as exc:
        source.check_unique_ids(batch)
    assert exc.value.message == f"{n} bad lines in {batch} (the first {source.MAX_PROBLEMS} listed below)"
    assert exc.value.detail_lines()[-1] == f"... {source.MAX_PROBLEMS - 20} more (--json lists the first 1000)"
    code, stdout, err = _cli(capsys, monkeypatch, batch, tmp_path / "r.jsonl", "--json")
    error = json.loads(stdout)["error"]
    assert code == 2 and len(error["problems"]) == source.MAX_PROBLEMS and "the first 1000 listed" in error["message"]


def test_resume_with_nothing_left_starts_no_worker_and_loads_nothing(tmp_path, capsys, monkeypatch):
    batch = _write(tmp_path / "b.jsonl", [{"id": "a"}, {"id": "b"}])
    out = _write(tmp_path / "r.jsonl", [_ok(source.WorkItem(x, 1, {})) for x in "ab"])
    monkeypatch.setattr(driver, "_target_check", lambda *a: pytest.fail("the artifact was resolved"))
    monkeypatch.setattr(driver, "make_executor", lambda opts, n: pytest.fail("a worker was started"))
    argv = ["infer", str(tmp_path), "--batch-file", str(batch), "--output", str(out), "--resume", "--json"]
    code, stdout, err = run_main(argv, capsys)
    summary = json.loads(stdout)
    assert code == 0 and summary["complete"] is True and summary["counts"]["skipped_by_resume"] == 2, err
    assert any(n.startswith("nothing left to run") for n in summary["notes"]) and "nothing left to run" in err


def test_a_pipe_as_batch_file_is_not_a_regular_file(tmp_path, capsys, monkeypatch):
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)  # never opened: refused before any read
    code, _, err = _cli(capsys, monkeypatch, fifo, tmp_path / "r.jsonl")
    (line,) = _error_lines(err)
    assert code == 2 and f"batch file {fifo} is not a regular file (the job reads it twice" in line, line
    with pytest.raises(InputError, match="is not a regular file"):
        rq.parse_batch_file(fifo)
