"""Fidelity of the serving simulator (``tuning.simulate``) against the real vLLM + vllm-rbln scheduler on the timed
emulator. **Emulated**: every graph call held for the device time of one named time model (the roofline of
Qwen3-VL-2B at the artifact's compiled shapes) times a scale; the CPU's own work runs inside each hold. What it
proves: the scheduling half (given the device times, the simulator predicts what vllm-rbln's scheduler does).
What it cannot: the device times themselves (``qvl profile`` on an NPU).

Per artifact (one locked engine run each, ``flock /tmp/qvl-engine.lock``):

1. the requests: vLLM's own random-mm sampler with bench-serve's arguments and seed (``vllm bench serve``'s
   ``get_samples``), images and text mixed (0 or 1 image per request, one image size per compiled ViT bucket), and
   each request's LM tokens counted by the artifact's own processor (chat template, image tokens, text);
2. predicted capacity: the simulator at an unbounded rate (all at once) on those requests;
3. measurement: ``qvl bench-serve --emulate --time-model roofline:... --time-scale N --request-rate r`` at about
   30 %, 60 % and 90 % of it: seeded Poisson arrivals, figures in device time;
4. prediction: the simulator on the same requests at the arrival times the benchmark actually sent them;
5. the old analytic estimate (docs/tuning.md's cost model: TTFT = the request's ViT + prefill chunks, TPOT = one
   decode step of the full batch, throughput = 1 / (prefill + output x step / batch)) beside it.

    python benchmarks/bench_fidelity.py run ART --out fidelity-ART.json [--scale 200 --prompts 24]
    python benchmarks/bench_fidelity.py table fidelity-*.json
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODEL = "Qwen/Qwen3-VL-2B-Instruct"
LOADS = (0.3, 0.6, 0.9)
FIGURES = (("ttft", "p50_ttft_ms"), ("tpot", "p50_tpot_ms"), ("throughput", "output_throughput"))


def bench_argv(art: Path, opts: argparse.Namespace, rates: list[float]) -> list[str]:
    cmd = [sys.executable, "-m", "qwenvl_rbln", "bench-serve", str(art), "--emulate", "--json"]
    cmd += ["--time-model", f"roofline:{MODEL}", "--time-scale", str(opts.scale), "--num-prompts", str(opts.prompts)]
    cmd += ["--input-len", str(opts.input_len), "--output-len", str(opts.output_len), "--seed", str(opts.seed)]
    cmd += [w for r in rates for w in ("--request-rate", repr(r))]
    return [*cmd, "--", "--random-mm-num-mm-items-range-ratio", "1", "--ignore-eos"]


def vllm_samples(art: Path, opts: argparse.Namespace) -> list[Any]:
    """The requests ``vllm bench serve`` sends: its own parser and sampler on bench-serve's argv, same seed."""
    import random

    import numpy as np

    from qwenvl_rbln.backends import emulator

    emulator.activate()  # vllm-rbln's platform plugin imports rebel with vLLM
    from vllm.benchmarks.serve import add_cli_args, get_samples
    from vllm.tokenizers import get_tokenizer

    cmd = [w for w in bench_argv(art, opts, []) if w != "--json"]
    cmd[cmd.index("--time-model") : cmd.index("--time-model") + 4] = []  # the same requests, no server
    cmd.insert(cmd.index("--"), "--dry-run")
    cmd.insert(cmd.index("--"), "--json")
    shown = subprocess.run(cmd, capture_output=True, text=True, check=True)
    argv = json.loads(shown.stdout)["argv"][3:]
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(argv)
    random.seed(args.seed)
    np.random.seed(args.seed)
    return get_samples(args, get_tokenizer(str(art)))


def lm_requests(art: Path, samples: list[Any]) -> list[tuple[int, tuple[int, ...]]]:
    """(LM input tokens, ViT buckets) per request, counted by the artifact's processor as vLLM's server does."""
    from PIL import Image
    from transformers import AutoProcessor

    from qwenvl_rbln.vision.buckets import select_bucket

    cfg = json.loads((art / "rbln_config.json").read_text())
    buckets = sorted(int(i[0][1][0]) for cc in cfg["visual"]["_compile_cfgs"] for i in cc["input_info"])
    proc = AutoProcessor.from_pretrained(str(art))
    out = []
    for s in samples:
        items = s.multi_modal_data or []
        items = items if isinstance(items, list) else [items]
        images = [Image.open(io.BytesIO(base64.b64decode(i["image_url"]["url"].split(",", 1)[1]))) for i in items]
        content = [{"type": "image"} for _ in images] + [{"type": "text", "text": s.prompt}]
        text = proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
        enc = proc(text=[text], images=images or None, return_tensors="pt")
        patches = [int(t * h * w) for t, h, w in enc["image_grid_thw"].tolist()] if images else []
        out.append((int(enc["input_ids"].shape[1]), tuple(select_bucket(p, buckets) for p in patches)))
    return out


def engine_of(art: Path) -> Any:
    from qwenvl_rbln.tuning.simulate import Engine

    c = json.loads((art / "rbln_config.json").read_text())
    return Engine(batch=c["batch_size"], chunk=c["prefill_chunk_size"], block_size=c["kvcache_block_size"],
                  num_blocks=c["kvcache_num_blocks"], max_model_len=c["max_seq_len"],
                  graphs=tuple(c.get("decoder_batch_sizes") or ()))  # fmt: skip


def simulated(engine: Any, model: Any, reqs: list[tuple[int, tuple[int, ...]]], arrivals: list[float], out: int,
              host_s: float = 0.0, lead: float = 0.0) -> dict[str, float]:  # fmt: skip
    """The simulator's figures; ``host_s``: host time per engine step (device seconds), 0 for a pure device run;
    ``lead``: seconds before the first arrival that the throughput's duration counts (vLLM's)."""
    import dataclasses

    from qwenvl_rbln.tuning.capacity import metrics
    from qwenvl_rbln.tuning.simulate import Request, simulate

    engine = dataclasses.replace(engine, step_overhead_s=host_s)
    trace = simulate(engine, model, [Request(a, p, out, v) for a, (p, v) in zip(arrivals, reqs, strict=True)])
    m = metrics(trace)
    tokens = sum(r.request.output for r in trace.records)
    return {"ttft": m["ttft"]["p50"] * 1e3, "tpot": m["tpot"]["p50"] * 1e3,
            "throughput": tokens / (m["duration_s"] + lead), "requests_per_s": m["requests_per_s"]}  # fmt: skip


def analytic(engine: Any, model: Any, reqs: list[tuple[int, tuple[int, ...]]], out: int) -> dict[str, float]:
    """docs/tuning.md's cost model, before the simulator: no queueing, every decode step at the full batch."""
    prefill = [sum(model.vit(b) for b in v) + model.prompt(p, engine.chunk) for p, v in reqs]
    context = statistics.mean(p for p, _ in reqs) + out / 2
    step = model.decode(max(engine.decoder_graphs()), int(context))
    per_request = statistics.mean(prefill) + out * step / engine.batch
    return {"ttft": statistics.median(prefill) * 1e3, "tpot": step * 1e3, "throughput": out / per_request}


def run(opts: argparse.Namespace) -> None:
    from qwenvl_rbln.tuning.device_time import time_model_for_artifact

    art = Path(opts.artifact).resolve()
    model = time_model_for_artifact(art, model=MODEL)
    engine = engine_of(art)
    reqs = lm_requests(art, vllm_samples(art, opts))
    saturation = simulated(engine, model, reqs, [0.0] * len(reqs), opts.output_len)["requests_per_s"]
    rates = [round(f * saturation, 3) for f in LOADS]
    print(f"{art.name}: predicted capacity {saturation:.2f} req/s; rates {rates}", flush=True)
    done = subprocess.run(bench_argv(art, opts, rates), capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise SystemExit(f"qvl bench-serve failed ({done.returncode}): {done.stderr[-3000:]}")
    doc = json.loads(done.stdout)
    rows = []
    for load, r in zip(LOADS, doc["runs"], strict=True):
        raw, scale = r["raw"], doc["time_scale"]
        starts = raw["start_times"]
        arrivals = [(s - min(starts)) / scale for s in starts]
        ends = [s + t + sum(i) for s, t, i in zip(starts, raw["ttfts"], raw["itls"], strict=True)]
        # vLLM's duration runs from the benchmark's start, before its first (delayed) request: the same lead is
        # added to the simulated run's span (which starts at the first arrival) for a like-for-like throughput
        lead = max(0.0, r["duration_s"] - (max(ends) - min(starts)) / scale)
        rows.append({"load": load, "rate": r["rate"], "valid": r["valid"], "calls": r["calls"],
                     "measured": {k: r[f] for k, f in FIGURES},
                     "predicted": simulated(engine, model, reqs, arrivals, opts.output_len, lead=lead),
                     "predicted_host": simulated(engine, model, reqs, arrivals, opts.output_len,
                                                 r["calls"]["host_step_s"] / scale, lead=lead),
                     "lead_s": lead, "raw": raw,
                     "analytic": analytic(engine, model, reqs, opts.output_len)})  # fmt: skip
    result = {"artifact": art.name, "batch": engine.batch, "chunk": engine.chunk, "graphs": engine.graphs,
              "time_model": doc["time_model"], "scale": doc["time_scale"], "prompts": opts.prompts,
              "input_len": opts.input_len, "output_len": opts.output_len, "seed": opts.seed,
              "capacity_rps": saturation, "images": sum(1 for _, v in reqs if v), "rows": rows}  # fmt: skip
    Path(opts.out).write_text(json.dumps(result, indent=1))
    table([Path(opts.out)])


def err(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas if meas else math.inf


def table(files: list[Path]) -> None:
    """The fidelity table (markdown): per run the measured figure, the simulator's (device time only, and with the
    run's measured host time per step), and the old estimate's error; then the medians."""
    heads = {"ttft": "TTFT p50 ms", "tpot": "TPOT p50 ms", "throughput": "output tok/s"}
    print("| artifact | load | valid (overruns/calls) | host/step | "
          + " | ".join(f"{heads[k]}: meas / sim / err / +host err / old err" for k, _ in FIGURES) + " |")  # fmt: skip
    print("|---|---|---|---|" + "---|" * len(FIGURES))
    errs: dict[str, dict[str, list[float]]] = {c: {k: [] for k, _ in FIGURES} for c in ("sim", "host", "old")}
    for f in files:
        d = json.loads(f.read_text())
        for row in d["rows"]:
            m, cells = row["measured"], []
            for k, _ in FIGURES:
                for c, key in (("sim", "predicted"), ("host", "predicted_host"), ("old", "analytic")):
                    errs[c][k].append(err(row[key][k], m[k]))
                cells.append(f"{m[k]:.3f} / {row['predicted'][k]:.3f} / {errs['sim'][k][-1]:.1%} / "
                             f"{errs['host'][k][-1]:.1%} / {errs['old'][k][-1]:.0%}")  # fmt: skip
            calls = row["calls"]
            mark = f"{'yes' if row['valid'] else 'NO'} ({calls['overruns']}/{calls['calls']})"
            host = f"{calls['host_step_s'] * 1e3:.0f} ms wall"
            name = f"{d['artifact']} (b{d['batch']}, chunk {d['chunk']})"
            print(
                f"| {name} | {row['load']:.0%} ({row['rate']:g} req/s) | {mark} | {host} | " + " | ".join(cells) + " |"
            )
    for c, label in (("sim", "simulator"), ("host", "simulator + host/step"), ("old", "old analytic")):
        print(f"{label}: " + "; ".join(f"{k} median |err| {statistics.median(v):.1%}, max {max(v):.1%}"
                                       for k, v in errs[c].items() if v))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("artifact")
    r.add_argument("--out", required=True)
    r.add_argument("--scale", type=float, default=200.0)
    r.add_argument("--prompts", type=int, default=24)
    r.add_argument("--input-len", type=int, default=200)
    r.add_argument("--output-len", type=int, default=24)
    r.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("table")
    t.add_argument("files", nargs="+")
    opts = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if opts.cmd == "run":
        run(opts)
    else:
        table([Path(f) for f in opts.files])


if __name__ == "__main__":
    main()
