"""Throughput of `qvl infer --batch-file --output` over the Ray pool at 1, 2, 4 and 8 workers, on emulated NPUs.

Every graph call is held ``QVL_EMULATE_CALL_MS`` (default 200 ms) as a busy device would hold it, so the figure
measures qvl's own overhead (driver, Ray, the workers' host work on this machine's CPUs) against a device that is
busy, not the CPU's speed. One local Ray with 8 emulated NPUs (``QVL_EMULATOR_DEVICES=8``) serves every run; each
run starts N actors on the tiny artifact (``cpu-tiny-rbln --emulate``) and measures from the moment the LAST worker
has loaded (no request is handed out before: ``RayExecutor(all_loaded_first=True)``) to the last result line
written, so the 8 actors' torch imports on 2 cores are not counted. Targets: 4 workers >= 3.6x one, 8 >= 7x.

    .venv/bin/python benchmarks/bench_batch_scaling.py [--workers 1,2,4,8] [--per-worker 16] [--call-ms 200]

Emulated: these are not NPU figures, only the pool's scaling against a device that takes call-ms per graph call.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGETS = {4: 3.6, 8: 7.0}  # speed-up over one worker
sys.path.insert(0, str(REPO))


def _qvl(args: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "qwenvl_rbln", *args], cwd=REPO, env=env, capture_output=True, text=True
    )
    if proc.returncode:
        raise SystemExit(f"qvl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")


def one_run(spec, workers: int, count: int, out_dir: Path) -> dict:
    """N actors, ``count`` requests; seconds and requests from the last worker loaded to the last line."""
    from qwenvl_rbln.batch.ray_pool import RayExecutor
    from qwenvl_rbln.batch.source import WorkItem

    items = [WorkItem(f"r{i}", i + 1, {"id": f"r{i}", "prompt": f"Describe picture number {i}."}) for i in range(count)]
    loaded: set[str] = set()
    marks: dict[str, float] = {}
    done: list[tuple[float, int]] = []

    def event(name: str, fields: dict) -> None:
        if name == "worker.state" and fields["state"] == "idle":
            loaded.add(fields["worker"])
            if len(loaded) == workers and "ready" not in marks:
                marks["ready"] = time.perf_counter()
                marks["cpu"] = time.process_time()

    def emit(record: dict) -> None:
        if not record["ok"]:
            raise SystemExit(f"request {record['id']} failed: {record['error']}")
        done.append((time.perf_counter(), record["num_tokens"]))

    t0 = time.perf_counter()
    pool = RayExecutor(spec, workers=workers, worker_cls=None, all_loaded_first=True)
    pool.run(iter(items), emit, event)
    end = max(t for t, _ in done)
    seconds = end - marks["ready"]
    return {
        "workers": workers,
        "requests": len(done),
        "load_s": round(marks["ready"] - t0, 2),
        "seconds": round(seconds, 3),
        "requests_per_s": round(len(done) / seconds, 3),
        "tokens_per_s": round(sum(n for _, n in done) / seconds, 2),
        "driver_cpu_s": round(time.process_time() - marks["cpu"], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--per-worker", type=int, default=16, help="requests per worker in each run")
    ap.add_argument("--call-ms", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=8, help="--max-new-tokens")
    opts = ap.parse_args()
    counts = [int(x) for x in opts.workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="qvl-bench-scale-") as tmp:
        env = {
            "QVL_HOME": str(Path(tmp) / "qvl-home"),
            "HOME": str(Path(tmp) / "home"),  # Ray 2.60 keeps its auth token in ~/.ray
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            "OMP_NUM_THREADS": "1",
            "QVL_EMULATOR_DEVICES": str(max(counts)),
            "QVL_EMULATE_CALL_MS": str(opts.call_ms),
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        }
        Path(env["HOME"]).mkdir()
        os.environ.update(env)
        art = Path(tmp) / "tiny"
        _qvl(["tiny-model"], {**os.environ})
        _qvl(["compile", "--preset", "cpu-tiny-rbln", "--emulate", "-o", str(art)], {**os.environ})

        from qwenvl_rbln.batch.ray_cluster import start_or_connect
        from qwenvl_rbln.batch.worker import WorkerSpec
        from qwenvl_rbln.inference.runner import InferOptions

        start_or_connect(None, emulate=True)
        spec = WorkerSpec(InferOptions(directory=art, emulate=True, max_new_tokens=opts.tokens))
        rows = []
        for n in counts:
            rows.append(one_run(spec, n, n * opts.per_worker, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
        base = rows[0]["requests_per_s"] / rows[0]["workers"]
        print(f"\nemulated NPUs, QVL_EMULATE_CALL_MS={opts.call_ms}, {opts.tokens} new tokens, batch 2 per call")
        print("workers  requests/s  speed-up  (load s, driver CPU s)")
        for r in rows:
            speed = r["requests_per_s"] / base
            print(
                f"{r['workers']:>7}  {r['requests_per_s']:>10.2f}  {speed:>7.2f}x  ({r['load_s']}, {r['driver_cpu_s']})"
            )
        import ray

        ray.shutdown()
    speed = {r["workers"]: r["requests_per_s"] / base for r in rows}
    missed = [f"{n} workers {speed[n]:.2f}x < {t}x" for n, t in TARGETS.items() if n in speed and speed[n] < t]
    if missed:
        raise SystemExit("target missed: " + "; ".join(missed))


if __name__ == "__main__":
    main()
