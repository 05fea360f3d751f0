"""One host, many NPUs: `qvl serve --emulate --workers 2` (two engines behind vllm-router) against one engine, same
per-call device hold, same workload; and the router's policies on that fleet. **Emulated** figures: vLLM 0.22.0 +
vllm-rbln v0.11.1a1 over qvl's CPU emulator, the tiny Qwen3-VL (`cpu-tiny-rbln --emulate`, batch 2), every graph
call held at least ``QVL_EMULATE_CALL_MS`` (the emulator's stand-in for the NPU's time), so the engines spend their
time as an NPU host's would: waiting on their device, each on its own.

One fleet is started; "one replica" is `qvl bench-serve` against engine-0's own loopback port at its compiled batch
(2), "two replicas" the same command against the router at the sum of the batches (4: what `qvl bench-serve` takes
from the router's /readiness), the same requests (`--seed`), each with one image sized to a compiled ViT bucket.
The policies: a second router on the same two engines per policy, the same workload.

    .venv/bin/python benchmarks/bench_fleet.py [--hold-ms 1000] [--prompts 16] [--output-len 8] [--target 1.8]

It exits 1 when two replicas serve less than ``--target`` times one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import engine_server as eng  # noqa: E402  (the engine tests' server: start, wait on /health, stop)


def bench(artifact: Path, port: int, env: dict[str, str], workers: int, opts, out: Path) -> dict:
    """`qvl bench-serve --emulate --workers N` against ``port``: vLLM's own `vllm bench serve`, its result file."""
    cmd = [sys.executable, "-m", "qwenvl_rbln", "bench-serve", str(artifact), "--emulate", "--port", str(port)]
    cmd += ["--served-model-name", "engine", "--num-prompts", str(opts.prompts), "--input-len", "32"]
    cmd += ["--output-len", str(opts.output_len), "--workers", str(workers), "--"]
    cmd += ["--ignore-eos", "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"bench-serve failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return json.loads(out.read_text())


def row(name: str, result: dict) -> dict:
    return {
        "run": name,
        "concurrency": result["max_concurrency"],
        "completed": result["completed"],
        "failed": result.get("failed", 0),
        "req_per_s": round(result["request_throughput"], 3),
        "out_tok_per_s": round(result["output_throughput"], 2),
        "median_ttft_ms": round(result["median_ttft_ms"], 1),
        "p99_ttft_ms": round(result["p99_ttft_ms"], 1),
    }


def router(port: int, engines: list[int], policy: str, env: dict[str, str]) -> subprocess.Popen:
    exe = shutil.which("vllm-router", path=env["PATH"])
    cmd = [exe, "--host", "127.0.0.1", "--port", str(port), "--worker-urls"]
    cmd += [f"http://127.0.0.1:{p}" for p in engines]
    cmd += ["--policy", policy, "--prometheus-port", str(eng.free_port()), "--worker-startup-check-interval", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not eng.Server(proc, port, Path(os.devnull), env).healthy():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"the {policy} router did not come up")
        time.sleep(0.5)
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hold-ms", type=int, default=1000, help="QVL_EMULATE_CALL_MS: each graph call's device hold")
    ap.add_argument("--prompts", type=int, default=16, help="requests per measurement")
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--target", type=float, default=1.8, help="the least two replicas / one that passes")
    ap.add_argument("--policies", default="power_of_two,round_robin,cache_aware")
    opts = ap.parse_args()
    why = eng.installed()
    if why:
        raise SystemExit(why)
    with tempfile.TemporaryDirectory(prefix="qvl-bench-fleet-") as tmp:
        root = Path(tmp)
        os.environ["QVL_HOME"] = str(root / "home")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        artifact = eng.compile_artifact(root)
        hold = {"QVL_EMULATE_CALL_MS": str(opts.hold_ms)}
        rows = []
        with eng.serving(artifact, root, "--workers", "2", env=hold, ports=4) as fleet:
            engines = [fleet.port + 1, fleet.port + 2]
            rows.append(
                row("one replica (engine-0 alone)", bench(artifact, engines[0], fleet.env, 1, opts, root / "one.json"))
            )
            rows.append(
                row(
                    "two replicas (router, power_of_two)",
                    bench(artifact, fleet.port, fleet.env, 2, opts, root / "two.json"),
                )
            )
            for policy in [p for p in opts.policies.split(",") if p and p != "power_of_two"]:
                port = eng.free_port()
                proc = router(port, engines, policy, fleet.env)
                try:
                    rows.append(
                        row(
                            f"two replicas (router, {policy})",
                            bench(artifact, port, fleet.env, 2, opts, root / f"{policy}.json"),
                        )
                    )
                finally:
                    proc.terminate()
                    proc.wait(timeout=60)
        ratio = rows[1]["req_per_s"] / rows[0]["req_per_s"]
        print(
            json.dumps(
                {"hold_ms": opts.hold_ms, "prompts": opts.prompts, "rows": rows, "ratio": round(ratio, 2)}, indent=1
            )
        )
        print("\n| run | concurrency | completed | failed | req/s | out tok/s | median TTFT ms | p99 TTFT ms |")
        print("|---|---|---|---|---|---|---|---|")
        keys = (
            "run",
            "concurrency",
            "completed",
            "failed",
            "req_per_s",
            "out_tok_per_s",
            "median_ttft_ms",
            "p99_ttft_ms",
        )
        for r in rows:
            print("| " + " | ".join(str(r[k]) for k in keys) + " |")
        print(f"\nthroughput ratio, two replicas / one: {ratio:.2f}x (emulated, hold {opts.hold_ms} ms per graph call)")
        if ratio < opts.target:
            raise SystemExit(f"below the target: {ratio:.2f}x < {opts.target}x")


if __name__ == "__main__":
    main()
