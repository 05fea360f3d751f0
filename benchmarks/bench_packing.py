"""ViT packing: what `qvl bucket-plan` says it saves, and what the emulated ViT takes on the CPU.

Part 1 (pure planning, no torch): preset rebel100-1npu-vit-buckets (ViT buckets [1024, 3136, 16384],
Qwen3-VL-2B FLOPs), unpacked (`--no-vit-packing`, today's optimum-rbln) against packed:
  (a) one 5-minute 1280x720 30 fps video (2 fps sampling, default video pixel cap -> 300 temporal patches);
  (b) 8 images of 320x240 in one request;
  (c) a COCO-like mix of single-image requests (seeded sizes; every request one image: nothing to pack).

Part 2 (`--cpu`, needs torch + optimum-rbln; emulated, no NPU): the tiny Qwen3-VL compiled with
`qvl compile --emulate --preset cpu-tiny-rbln --set visual.max_seq_len=[1024,3136]` (the video's 128-patch
segments land in the 1024 bucket, as on the real preset; the 16384 bucket is left out because the tiny
model's (a) never uses it and its [16384, 16384] mask costs 1 GiB to trace), then `model.visual(pixel_values,
grid_thw=[[300, 8, 16]])` (workload (a)) timed packed and unpacked, alternating, with the outputs compared.

Usage: python benchmarks/bench_packing.py [--cpu] [--rounds N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PRESET = "rebel100-1npu-vit-buckets"
VIDEO = {"width": 1280, "height": 720, "frames": 9000, "fps": 30}
IMAGES = {"width": 320, "height": 240, "images": 8}
# COCO-like: most images 640 px on the long side, a few other sizes; seeded counts.
COCO_SIZES = [(640, 480), (640, 427), (480, 640), (640, 426), (500, 375), (427, 640), (640, 360), (612, 612)]


def coco_lines(seed: int = 2017) -> list[dict]:
    rng = random.Random(seed)
    lines = [{"width": w, "height": h, "count": rng.randint(200, 2000)} for w, h in COCO_SIZES]
    lines += [{"width": rng.randint(200, 640), "height": rng.randint(200, 640), "count": 1} for _ in range(300)]
    return lines


def plan(lines: list[dict], packing: bool) -> dict:
    from qwenvl_rbln.jobs.bucket_plan_job import run_bucket_plan

    with tempfile.TemporaryDirectory() as d:
        wl = Path(d) / "w.jsonl"
        wl.write_text("".join(json.dumps(x) + "\n" for x in lines))
        data, _ = run_bucket_plan(
            preset=PRESET,
            sets=None,
            model=None,
            inputs=None,
            sizes=None,
            workload=wl,
            optimize=None,
            max_bucket=None,
            batch_trace=None,
            optimize_decoder=None,
            vit_packing=packing,
        )
    return data["summary"]


def planning() -> dict:
    out = {}
    for name, lines in (
        ("a_video_5min_720p", [VIDEO]),
        ("b_8_images_one_request", [IMAGES]),
        ("c_coco_like", coco_lines()),
    ):
        t = time.perf_counter()
        off, on = plan(lines, False), plan(lines, True)
        p = on["packed"]
        out[name] = {
            "requests": off["requests"],
            "unpacked": {
                "vit_calls": off["vit_calls"],
                "executed_flops": off["executed_flops"],
                "executed_over_useful": off["executed_over_useful"],
                "attn_mask_bytes": p["unpacked_attn_mask_bytes"],
            },
            "packed": {k: p[k] for k in ("vit_calls", "executed_flops", "executed_over_useful", "attn_mask_bytes")},
            "flops_ratio": round(p["executed_flops"] / off["executed_flops"], 4) if off["executed_flops"] else None,
            "plan_s": round(time.perf_counter() - t, 3),
        }
    return out


def cpu_wall(rounds: int) -> dict:
    """Emulated ViT of the tiny model on workload (a): packed vs unpacked wall time (see the module docstring)."""
    env = {**os.environ, "QVL_EMULATE_NPU": "1", "COLUMNS": "200"}
    with tempfile.TemporaryDirectory() as d:
        art = Path(d) / "tiny"
        cmd = [sys.executable, "-m", "qwenvl_rbln", "compile", "--preset", "cpu-tiny-rbln"]
        cmd += ["--set", "visual.max_seq_len=[1024,3136]", "-o", str(art)]
        subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=REPO)
        import torch

        from qwenvl_rbln.backends import emulator, vit_packing
        from qwenvl_rbln.backends.rbln import optimum as rbln

        emulator.activate()
        model = rbln.load_model(art, 0, 0)
        visual = model.visual
        log = vit_packing.install_on_instance(visual)
        gen = torch.Generator().manual_seed(0)
        grid = torch.tensor([[300, 8, 16]])  # (a): 300 temporal patches of 8x16 = 128 patches
        pixels = torch.randn(300 * 128, 3 * 2 * 16 * 16, generator=gen)
        times: dict[bool, list[float]] = {True: [], False: []}
        outs = {}
        for _ in range(rounds):
            for packed in (True, False):
                visual.__dict__["_qvl_vit_packing"] = packed
                t = time.perf_counter()
                with torch.no_grad():
                    outs[packed] = visual(pixels, grid)
                times[packed].append(time.perf_counter() - t)
        calls = {e["packed"]: e["graph_calls"] for e in log.drain()}
        diff = max(
            (outs[True][0] - outs[False][0]).abs().max().item(),
            *((a - b).abs().max().item() for a, b in zip(outs[True][1], outs[False][1], strict=True)),
        )
        emulator.deactivate()
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return {
        "emulated": True,
        "rounds": rounds,
        "graph_calls": {"packed": calls.get(True), "unpacked": calls.get(False)},
        "median_s": {"packed": round(med[True], 3), "unpacked": round(med[False], 3)},
        "speedup": round(med[False] / med[True], 2),
        "max_abs_diff": diff,
        "dtype": str(outs[True][0].dtype),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="also time the emulated tiny ViT on (a) (needs torch)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} CPU, Python {platform.python_version()}"}
    result["planning"] = planning()
    if a.cpu:
        result["cpu_emulated_vit_a"] = cpu_wall(a.rounds)
    if a.json:
        print(json.dumps(result, indent=2))
        return 0
    for name, r in result["planning"].items():
        u, p = r["unpacked"], r["packed"]
        print(
            f"{name}: {r['requests']:,} request(s): ViT calls {u['vit_calls']:,} -> {p['vit_calls']:,}; "
            f"executed/useful {u['executed_over_useful']}x -> {p['executed_over_useful']}x; "
            f"FLOPs x{r['flops_ratio']}; mask {u['attn_mask_bytes'] / 2**20:.1f} MiB -> "
            f"{p['attn_mask_bytes'] / 2**20:.1f} MiB"
        )
    if a.cpu:
        c = result["cpu_emulated_vit_a"]
        print(
            f"emulated tiny ViT, (a): {c['graph_calls']['unpacked']} -> {c['graph_calls']['packed']} graph calls, "
            f"median {c['median_s']['unpacked']} s -> {c['median_s']['packed']} s (x{c['speedup']}), "
            f"max |packed - unpacked| {c['max_abs_diff']:.2e} ({c['dtype']})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
