"""The host's time per engine step, measured and profiled at device speed. **Emulated stack, real host time**: the
real vLLM + vllm-rbln over qvl's emulator at scale 1 (``--emulate-speed device``), every graph and sampler call
returning zeros and held for its device time under the roofline of Qwen3-VL-2B at the artifact's shapes; the host's
own work (vLLM's scheduler, vllm-rbln's runner, optimum-rbln's host side, qvl's patches) runs at this CPU's speed.

    python benchmarks/bench_host_time.py measure ART --out host-ART.json       # the host time per step, fitted
    python benchmarks/bench_host_time.py profile ART --out profile-ART.pstats  # cProfile of the engine steps
    python benchmarks/bench_host_time.py top profile-ART.pstats                # the five largest host costs

``measure`` is ``qvl bench-serve --emulate --emulate-speed device`` (a burst of text and image requests,
``--ignore-eos``); ``profile`` is the same run with ``QVL_STEP_PROFILE`` set, so the engine core profiles every
step (cProfile slows the host roughly twofold: the shares, not the times, are what it gives). ``top`` reads the
profile: the holds (``time.sleep``: device time) and the emulator's own work are taken out, the rest is the host's;
its five largest costs by own time, and qvl's own share (the decode sort, the ViT packing patch, the step log).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL = "roofline:Qwen/Qwen3-VL-2B-Instruct"
DEVICE = ("{built-in method time.sleep}",)  # the holds
EMULATOR = "qwenvl_rbln/backends/emulator/"
QVL = ("qwenvl_rbln/serving/decode_sort.py", "qwenvl_rbln/backends/vit_packing.py", "qwenvl_rbln/serving/step_log.py")


def bench(art: str, opts: argparse.Namespace, env: dict[str, str]) -> dict:
    cmd = [sys.executable, "-m", "qwenvl_rbln", "bench-serve", art, "--emulate", "--json", "--emulate-speed", "device"]
    cmd += ["--time-model", MODEL, "--num-prompts", str(opts.prompts), "--input-len", str(opts.input_len)]
    cmd += ["--output-len", str(opts.output_len), "--", "--ignore-eos", "--random-mm-num-mm-items-range-ratio", "1"]
    load = os.getloadavg()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, **env})
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise SystemExit(f"qvl bench-serve failed ({done.returncode}): {done.stderr[-3000:]}")
    doc = json.loads(done.stdout)
    doc["loadavg_before"] = load
    return doc


def _where(func: tuple[str, int, str]) -> str:
    path, line, name = func
    return name if path == "~" else f"{path.split('site-packages/')[-1].split('wt-devspeed/')[-1]}:{line}({name})"


def top(path: Path, n: int = 5) -> None:
    stats = pstats.Stats(str(path))
    rows = stats.stats  # type: ignore[attr-defined]
    own = {f: v[2] for f, v in rows.items()}  # tottime
    device = sum(t for f, t in own.items() if _where(f) in DEVICE)
    emulator = sum(t for f, t in own.items() if EMULATOR in f[0])
    total = sum(own.values())
    host = total - device - emulator
    qvl = sum(t for f, t in own.items() if any(q in f[0] for q in QVL))
    cum = {_where(f): v[3] for f, v in rows.items() if any(q in f[0] for q in QVL)}
    print(f"profiled steps: {total:.2f} s in all; device holds {device:.2f} s, emulator {emulator:.2f} s, "
          f"host {host:.2f} s")  # fmt: skip
    print("| # | host cost (own time) | share of host time |\n|---|---|---|")
    ranked = sorted(((t, f) for f, t in own.items() if _where(f) not in DEVICE and EMULATOR not in f[0]), reverse=True)
    for i, (t, f) in enumerate(ranked[:n], 1):
        print(f"| {i} | `{_where(f)}` | {t / host:.1%} |")
    print(f"qvl's own work (own time in {', '.join(QVL)}): {qvl / host:.2%} of host time")
    for name, t in sorted(cum.items(), key=lambda kv: -kv[1])[:6]:
        print(f"  cumulative {name}: {t / host:.2%} (includes what it calls)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("measure", "profile"):
        p = sub.add_parser(name)
        p.add_argument("artifact")
        p.add_argument("--out", required=True)
        p.add_argument("--prompts", type=int, default=16)
        p.add_argument("--input-len", type=int, default=64)
        p.add_argument("--output-len", type=int, default=32)
    t = sub.add_parser("top")
    t.add_argument("profile")
    opts = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if opts.cmd == "top":
        top(Path(opts.profile))
        return
    env = {"QVL_STEP_PROFILE": str(Path(opts.out).resolve())} if opts.cmd == "profile" else {}
    doc = bench(opts.artifact, opts, env)
    if opts.cmd == "measure":
        Path(opts.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps({"valid": doc["valid"], "loadavg_before": doc["loadavg_before"],
                      "host_time": (doc.get("host_time") or {}).get("fit", {}).get("model")}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
