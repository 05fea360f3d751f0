"""The real engine on the emulated NPU: `qvl serve --emulate` start-up, then requests/s and TTFT with vLLM's own
`vllm bench serve`, at concurrency 1 and at the compiled batch, ViT packing on and off. **Emulated** figures: vLLM
0.22.0 + vllm-rbln v0.11.1a1 over qvl's CPU emulator of rebel, the tiny Qwen3-VL (`cpu-tiny-rbln --emulate`, batch
2); they measure the serving stack's overhead and the emulator's CPU time, never an NPU.

Each request carries three 320x240 images (320 + 288 + 324 patches: three ViT calls of bucket 1024 unpacked, one
packed) and a random text prompt; the benchmark command is `qvl bench-serve --emulate --dry-run`'s, with the
concurrency, the image mix and the request count set here.

    .venv/bin/python benchmarks/bench_engine_serve.py [--prompts 8] [--output-len 16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import engine_server as eng  # noqa: E402  (the engine tests' server: start, wait on /health, stop)

IMAGES = {"(320, 240, 1)": 1.0}  # vllm bench serve's random-mm bucket config: one size, three per request
PER_REQUEST = 3


def bench_command(
    artifact: Path, port: int, env: dict[str, str], concurrency: int, opts: argparse.Namespace
) -> tuple[list[str], dict[str, str]]:
    """`qvl bench-serve --emulate --dry-run`'s argv and environment, with the concurrency, the image mix and the
    count of this run."""
    cmd = [sys.executable, "-m", "qwenvl_rbln", "bench-serve", str(artifact), "--emulate", "--port", str(port)]
    cmd += ["--served-model-name", "engine", "--num-prompts", str(opts.prompts), "--input-len", "32"]
    cmd += ["--output-len", str(opts.output_len), "--dry-run", "--json"]
    shown = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
    argv = shown["argv"]
    swap = {
        "--max-concurrency": str(concurrency),
        "--random-mm-base-items-per-request": str(PER_REQUEST),
        "--random-mm-limit-mm-per-prompt": json.dumps({"image": PER_REQUEST, "video": 0}),
        "--random-mm-bucket-config": "{" + ", ".join(f"{k}: {v}" for k, v in IMAGES.items()) + "}",
    }
    for flag, value in swap.items():
        argv[argv.index(flag) + 1] = value
    full_env = {**env, **{k: v for k, v in shown["env"].items() if v is not None}}
    return argv, full_env


def run_bench(argv: list[str], env: dict[str, str], out: Path) -> dict:
    full = [*argv, "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    done = subprocess.run(full, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="requests per measurement")
    ap.add_argument("--output-len", type=int, default=16)
    opts = ap.parse_args()
    why = eng.installed()
    if why:
        raise SystemExit(f"{why}")
    with tempfile.TemporaryDirectory(prefix="qvl-bench-engine-") as tmp:
        root = Path(tmp)
        os.environ["QVL_HOME"] = str(root / "home")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        artifact = eng.compile_artifact(root)
        rows = []
        for packing in ("--vit-packing", "--no-vit-packing"):
            server = eng.start(artifact, root, packing)
            try:
                for concurrency in (1, 2):
                    before = server.graph_calls()
                    argv, env = bench_command(artifact, server.port, server.env, concurrency, opts)
                    result = run_bench(argv, env, root / f"bench-{packing}-{concurrency}.json")
                    vit_calls = (server.graph_calls() - before) / max(1, result["completed"])
                    rows.append((packing, concurrency, server.startup_s, result, vit_calls))
            finally:
                server.stop()
    print("emulated (qvl's CPU emulator, no NPU): tiny Qwen3-VL, batch 2, 3 images of 320x240 per request")
    for packing, concurrency, startup, r, calls in rows:
        print(
            f"{packing:17s} start-up {startup:5.1f} s  concurrency {concurrency}: {r['request_throughput']:.3f} req/s, "
            f"TTFT mean {r['mean_ttft_ms']:.0f} ms median {r['median_ttft_ms']:.0f} ms, completed {r['completed']}, "
            f"failed {r['failed']}, ViT calls per request {calls:.1f}"
        )


if __name__ == "__main__":
    main()
