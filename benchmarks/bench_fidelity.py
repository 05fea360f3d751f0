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

At real speed (``device``, issue 46): the same engine at scale 1 (``--emulate-speed device``: nothing computed, the
host's time real) on a realistic mix (``MIX``), predicted with host time from a separate calibration run of the
same artifact (another seed, three rates): its fitted ``HostTimeModel``, the API server's time per request before
the scheduler (by images) and the emulator's overshoot per step; beside it the steps-only and host-free predictions.

    python benchmarks/bench_fidelity.py device ART --out dev-ART.json [--prompts 48 --calibration-prompts 24]
    python benchmarks/bench_fidelity.py device-table dev-*.json
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
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
# device speed (issue 46): prompts of 500-2,000 text tokens and 32-128 output tokens (1,250 and 80 +- 60 %), 0-2
# images per request (1 +- 1), each sized by qvl bench-serve to the artifact's ViT bucket (1,024 patches here)
MIX = ("--random-range-ratio", "0.6", "--random-mm-base-items-per-request", "1", "--random-mm-num-mm-items-range-ratio",
       "1", "--random-mm-limit-mm-per-prompt", '{"image": 2, "video": 0}')  # fmt: skip


def bench_argv(art: Path, opts: argparse.Namespace, rates: list[float], seed: int | None = None) -> list[str]:
    """``qvl bench-serve``'s argv: the timed emulator at ``opts.scale`` (CPU speed), or with ``opts.device`` at
    device speed (scale 1: nothing computed, the host's time real) with the realistic mix (``MIX``)."""
    cmd = [sys.executable, "-m", "qwenvl_rbln", "bench-serve", str(art), "--emulate", "--json"]
    cmd += ["--time-model", f"roofline:{MODEL}"]
    cmd += ["--emulate-speed", "device"] if opts.device else ["--time-scale", str(opts.scale)]
    cmd += ["--num-prompts", str(opts.prompts), "--input-len", str(opts.input_len)]
    cmd += ["--output-len", str(opts.output_len), "--seed", str(opts.seed if seed is None else seed)]
    cmd += [w for r in rates for w in ("--request-rate", repr(r))]
    if opts.device:
        return [*cmd, "--", *MIX, "--ignore-eos"]
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


# ------------------------------------------------------------------------------------ at real speed (device speed)

DEVICE_FIGURES = (("ttft", 50), ("ttft", 90), ("tpot", 50), ("tpot", 90), ("throughput", 0))


def bench(cmd: list[str]) -> dict[str, Any]:
    """One ``qvl bench-serve`` (its own server), with the load average before and after it."""
    before = os.getloadavg()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise SystemExit(f"qvl bench-serve failed ({done.returncode}): {done.stderr[-3000:]}")
    doc = json.loads(done.stdout)
    doc["loadavg"] = {"before": before, "after": os.getloadavg()}
    return doc


def predicted(engine: Any, model: Any, host: Any, reqs: list[tuple[int, tuple[int, ...]]], arrivals: list[float],
              outs: list[int], lead: float = 0.0, front: dict[int, float] | None = None) -> dict[str, Any]:  # fmt: skip
    """The simulator's p50/p90 TTFT and TPOT (ms) and output throughput, each step charged ``host``'s time; each
    request reaching the scheduler ``front[its images]`` seconds after it was sent (the API server's own work)."""
    from qwenvl_rbln.tuning.capacity import percentile
    from qwenvl_rbln.tuning.simulate import Request, simulate

    delay = [(front or {}).get(len(v), 0.0) for _, v in reqs]
    requests = [Request(a + d, p, o, v) for a, d, (p, v), o in zip(arrivals, delay, reqs, outs, strict=True)]
    trace = simulate(engine, model, requests, host=host)
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival, i))  # simulate's record order
    ttfts = [0.0] * len(requests)
    for rec, i in zip(trace.records, order, strict=True):
        ttfts[i] = rec.ttft + delay[i]
    tpots = [t for r in trace.records if (t := r.tpot) is not None]
    duration = max(r.finish for r in trace.records) - min(arrivals)
    out = {f"{k}_p{q}": percentile(ttfts if k == "ttft" else tpots, q) * 1e3 for k, q in DEVICE_FIGURES if q}
    return {**out, "throughput": sum(outs) / (duration + lead), "requests_per_s": len(requests) / duration,
            "npu_busy_share": trace.npu_busy_share, "ttfts": ttfts}  # fmt: skip


def front_end(engine: Any, model: Any, host: Any, reqs: list[tuple[int, tuple[int, ...]]], run: dict[str, Any]
              ) -> dict[int, float]:  # fmt: skip
    """The API server's own time before a request reaches the scheduler (HTTP, the image decoding and HF processor,
    tokenising), by images per request: the median of measured TTFT less the simulator's, over the calibration's
    lightest run (little queueing there for the two to disagree on)."""
    raw = run["raw"]
    starts = raw["start_times"]
    outs = [int(o) for o in raw["output_lens"]]
    sim = predicted(engine, model, host, reqs, [t - min(starts) for t in starts], outs)["ttfts"]
    by: dict[int, list[float]] = {}
    for (_, v), meas, got in zip(reqs, raw["ttfts"], sim, strict=True):
        by.setdefault(len(v), []).append(meas - got)
    return {k: max(0.0, statistics.median(x)) for k, x in sorted(by.items())}


def own_fit(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The host time a measured run's own steps fit (for the report only: never given to its prediction)."""
    from qwenvl_rbln.serving.step_log import Step
    from qwenvl_rbln.tuning import host_measure

    got = [Step.from_dict(s) for s in steps]
    return host_measure.fit(got, "the run's own steps", {}).to_dict()


def run_device(opts: argparse.Namespace) -> None:
    """Fidelity at scale 1: a calibration run (another seed) fits the host time; the measured runs are predicted
    with it and without it (host-free)."""
    from qwenvl_rbln.tuning.device_time import time_model_for_artifact
    from qwenvl_rbln.tuning.host_time import HOST_FREE, HostTimeModel
    from qwenvl_rbln.tuning.simulate import engine_for_artifact

    art = Path(opts.artifact).resolve()
    model = time_model_for_artifact(art, model=MODEL)
    engine, _ = engine_for_artifact(art)
    # calibration: another seed's requests at the same load fractions of the capacity a rough guess of the host
    # time predicts (the provisional 3 ms per decode step, 4 ms per prefill): a burst would crowd the API server's
    # image processing onto the two cores and overstate every step
    guess_host = HostTimeModel(prefill_base_s=4e-3, decode_base_s=3e-3, source="a guess, for the rates only")
    cal_opts = argparse.Namespace(**{**vars(opts), "prompts": opts.calibration_prompts, "seed": opts.calibration_seed})
    cal_samples = vllm_samples(art, cal_opts)
    cal_reqs, cal_outs = lm_requests(art, cal_samples), [int(s.expected_output_len) for s in cal_samples]
    guess = predicted(engine, model, guess_host, cal_reqs, [0.0] * len(cal_reqs), cal_outs)["requests_per_s"]
    cal = bench(bench_argv(art, cal_opts, [round(f * guess, 3) for f in LOADS]))
    if not cal["valid"] or not (cal.get("host_time") or {}).get("fit", {}).get("kinds"):
        raise SystemExit(f"the calibration run is invalid or fitted nothing: {json.dumps(cal['runs'][0]['calls'])}")
    host = HostTimeModel.from_json(cal["host_time"]["fit"]["model"])
    # the emulator's own distortion, measured there too: each hold's wall time past its model time (the sleep's
    # overshoot, the zeros), which the step log counts as device time; charged to every simulated step
    held = sum(st["device_s"] for r in cal["runs"] for st in r["steps"])
    overshoot = max(
        0.0, (held - sum(r["calls"]["device_s"] for r in cal["runs"])) / sum(len(r["steps"]) for r in cal["runs"])
    )
    timed_engine = dataclasses.replace(engine, step_overhead_s=overshoot)
    front = front_end(timed_engine, model, host, cal_reqs, cal["runs"][0])
    samples = vllm_samples(art, opts)
    reqs = lm_requests(art, samples)
    outs = [int(s.expected_output_len) for s in samples]
    zero = [0.0] * len(reqs)
    capacity = predicted(timed_engine, model, host, reqs, zero, outs)["requests_per_s"]
    free_capacity = predicted(engine, model, HOST_FREE, reqs, zero, outs)["requests_per_s"]
    rates = [round(f * capacity, 3) for f in LOADS]
    print(f"{art.name}: capacity {capacity:.2f} req/s with host time ({free_capacity:.2f} host-free); rates {rates}",
          flush=True)  # fmt: skip
    doc = bench(bench_argv(art, opts, rates))
    rows = []
    for load, r in zip(LOADS, doc["runs"], strict=True):
        raw = r["raw"]
        starts = raw["start_times"]
        arrivals = [s - min(starts) for s in starts]
        outs_run = [int(o) for o in raw["output_lens"]]  # --ignore-eos: the sampled lengths (the run's own if not)
        ends = [s + t + sum(i) for s, t, i in zip(starts, raw["ttfts"], raw["itls"], strict=True)]
        lead = max(0.0, r["duration_s"] - (max(ends) - min(starts)))
        measured = {f"{k}_p{q}": r[f"p{q}_{k}_ms"] for k, q in DEVICE_FIGURES if q}
        rows.append({"load": load, "rate": r["rate"], "valid": r["valid"], "calls": r["calls"],
                     "emulator_share": r["emulator_share"], "steps": len(r["steps"]),
                     "measured": {**measured, "throughput": r["output_throughput"]},
                     "predicted_host": predicted(timed_engine, model, host, reqs, arrivals, outs_run, lead, front),
                     "predicted_steps": predicted(timed_engine, model, host, reqs, arrivals, outs_run, lead),
                     "predicted_free": predicted(engine, model, HOST_FREE, reqs, arrivals, outs_run, lead),
                     "outputs_as_sampled": outs_run == outs,
                     "lead_s": lead, "raw": raw, "own_host_fit": own_fit(r["steps"])})  # fmt: skip
    result = {"artifact": art.name, "batch": engine.batch, "chunk": engine.chunk, "graphs": engine.graphs,
              "time_model": doc["time_model"], "scale": doc["time_scale"], "speed": doc["speed"],
              "prompts": opts.prompts, "seed": opts.seed, "calibration_seed": opts.calibration_seed,
              "calibration": {"prompts": opts.calibration_prompts, "valid": cal["valid"], "loadavg": cal["loadavg"],
                              "rates": [r["rate"] for r in cal["runs"]], "host_time": cal["host_time"],
                              "raw": [r["raw"] for r in cal["runs"]], "front_end_s": front,
                              "steps": [r["steps"] for r in cal["runs"]],
                              "hold_overshoot_s_per_step": overshoot},
              "host_model": host.to_json(), "capacity_rps": capacity, "capacity_free_rps": free_capacity,
              "loadavg": doc["loadavg"], "lm_tokens": [p for p, _ in reqs], "images": [len(v) for _, v in reqs],
              "outputs": outs, "rows": rows}  # fmt: skip
    Path(opts.out).write_text(json.dumps(result, indent=1))
    device_table([Path(opts.out)])


def device_table(files: list[Path]) -> None:
    """The real-speed table (markdown): per run and figure, measured / predicted with host time (steps and the API
    server's front end) and its error; the errors of the steps-only and the host-free predictions beside it."""
    heads = {"ttft_p50": "TTFT p50", "ttft_p90": "TTFT p90", "tpot_p50": "TPOT p50", "tpot_p90": "TPOT p90",
             "throughput": "out tok/s"}  # fmt: skip
    print("| artifact | load (req/s) | valid | load avg | " + " | ".join(heads.values()) + " |")
    print("|---|---|---|---|" + "---|" * len(heads))
    errs: dict[str, list[float]] = {"host": [], "steps": [], "free": []}
    for f in files:
        d = json.loads(f.read_text())
        for i, row in enumerate(d["rows"]):
            m, cells = row["measured"], []
            for k in heads:
                e = {c: err(row[f"predicted_{c}"][k], m[k]) for c in errs if f"predicted_{c}" in row}
                for c, v in e.items():
                    errs[c].append(v)
                cells.append(
                    f"{m[k]:.1f} / {row['predicted_host'][k]:.1f} ({e['host']:.0%}; "
                    + (f"steps {e['steps']:.0%}; " if "steps" in e else "")
                    + f"free {e['free']:.0%})"
                )
            name = f"b{d['batch']}, chunk {d['chunk']}, graphs {list(d['graphs'])}" if i == 0 else ""
            load = "/".join(f"{x:.1f}" for x in d["loadavg"]["before"])
            print(f"| {name} | {row['load']:.0%} ({row['rate']:g}) | {'yes' if row['valid'] else 'NO'} | {load} | "
                  + " | ".join(cells) + " |")  # fmt: skip
    for c, label in (("host", "with host time"), ("steps", "steps only"), ("free", "host-free")):
        v = errs[c]
        if v:
            print(f"{label}: median |err| {statistics.median(v):.1%}, max {max(v):.1%}, over 15 %: "
                  f"{sum(e > 0.15 for e in v)} of {len(v)}")  # fmt: skip


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


def _run_args(p: argparse.ArgumentParser, *, prompts: int, input_len: int, output_len: int) -> argparse.ArgumentParser:
    """The arguments both measured modes take: the artifact, the output file, the requests and the seed."""
    p.add_argument("artifact")
    p.add_argument("--out", required=True)
    p.add_argument("--prompts", type=int, default=prompts)
    p.add_argument("--input-len", type=int, default=input_len)
    p.add_argument("--output-len", type=int, default=output_len)
    p.add_argument("--seed", type=int, default=0)
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = _run_args(sub.add_parser("run"), prompts=24, input_len=200, output_len=24)
    r.add_argument("--scale", type=float, default=200.0)
    d = sub.add_parser("device", help="at scale 1 (--emulate-speed device), host time calibrated apart")
    _run_args(d, prompts=48, input_len=1250, output_len=80)
    d.add_argument("--calibration-seed", type=int, default=1)
    d.add_argument("--calibration-prompts", type=int, default=24)
    t = sub.add_parser("table")
    t.add_argument("files", nargs="+")
    t = sub.add_parser("device-table")
    t.add_argument("files", nargs="+")
    opts = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    opts.device = opts.cmd == "device"
    if opts.cmd == "run":
        run(opts)
    elif opts.cmd == "device":
        run_device(opts)
    elif opts.cmd == "device-table":
        device_table([Path(f) for f in opts.files])
    else:
        table([Path(f) for f in opts.files])


if __name__ == "__main__":
    main()
