"""Peak RSS of the batch driver (`qvl infer --batch-file F --output R`'s job) against the batch file's length.

Why: a million-request captioning job must not hold its requests or its results in memory. The driver streams
the batch file (read line by line: a duplicate-id pre-pass keeping 8 bytes per line, then the job), writes each
record as it completes, and `--resume` keeps the finished ids as 8-byte hashes. Here a stand-in executor (no
model: one small ok record per request, as fast as the driver can go) takes the place of the workers, so what is
measured is the driver alone. Each case runs in a fresh process; peak RSS is that process's VmHWM (Linux), next to
its RSS before the job (imports done, nothing read). Cases: a fresh job at each size, and a `--resume` of the
largest with half of it already in the output.

    python benchmarks/bench_batch_stream.py                 # 10k, 100k, 1M lines
    python benchmarks/bench_batch_stream.py --sizes 10000   # one size
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from qwenvl_rbln.batch.driver import BatchOptions, run_batch
from qwenvl_rbln.batch.records import ok_record
from qwenvl_rbln.batch.worker import WorkerSpec

class StandIn:
    def run(self, items, emit, event):
        event("worker.state", {"worker": "stand-in", "npu": 0, "state": "busy"})
        for item in items:
            emit(ok_record(item, text="a caption", token_ids=[1, 2, 3], finish_reason="stop", vision=[],
                           decoder_graph="decoder_batch_1", prompt_tokens=12, timings={}, worker="stand-in", npu=0))
    def close(self):
        pass

def status(key):  # kB; VmHWM is this process's own peak (ru_maxrss would carry the parent's over from fork)
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])

batch, out, resume = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "1"
before = status("VmRSS")
t0 = time.perf_counter()
summary = run_batch(BatchOptions(WorkerSpec(), batch, out, resume=resume), executor=StandIn())
wall = time.perf_counter() - t0
peak = status("VmHWM")
print(json.dumps({"wall_s": round(wall, 2), "rss_before_mib": round(before / 1024, 1),
                  "peak_rss_mib": round(peak / 1024, 1), "counts": summary["counts"]}))
"""


def write_batch(path: Path, lines: int) -> None:
    """Captioning requests with ids, as a real job's file would be (~90 bytes a line)."""
    with path.open("w") as fh:
        for n in range(lines):
            fh.write(json.dumps({"id": f"img-{n:07d}", "prompt": "Caption this image.", "image": f"img/{n:07d}.jpg"}))
            fh.write("\n")


def keep_half(out: Path, lines: int) -> None:
    """Cut the results file after ``lines`` lines (streamed: the parent stays small)."""
    with out.open("rb+") as fh:
        for _ in range(lines):
            fh.readline()
        fh.truncate(fh.tell())


def run_case(batch: Path, out: Path, resume: bool) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(REPO), str(batch), str(out), "1" if resume else "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="qvl-bench-batch-") as tmp:
        for size in args.sizes:
            batch, out = Path(tmp) / f"b{size}.jsonl", Path(tmp) / f"r{size}.jsonl"
            write_batch(batch, size)
            rows.append({"lines": size, "case": "fresh", **run_case(batch, out, False)})
            keep_half(out, size // 2)
            rows.append({"lines": size, "case": "resume, half done", **run_case(batch, out, True)})
            batch.unlink()
            out.unlink()
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
