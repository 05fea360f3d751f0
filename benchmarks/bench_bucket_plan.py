"""`qvl bucket-plan` at scale: 10,000 image files, and --optimize over 100,000 workload sizes.

Why: bucket-plan is meant to run on a whole image folder or on months of request logs. Both cases
run as fresh `python -m qwenvl_rbln` processes (startup included) with --json to /dev/null (the
heaviest output path), and report wall time plus the child's peak RSS from os.wait4's rusage.

* files: 10,000 PNGs of varied declared sizes (header-only, ~60 bytes each: bucket-plan reads
  headers only, so generating real pixels would only slow the setup down).
* workload: 100,000 JSONL lines with seeded random sizes (64..4096 px a side, counts 1..50, 2% videos),
  planned and optimised for K=4 buckets.

Usage: python benchmarks/bench_bucket_plan.py [--files N] [--sizes N] [--k K]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

SEED = 20260
COMMON = [(640, 480), (800, 600), (1024, 768), (1280, 720), (1920, 1080), (2048, 1536), (3024, 4032), (512, 512)]


def png_header_only(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def make_files(root: Path, n: int) -> None:
    rng = random.Random(SEED)
    for i in range(n):
        w, h = rng.choice(COMMON) if rng.random() < 0.6 else (rng.randint(100, 4000), rng.randint(100, 4000))
        sub = root / f"d{i % 50:02d}"
        sub.mkdir(exist_ok=True)
        (sub / f"img{i:05d}.png").write_bytes(png_header_only(w, h))


def make_workload(path: Path, n: int) -> None:
    rng = random.Random(SEED + 1)
    with path.open("w") as f:
        for _ in range(n):
            entry: dict = {"width": rng.randint(64, 4096), "height": rng.randint(64, 4096), "count": rng.randint(1, 50)}
            if rng.random() < 0.02:
                entry.update(frames=rng.randint(300, 3000), fps=rng.choice([24, 25, 30]))
            f.write(json.dumps(entry) + "\n")


def run_child(args: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak RSS bytes, exit code) of one `python -m qwenvl_rbln ...` process."""
    cmd = [sys.executable, "-m", "qwenvl_rbln", *args]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode not in (0,):
        print(f"warning: {' '.join(args[:2])} exited {proc.returncode}: {err.strip()[:300]}", file=sys.stderr)
    rss = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)  # Linux reports KiB
    return wall, rss, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--sizes", type=int, default=100_000)
    ap.add_argument("--k", type=int, default=4)
    a = ap.parse_args()
    results = {"machine": f"{platform.machine()} {os.cpu_count()} CPU, Python {platform.python_version()}"}
    with tempfile.TemporaryDirectory(prefix="qvl-bench-") as tmp:
        root = Path(tmp)
        files = root / "images"
        files.mkdir()
        t0 = time.perf_counter()
        make_files(files, a.files)
        results["files_setup_s"] = round(time.perf_counter() - t0, 2)
        wall, rss, code = run_child(["bucket-plan", str(files), "--preset", "rebel100-1npu-vit-buckets", "--json"])
        results["files"] = {"n": a.files, "wall_s": round(wall, 2), "peak_rss_mib": round(rss / 2**20, 1), "exit": code}
        wl = root / "workload.jsonl"
        make_workload(wl, a.sizes)
        wall, rss, code = run_child(
            [
                "bucket-plan",
                "--workload",
                str(wl),
                "--optimize",
                str(a.k),
                "--preset",
                "rebel100-1npu-vit-buckets",
                "--json",
            ]
        )
        results["workload"] = {
            "lines": a.sizes,
            "k": a.k,
            "wall_s": round(wall, 2),
            "peak_rss_mib": round(rss / 2**20, 1),
            "exit": code,
        }
        wall, rss, code = run_child(
            ["bucket-plan", "--workload", str(wl), "--optimize", str(a.k), "--preset", "rebel100-1npu-vit-buckets"]
        )
        results["workload_human"] = {"wall_s": round(wall, 2), "peak_rss_mib": round(rss / 2**20, 1), "exit": code}
    results["optimizer_only"] = bench_optimizer(a.sizes)
    print(json.dumps(results, indent=2))


def bench_optimizer(n: int) -> dict:
    """optimize_buckets alone on n seeded patch counts up to 65536 (the stock processor's maximum)."""
    from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_2B
    from qwenvl_rbln.vision.buckets import optimize_buckets, vit_cost_fn

    rng = random.Random(SEED + 2)
    counts: dict[int, int] = {}
    for _ in range(n):
        p = 4 * rng.randint(64, 16384)
        counts[p] = counts.get(p, 0) + rng.randint(1, 50)
    out = {"sizes": n, "distinct": len(counts)}
    for k in (4, 16):
        t0 = time.perf_counter()
        res = optimize_buckets(counts, k, vit_cost_fn(QWEN3_VL_2B.vision))
        out[f"k{k}_s"] = round(time.perf_counter() - t0, 3)
        out[f"k{k}_executed_over_useful"] = round(res.ratio, 4)
    return out


if __name__ == "__main__":
    main()
