"""`qvl eval`: the scoring throughput on 100,000 result lines, and the driver's overhead per question over
`qvl infer --batch-file F --output R` on the same requests (emulated).

Why: scoring must never be the slow part of an evaluation (a re-score after a rule change reads every line), and
`qvl eval` must add next to nothing to the batch job it drives.

1. Scoring: a results file of N lines as `qvl eval` writes them (each with the batch record's fields: 16 token ids,
   a vision entry, timings), 60 % right, three categories, and a baseline of the same ids; `qvl eval --score R
   --baseline B --json` in a fresh process (wall, peak RSS), and the in-process stages (read, score, report).
2. Overhead: the tiny Qwen3-VL compiled with `--emulate` (`cpu-tiny-rbln`: optimum-rbln's real code on qvl's CPU
   emulator; every figure from it is emulated), easy-VQA's first Q questions, fresh processes, alternating
   `qvl eval --data easy-vqa --limit Q` and `qvl infer --batch-file <the requests file eval wrote> --output`; the
   median difference per question, beside eval's own deterministic work timed in-process for Q and for 1,000
   questions (load the set, write the requests, derive and write R.jsonl, the report).

    .venv/bin/python benchmarks/bench_eval.py                      # both, 100,000 lines, 16 questions x 3 rounds
    .venv/bin/python benchmarks/bench_eval.py --skip-overhead --lines 100000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _line(n: int, right: bool, rng: random.Random) -> dict:
    category = ("color", "shape", "yes/no")[n % 3]
    answer = {"color": "red", "shape": "circle", "yes/no": "yes"}[category]
    return {
        "id": f"q-{n:07d}",
        "question": f"what is the {category} in picture {n}?",
        "answers": [answer],
        "category": category,
        "prompt": f"what is the {category}?\nAnswer the question using a single word or phrase.",
        "data": "bench.jsonl",
        "backend": "rbln",
        "artifact": "/models/out",
        "emulated": False,
        "prediction": answer.title() + "." if right else "blue",
        "correct": right,
        "score": float(right),
        "metric": "vqa",
        "line": n + 1,
        "worker": "worker-0",
        "npu": 0,
        "ok": True,
        "text": answer if right else "blue",
        "token_ids": [rng.randrange(151000) for _ in range(16)],
        "num_tokens": 16,
        "finish_reason": "stop",
        "vision": [{"input": f"/data/img/{n}.png", "kind": "image", "width": 640, "height": 480, "bucket": 1024}],
        "vit_buckets": [1024],
        "decoder_graph": "decoder_batch_4",
        "prompt_tokens": 330,
        "timings": {"preprocess_s": 0.01, "vision_s": 0.02, "ttft_s": 0.05, "decode_s": 0.2, "batch_rows": 4},
        "error": None,
    }


def write_results(path: Path, lines: int, seed: int, p_right: float) -> None:
    rng = random.Random(seed)
    with path.open("w") as fh:
        for n in range(lines):
            fh.write(json.dumps(_line(n, rng.random() < p_right, rng), separators=(",", ":")) + "\n")


def scoring(lines: int, tmp: Path) -> dict:
    this, base = tmp / "this.jsonl", tmp / "base.jsonl"
    write_results(this, lines, 1, 0.60)
    write_results(base, lines, 2, 0.62)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "qwenvl_rbln", "eval", "--score", str(this), "--baseline", str(base), "--json"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    doc = json.loads(proc.stdout)
    from qwenvl_rbln.evaluation import report, results

    t0 = time.perf_counter()
    rows, brows = results.load_results(this, "--score"), results.load_results(base, "--baseline")
    t1 = time.perf_counter()
    rows = [results.score_line(x, "vqa") for x in rows]
    brows = [results.score_line(x, "vqa") for x in brows]
    t2 = time.perf_counter()
    report.build(rows, data=None, results=str(this), metric="vqa", baseline=brows, baseline_path=str(base))
    t3 = time.perf_counter()
    return {
        "lines": lines,
        "file_mib": round(this.stat().st_size / 2**20, 1),
        "wall_s": round(wall, 2),
        "lines_per_s": round(2 * lines / wall),
        "peak_rss_mib": round(peak, 1),
        "read_s": round(t1 - t0, 2),
        "score_s": round(t2 - t1, 2),
        "report_s": round(t3 - t2, 2),
        "accuracy": round(doc["accuracy"], 4),
        "delta_points": round(doc["delta_points"], 2),
        "mcnemar_p": doc["mcnemar_p"],
    }


def _qvl(args: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "qwenvl_rbln", *args], cwd=env["WORK"], env=env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"qvl {' '.join(args)}: {proc.stderr[-600:]}")
    return time.perf_counter() - t0


def own_work(questions: int, tmp: Path) -> float:
    """Seconds of eval's own deterministic work for ``questions`` (no model): set, requests, R.jsonl, report."""
    from qwenvl_rbln.batch.records import ok_record
    from qwenvl_rbln.batch.source import WorkItem
    from qwenvl_rbln.evaluation import dataset, report, results

    tmp.mkdir()
    t0 = time.perf_counter()
    items = dataset.load("easy-vqa", questions).items
    files = results.files_for(tmp / "own.jsonl")
    results.check_before_run(files, False)
    results.write_requests(files, items, False)
    with files.batch.open("w") as fh:  # the batch job's part, not timed
        for n, it in enumerate(items):
            fields = {"decoder_graph": "decoder_batch_2", "prompt_tokens": 90, "timings": {}, "worker": "w", "npu": 0}
            rec = ok_record(
                WorkItem(it.id, n + 1, {}), text="red", token_ids=[1, 2], finish_reason="stop", vision=[], **fields
            )
            fh.write(json.dumps(rec) + "\n")
    t1 = time.perf_counter()
    lines = results.eval_lines(items, files.batch, "vqa", {"data": "easy-vqa"})
    results.write_jsonl_atomic(files.output, lines)
    report.build(lines, data="easy-vqa", results=str(files.output), metric="vqa")
    t2 = time.perf_counter()
    return (t1 - t0) + (t2 - t1)


def overhead(questions: int, rounds: int, tokens: int, tmp: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "QVL_HOME": str(tmp / "home"), "HF_HUB_OFFLINE": "1"}
    env |= {"WORK": str(tmp), "OMP_NUM_THREADS": "1"}
    art = tmp / "art"
    _qvl(["tiny-model"], env)
    _qvl(["compile", "--preset", "cpu-tiny-rbln", "--emulate", "-o", str(art)], env)
    gen = ["--emulate", "--max-new-tokens", str(tokens)]
    evals, infers = [], []
    for r in range(rounds):
        out = tmp / f"eval-{r}.jsonl"
        evals.append(
            _qvl(["eval", str(art), "--data", "easy-vqa", "--limit", str(questions), "-o", str(out), *gen], env)
        )
        requests = tmp / f"eval-{r}.requests.jsonl"
        infers.append(_qvl(["infer", str(art), "--batch-file", str(requests), "--output", str(tmp / f"i{r}.jsonl"),
                            *gen], env))  # fmt: skip
        eval_tokens = [json.loads(x)["token_ids"] for x in out.read_text().splitlines()]
        infer_tokens = [json.loads(x)["token_ids"] for x in (tmp / f"i{r}.jsonl").read_text().splitlines()]
        assert eval_tokens == infer_tokens, "eval and infer answered differently"
    diffs = [(e - i) / questions for e, i in zip(evals, infers, strict=True)]
    return {
        "questions": questions,
        "rounds": rounds,
        "eval_wall_s": [round(x, 2) for x in evals],
        "infer_wall_s": [round(x, 2) for x in infers],
        "overhead_per_question_ms_median": round(statistics.median(diffs) * 1000, 1),
        "own_work_ms": {n: round(own_work(n, tmp / f"own-{n}") * 1000, 1) for n in (questions, 1000)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--skip-scoring", action="store_true")
    ap.add_argument("--skip-overhead", action="store_true")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="qvl-bench-eval-") as tmp:
        if not opts.skip_scoring:
            print(json.dumps({"scoring": scoring(opts.lines, Path(tmp))}), flush=True)
        if not opts.skip_overhead:
            print(json.dumps({"overhead (emulated)": overhead(opts.questions, opts.rounds, opts.tokens, Path(tmp))}))


if __name__ == "__main__":
    main()
