"""`qvl tune` search time: a 10,000-line workload with a 1,000-entry batch trace (target: under 5 s on 2 cores).

Why: tune is meant to run before the first compile, on real request logs; it must answer as fast as a dry run
does, not sweep like a GPU autotuner. Each run is a fresh `python -m qwenvl_rbln tune ... --json` process
(startup, workload read, bucket DP and every planner check included); the JSON's own ``search_s`` and
``searched`` (planner calls) are reported beside the wall time.

* workload: 10,000 JSONL lines, seeded: common photo sizes with jitter and random sizes up to 4096 px, counts
  1..20, 10 % multi-image requests ("images": 2..6), 2 % videos.
* trace: 1,000 running-batch sizes, seeded, 1..16.
* cases: one NPU at 32,768 (the document's batch-4 case), two NPUs at 262,144 (the ViT on its own NPU), the
  need nothing meets (262,144 at batch 64 on one NPU: the nearest configurations), and the capacity search under
  latency targets at a rate (every table row through the serving simulator).

Usage: python benchmarks/bench_tune.py [--lines N] [--trace N] [--runs R]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEED = 20263
COMMON = [(640, 480), (800, 600), (1024, 768), (1280, 720), (1920, 1080), (3024, 4032), (512, 512)]
REPO = Path(__file__).resolve().parents[1]
CASES = {
    "1 NPU, context 32768, batch >= 4": ["--context", "32768", "--min-batch", "4"],
    "2 NPUs, context 262144, batch >= 4": ["--context", "262144", "--min-batch", "4", "--devices", "2"],
    "1 NPU, context 262144, batch >= 64 (unmet)": ["--context", "262144", "--min-batch", "64"],
    # the capacity search: each table row simulated (vllm-rbln's scheduler, 1000 requests a run) under the targets
    "1 NPU, context 32768, --slo ttft_p90=2s,tpot_p99=100ms --rate 20": [
        "--context",
        "32768",
        "--slo",
        "ttft_p90=2s,tpot_p99=100ms",
        "--rate",
        "20",
    ],
}


def make_files(root: Path, lines: int, steps: int) -> tuple[Path, Path]:
    rng = random.Random(SEED)
    workload, trace = root / "workload.jsonl", root / "trace.txt"
    with workload.open("w") as f:
        for _ in range(lines):
            if rng.random() < 0.7:
                w, h = rng.choice(COMMON)
                w, h = w + rng.randint(-64, 64), h + rng.randint(-64, 64)
            else:
                w, h = rng.randint(64, 4096), rng.randint(64, 4096)
            entry: dict = {"width": w, "height": h, "count": rng.randint(1, 20)}
            roll = rng.random()
            if roll < 0.02:
                entry.update(frames=rng.randint(300, 3000), fps=rng.choice([24, 25, 30]))
            elif roll < 0.12:
                entry["images"] = rng.randint(2, 6)
            f.write(json.dumps(entry) + "\n")
    trace.write_text("\n".join(str(rng.randint(1, 16)) for _ in range(steps)) + "\n")
    return workload, trace


def run(args: list[str]) -> tuple[float, dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "qwenvl_rbln", "tune", *args, "--json"], capture_output=True,
                          text=True, env=env, check=False)  # fmt: skip
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 4):
        raise SystemExit(f"qvl tune failed ({proc.returncode}): {proc.stderr}")
    return wall, json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--trace", type=int, default=1_000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    print(f"{platform.machine()}, {os.cpu_count()} CPU, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        workload, trace = make_files(Path(tmp), a.lines, a.trace)
        for name, extra in CASES.items():
            walls, inner = [], []
            doc: dict = {}
            for _ in range(a.runs):
                wall, doc = run(["--workload", str(workload), "--batch-trace", str(trace), *extra])
                walls.append(wall)
                inner.append(doc["search_s"])
            best = doc.get("best")
            answer = (
                f"best batch {best['batch_size']} at {best['max_seq_len']}, ViT on device "
                f"{best['placement']['visual_device']}"
                if best
                else f"exit 4, {len(doc['nearest'])} nearest"
            )
            if best:  # the estimate: graphs, sampler and host time (its source: timings.json's, else the default)
                est, host = best["estimate"], doc["cost_model"]["host_time"]
                answer += (
                    f"; estimate {est['output_tokens_per_s']:.0f} tok/s, TTFT {est['ttft_s'] * 1000:.2f} ms, TPOT "
                    f"{est['tpot_s'] * 1000:.2f} ms, NPU busy {est['npu_busy_share']:.0%} (host time "
                    f"{'measured' if host['measured'] else 'default'})"
                )
            if (best or {}).get("capacity", {}).get("capacity_rps"):
                cap = best["capacity"]
                answer += f"; capacity {cap['capacity_rps']:.2f} req/s per replica, {cap['replicas']} replica(s)"
            print(
                f"{name}: wall median {statistics.median(walls):.2f} s (max {max(walls):.2f}), in-process "
                f"{statistics.median(inner):.2f} s, {doc['searched']} planner calls, "
                f"{doc['workload']['distinct_sizes']:,} distinct sizes; {answer}"
            )


if __name__ == "__main__":
    main()
