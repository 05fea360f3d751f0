"""Emulated Rebel100 vs the reference backend on the tiny model: compile and infer wall time, fresh processes.

Compile: `qvl compile --preset cpu-tiny-rbln --emulate --no-cache` (optimum-rbln's real compile, every graph
traced by qvl's emulator) vs `qvl compile --preset cpu-tiny --no-cache` (the reference backend copies the model).
Infer: the same request (assets/demo.jpg, "Describe this image.", 24 greedy tokens) on each artifact, end to end
(process start, imports, load, generate), plus the load / TTFT / decode figures from `--json`.

    .venv/bin/python benchmarks/bench_emulator.py [--runs 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IMAGE = REPO / "assets" / "demo.jpg"


def _run(args: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "qwenvl_rbln", *args], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"qvl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    return wall, proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for every qvl process")
    opts = ap.parse_args()
    rows: dict[str, list[float]] = {}
    extra: dict[str, list[dict]] = {"emulated": [], "reference": []}
    with tempfile.TemporaryDirectory(prefix="qvl-bench-emu-") as tmp:
        env = {**os.environ, "QVL_HOME": str(Path(tmp) / "home"), "HF_HUB_OFFLINE": "1"}
        if opts.threads:
            env["OMP_NUM_THREADS"] = str(opts.threads)
        _run(["tiny-model"], env)  # built once, outside the timings
        for i in range(opts.runs):
            for name, preset, flags in (
                ("emulated", "cpu-tiny-rbln", ["--emulate"]),
                ("reference", "cpu-tiny", []),
            ):
                out = Path(tmp) / f"{name}-{i}"
                wall, _ = _run(["compile", "--preset", preset, *flags, "--no-cache", "-o", str(out)], env)
                rows.setdefault(f"compile {name}", []).append(wall)
                args = ["infer", str(out), *flags, "--image", str(IMAGE), "--prompt", "Describe this image."]
                wall, stdout = _run([*args, "--max-new-tokens", str(opts.tokens), "--json"], env)
                rows.setdefault(f"infer {name}", []).append(wall)
                data = json.loads(stdout)
                t = data["batches"][0]["timings"]
                extra[name].append(
                    {
                        "load_s": data["timings"]["load_s"],
                        "ttft_s": t["ttft_s"],
                        "decode_tok_s": t["decode_tokens_per_s"],
                        "tokens": data["requests"][0]["token_ids"],
                    }
                )
    same = all(e["tokens"] == r["tokens"] for e, r in zip(extra["emulated"], extra["reference"], strict=True))
    print(f"runs: {opts.runs}, {opts.tokens} new tokens, threads {opts.threads or 'default'}, identical tokens: {same}")
    for key, values in rows.items():
        print(f"{key:20s} median {statistics.median(values):6.2f} s  (runs: {', '.join(f'{v:.2f}' for v in values)})")
    for name, items in extra.items():
        med = {k: statistics.median(x[k] for x in items if x[k] is not None) for k in ("load_s", "ttft_s")}
        rates = [x["decode_tok_s"] for x in items if x["decode_tok_s"]]
        rate = statistics.median(rates) if rates else float("nan")
        print(f"{name:10s} load {med['load_s']:.2f} s, TTFT {med['ttft_s']:.3f} s, decode {rate:.1f} tok/s")


if __name__ == "__main__":
    main()
