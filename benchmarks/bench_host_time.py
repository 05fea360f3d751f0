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
SLEEP = "<built-in method time.sleep>"  # inside the emulator: the holds (device time)
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


def _kind(path: str) -> str:
    if EMULATOR in path:
        return "emulator"
    return "qvl" if any(q in path for q in QVL) else "host"


def costs(path: Path) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """(seconds by category: device, emulator, qvl, host; own time by (category, function)). A built-in's own time
    is split over its callers (pstats keeps it per caller) and counted where they are: ``time.sleep`` called by the
    emulator is device time, ``torch.zeros`` called by qvl's packing is qvl's."""
    totals = dict.fromkeys(("device", "emulator", "qvl", "host"), 0.0)
    own: dict[tuple[str, str], float] = {}
    for func, (_cc, _nc, tt, _ct, callers) in pstats.Stats(str(path)).stats.items():  # type: ignore[attr-defined]
        parts = [(c, v[2]) for c, v in callers.items()] if func[0] == "~" and callers else [(func, tt)]
        for where, t in parts:
            kind = _kind(where[0])
            if func[2] == SLEEP and kind == "emulator":
                kind = "device"
            name = _where(func) if func[0] != "~" else f"{func[2]} called by {_where(where)}"
            totals[kind] += t
            own[(kind, name)] = own.get((kind, name), 0.0) + t
    return totals, own


def top(path: Path, n: int = 5) -> None:
    totals, own = costs(path)
    host = totals["host"] + totals["qvl"]
    print(f"profiled steps: {sum(totals.values()):.2f} s; device holds {totals['device']:.2f} s, emulator "
          f"{totals['emulator']:.2f} s, host {host:.2f} s (qvl's own {totals['qvl']:.3f} s = "
          f"{totals['qvl'] / host:.1%} of host time)")  # fmt: skip
    print("| # | host cost (own time) | share of host time |\n|---|---|---|")
    ranked = sorted(((t, name) for (kind, name), t in own.items() if kind in ("host", "qvl")), reverse=True)
    for i, (t, name) in enumerate(ranked[:n], 1):
        print(f"| {i} | `{name}` | {t / host:.1%} |")
    print("qvl's own costs:")
    for t, name in sorted(((t, name) for (kind, name), t in own.items() if kind == "qvl"), reverse=True)[:6]:
        print(f"  {name}: {t / host:.2%}")


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
