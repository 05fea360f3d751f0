"""qvl's reference path against a bare transformers generate on the same request (target: within 5 %).

Both sides start from the image file and the prompt and end with the generated token ids, greedy, same
``max_new_tokens``, on the same loaded model (the offline tiny Qwen3-VL unless --model is given):

* bare: ``processor.apply_chat_template(messages, tokenize=True, ...)`` + ``model.generate(...)``;
* qvl backend: ``ReferenceBackend.run_batch`` (media decode, pixel caps, processor call, timing streamer
  with text streamed to /dev/null, ViT forward hooks, output split);
* qvl end to end: ``run_infer`` on a compiled cpu-tiny artifact (request parsing, header probing, plan and
  artifact checks, vision report, the above, result assembly); the model is cached after the warm-up run,
  so model loading is excluded on both sides.

Each round runs the three cases in a shuffled order (seeded), after one warm-up each; medians (and minima)
are reported, of wall time and of CPU time (``process_time``: with ``--threads 1`` it is the work done, not the
time spent waiting for a core another process holds). On a shared 2-CPU machine the round-to-round noise is a
few percent, so use --runs 40 or more.
The tiny model decodes a token in a few milliseconds, so any fixed per-token cost of qvl shows up here far
more than it would with Qwen3-VL-2B.

    .venv/bin/python benchmarks/bench_infer_overhead.py [--runs 15] [--tokens 64] [--image assets/demo.jpg]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def fixed_costs(opts: object, art: Path, plan: object, reps: int = 50) -> dict[str, float]:
    """qvl's own work outside generate, per request, timed in isolation (median ms): deterministic, unlike the
    end-to-end comparison on a busy machine."""
    import io

    import torch

    from qwenvl_rbln.inference.generation import TimingStreamer
    from qwenvl_rbln.inference.reference import ReferenceBackend
    from qwenvl_rbln.inference.runner import collect_requests
    from qwenvl_rbln.inference.target import resolve_target
    from qwenvl_rbln.inference.vision_report import plan_vision

    def med(fn: object) -> float:
        fn()
        t = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
        return round(statistics.median(t) * 1000, 3)

    target = resolve_target(opts.directory, None, [])
    reqs = collect_requests(opts)
    tok = ReferenceBackend(art, plan.processor).tokenizer

    def stream_64() -> None:
        s = TimingStreamer(tok, sink=io.StringIO())
        s.put(torch.tensor([[1]]))
        for i in range(64):
            s.put(torch.tensor([100 + i]))
        s.end()

    return {
        "requests_and_media_probe": med(lambda: collect_requests(opts)),
        "resolve_artifact_and_plan": med(lambda: resolve_target(opts.directory, None, [])),
        "vision_report": med(lambda: plan_vision(reqs, target.plan.processor, target.resolved.vit_buckets)),
        "backend_setup": med(lambda: ReferenceBackend(art, plan.processor).close()),
        "streaming_64_tokens": med(stream_64),
    }


def wide_model(path: Path, scale: int) -> Path:
    """The tiny Qwen3-VL widened ``scale`` times (random weights, same tokenizer and processor)."""
    from qwenvl_rbln.backends.tiny import model as tm
    from qwenvl_rbln.backends.tiny import weights as tw

    text, vision = dict(tw.TEXT_DIMS), dict(tw.VISION_DIMS)
    for key in ("hidden_size", "intermediate_size", "head_dim"):
        tw.TEXT_DIMS[key] = text[key] * scale
    tw.TEXT_DIMS["mrope_section"] = [v * scale for v in text["mrope_section"]]
    for key in ("hidden_size", "intermediate_size"):
        tw.VISION_DIMS[key] = vision[key] * scale
    try:
        return tm.create_tiny_model(path)
    finally:
        tw.TEXT_DIMS.clear()
        tw.TEXT_DIMS.update(text)
        tw.VISION_DIMS.clear()
        tw.VISION_DIMS.update(vision)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--image", default=str(REPO / "assets" / "demo.jpg"))
    ap.add_argument("--prompt", default="Describe this image.")
    ap.add_argument("--no-end-to-end", action="store_true", help="leave out the run_infer case")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (fixed for stable timings)")
    ap.add_argument(
        "--scale",
        type=int,
        default=1,
        help="widen the random model N times (hidden 64N, head_dim 16N; same depth): a request that costs more, "
        "as a real one does, so qvl's fixed per-request work is seen at a realistic share",
    )
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from qwenvl_rbln.backends.tiny.model import ensure_tiny_model
    from qwenvl_rbln.inference.generation import GenerationOptions
    from qwenvl_rbln.inference.reference import ReferenceBackend, load_reference
    from qwenvl_rbln.inference.requests import from_flags, validate_requests
    from qwenvl_rbln.inference.runner import InferOptions, run_infer
    from qwenvl_rbln.jobs.compile_job import run_compile
    from qwenvl_rbln.memory.planner import estimate_plan
    from qwenvl_rbln.planning.plan import build_plan

    tmp = Path(tempfile.mkdtemp(prefix="qvl-bench-"))
    model_dir = str(ensure_tiny_model()) if args.scale == 1 else str(wide_model(tmp / "model", args.scale))
    plan = build_plan("cpu-tiny", model=model_dir, output_dir=str(tmp / "cpu-tiny"))
    run_compile(plan, estimate_plan(plan), use_cache=False, heartbeat_s=0)
    art = tmp / "cpu-tiny"

    model, processor, _ = load_reference(art)  # the one model every path uses
    backend = ReferenceBackend(art, plan.processor)
    devnull = open(os.devnull, "w")  # noqa: SIM115 - lives for the whole run
    gen = GenerationOptions(max_new_tokens=args.tokens)
    opts = InferOptions(directory=art, images=[args.image], prompt=args.prompt, max_new_tokens=args.tokens)

    def bare() -> list[int]:
        messages = [
            {"role": "user", "content": [{"type": "image", "image": args.image}, {"type": "text", "text": args.prompt}]}
        ]
        inputs = processor.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=True, return_tensors="pt"
        )
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=args.tokens, do_sample=False)
        return out[0, inputs["input_ids"].shape[1] :].tolist()

    def qvl_backend() -> list[int]:
        reqs = validate_requests(from_flags(args.prompt, [args.image]))
        return backend.run_batch(reqs, gen, sink=devnull).rows[0].token_ids

    def qvl_end_to_end() -> list[int]:
        return run_infer(opts, stream=devnull)["requests"][0]["token_ids"]

    cases = {"bare transformers": bare, "qvl ReferenceBackend.run_batch": qvl_backend, "qvl run_infer": qvl_end_to_end}
    if args.no_end_to_end:
        del cases["qvl run_infer"]
    tokens = {name: fn() for name, fn in cases.items()}  # warm-up, and the outputs must agree
    if len({tuple(t) for t in tokens.values()}) != 1:
        raise SystemExit(f"outputs differ between paths: {tokens}")
    times: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}  # CPU seconds: immune to waiting for a busy core
    order = list(cases)
    rng = random.Random(0)
    for _ in range(args.runs):
        rng.shuffle(order)  # a fixed order lets whatever runs after a given case (cache, allocator) bias it
        for name in order:
            c0, t0 = time.process_time(), time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    fixed = fixed_costs(opts, art, plan)
    backend.close()
    devnull.close()
    shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(times["bare transformers"])
    bare_cpu = cpu["bare transformers"]
    result = {
        "model": "qvl tiny Qwen3-VL (random weights)" + (f", widened {args.scale}x" if args.scale > 1 else ""),
        "request": {
            "image": Path(args.image).name,
            "prompt": args.prompt,
            "new_tokens": len(tokens["bare transformers"]),
        },
        "runs": args.runs,
        "threads": args.threads,
        "median_s": {name: round(statistics.median(t), 4) for name, t in times.items()},
        "min_s": {name: round(min(t), 4) for name, t in times.items()},
        "overhead_pct": {
            name: round(100 * (statistics.median(t) - base) / base, 2)
            for name, t in times.items()
            if name != "bare transformers"
        },
        "overhead_pct_paired": {  # median over rounds of (case / bare in the same round) - 1: robust to drift
            name: round(
                100 * (statistics.median(a / b for a, b in zip(t, times["bare transformers"], strict=True)) - 1), 2
            )
            for name, t in times.items()
            if name != "bare transformers"
        },
        "overhead_pct_of_min": {
            name: round(100 * (min(t) - min(times["bare transformers"])) / min(times["bare transformers"]), 2)
            for name, t in times.items()
            if name != "bare transformers"
        },
        "cpu_median_s": {name: round(statistics.median(t), 4) for name, t in cpu.items()},
        "cpu_overhead_pct_paired": {  # the same paired ratio on CPU time (process_time, all threads)
            name: round(100 * (statistics.median(a / b for a, b in zip(t, bare_cpu, strict=True)) - 1), 2)
            for name, t in cpu.items()
            if name != "bare transformers"
        },
        "qvl_fixed_costs_ms": fixed,
        "torch": torch.__version__,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
