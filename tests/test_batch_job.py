"""`qvl infer --batch-file F --output R` end to end on the offline tiny Qwen3-VL (torch reference backend):
one line per request with the documented fields, an error line per request that cannot run (missing image,
too long for the context, corrupt video) while the job goes on, the --json summary, --resume after a torn last
line, the same tokens as `qvl infer --batch-file` without --output (which still prints its report), and no Ray
import on the one-NPU path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.fakes_rbln import run_main  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
N = 3  # new tokens per request
OK_IDS = ["hello", "pic", "4"]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from PIL import Image

    d = tmp_path_factory.mktemp("batch")
    Image.new("RGB", (64, 48), (200, 40, 40)).save(d / "red.png")
    (d / "bad.mp4").write_bytes(b"\x00\x01 not a video at all" * 64)
    return _write(
        d / "requests.jsonl",
        [
            {"id": "hello", "prompt": "Say hello."},
            {"id": "pic", "prompt": "Describe.", "image": "red.png"},  # relative to the batch file
            {"id": "gone", "prompt": "Describe.", "image": "missing.png"},
            {"prompt": "Short."},  # id "4": its position
            {"id": "long", "prompt": "word " * 40000},
            {"id": "cut", "prompt": "What happens?", "video": "bad.mp4"},
        ],
    )


def _job(capsys: Any, tiny: Path, batch: Path, out: Path, *extra: str) -> tuple[int, Any, str]:
    argv = ["infer", str(tiny), "--batch-file", str(batch), "--output", str(out), "--max-new-tokens", str(N)]
    code, stdout, err = run_main([*argv, *extra, "--json"], capsys)
    return code, (json.loads(stdout) if stdout.strip() else None), err


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def job(tiny_model: Path, batch: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of the job (capsys is function-scoped: capture by hand around cli.main)."""
    out = tmp_path_factory.mktemp("out") / "results.jsonl"
    mp = pytest.MonkeyPatch()
    cap = _Capture(mp)
    try:
        code, summary, err = _job(cap, tiny_model, batch, out)
    finally:
        mp.undo()
    return {"code": code, "summary": summary, "err": err, "out": out, "lines": _lines(out)}


class _Capture:
    """capsys's readouterr for a module-scoped fixture: sys.stdout/sys.stderr swapped for StringIO."""

    def __init__(self, mp: pytest.MonkeyPatch):
        import io

        self.mp, self.io = mp, io
        self._swap()

    def _swap(self) -> None:
        self.out, self.err = self.io.StringIO(), self.io.StringIO()
        self.mp.setattr(sys, "stdout", self.out)
        self.mp.setattr(sys, "stderr", self.err)

    def readouterr(self) -> Any:
        got = type("Captured", (), {"out": self.out.getvalue(), "err": self.err.getvalue()})
        self._swap()
        return got


def test_each_request_is_one_line_with_text_tokens_buckets_graph_timings_and_worker(job):
    assert job["code"] == 0, job["err"]
    by_id = {r["id"]: r for r in job["lines"]}
    assert sorted(by_id) == sorted([*OK_IDS, "gone", "long", "cut"]) and len(job["lines"]) == 6
    for rid in OK_IDS:
        r = by_id[rid]
        assert r["ok"] and r["error"] is None and len(r["token_ids"]) == r["num_tokens"] == N, r
        assert isinstance(r["text"], str) and r["finish_reason"] in ("length", "stop")
        assert r["decoder_graph"].startswith("decoder_batch_") and r["timings"]["generate_s"] > 0
        assert r["worker"] == "worker-0" and "npu" in r
    assert by_id["pic"]["vit_buckets"] and by_id["pic"]["vit_buckets"] == [by_id["pic"]["vision"][0]["bucket"]]
    assert by_id["4"]["line"] == 4 and by_id["hello"]["vit_buckets"] == []


@pytest.mark.parametrize(
    ("rid", "cause", "says"),
    [
        ("gone", "missing-media", "missing.png"),
        ("long", "too-long", "max_seq_len"),
        ("cut", "corrupt-media", "bad.mp4"),
    ],
)
def test_a_request_that_cannot_run_is_one_error_line_and_the_job_goes_on(job, rid, cause, says):
    r = {x["id"]: x for x in job["lines"]}[rid]
    assert not r["ok"] and r["token_ids"] == [] and r["error"]["cause"] == cause, r
    assert says in r["error"]["message"] and r["error"]["worker"] == "worker-0"


def test_json_summary_counts_failures_by_cause_and_throughput_per_worker(job):
    s = job["summary"]
    assert s["output"] == str(job["out"]) and s["complete"] is True
    assert s["counts"] == {"total": 6, "done": 6, "ok": 3, "failed": 3, "skipped_by_resume": 0, "left": 0}
    assert s["failures_by_cause"] == {"corrupt-media": 1, "missing-media": 1, "too-long": 1}
    (w,) = s["workers"]
    assert w["worker"] == "worker-0" and w["requests"] == 6 and w["tokens"] == 3 * N and w["tokens_per_s"] > 0
    assert "6 of 6 requests to run" in job["err"]  # plain progress lines on stderr off a terminal
    assert any("tiny model (random weights)" in n for n in s["notes"]) and "tiny model" in job["err"]


def test_resume_redoes_a_torn_last_line_and_every_id_appears_once(job, tiny_model, batch, tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    text = job["out"].read_text().splitlines(keepends=True)
    out.write_text("".join(text[:3]) + text[3][: len(text[3]) // 2])  # three lines done, the fourth torn
    code, again, err = _job(capsys, tiny_model, batch, out)
    assert code == 2 and "already holds results" in err and "--resume" in err  # never overwritten
    code, summary, err = _job(capsys, tiny_model, batch, out, "--resume")
    assert code == 0, err
    assert summary["counts"]["skipped_by_resume"] == 3 and summary["counts"]["done"] == 3
    assert "torn last line" in err and summary["notes"]
    lines = _lines(out)
    assert sorted(r["id"] for r in lines) == sorted(r["id"] for r in job["lines"])  # each id exactly once
    first = {r["id"]: r["token_ids"] for r in job["lines"]}
    assert all(r["token_ids"] == first[r["id"]] for r in lines)  # greedy: the redone ones give the same tokens


def test_batch_file_without_output_still_prints_its_report_with_the_same_tokens(job, tiny_model, batch, capsys):
    ok = batch.parent / "ok.jsonl"
    rows = [json.loads(x) for x in batch.read_text().splitlines()]
    _write(ok, [r for r in rows if r.get("id") not in ("gone", "long", "cut")])
    argv = ["infer", str(tiny_model), "--batch-file", str(ok), "--max-new-tokens", str(N), "--json"]
    code, out, err = run_main(argv, capsys)
    assert code == 0, err
    report = json.loads(out)
    assert {"requests", "batches", "backend"} <= set(report)  # the in-memory run's report, as before
    streamed = [r["token_ids"] for r in sorted(job["lines"], key=lambda r: r["line"]) if r["ok"]]
    assert [r["token_ids"] for r in report["requests"]] == streamed  # same requests, same greedy tokens


def test_the_one_npu_job_never_imports_ray(tiny_model, tmp_path):
    batch = _write(tmp_path / "b.jsonl", [{"prompt": "Hi."}])
    code = (
        "import sys\n"
        "from qwenvl_rbln import cli\n"
        f"sys.argv = ['qvl', 'infer', {str(tiny_model)!r}, '--batch-file', {str(batch)!r}, '--output', "
        f"{str(tmp_path / 'r.jsonl')!r}, '--max-new-tokens', '1']\n"
        "try:\n    cli.main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "ray = any(m == 'ray' or m.startswith('ray.') for m in sys.modules)\n"
        "print('RAY' if ray else 'NO-RAY', file=sys.__stdout__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "NO-RAY", proc.stdout
    assert json.loads((tmp_path / "r.jsonl").read_text())["ok"] is True
