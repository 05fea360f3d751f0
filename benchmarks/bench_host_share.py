"""What host time means for users (issue 46, item 5): capacity under one SLO, with and without host time, and the NPU
busy share, for Qwen3-VL-2B, 8B and 32B at their Model Zoo presets; then the batch sizes that amortise the host.
**A prediction**: the serving simulator (``tuning.simulate``) over the roofline of each model on RBLN-CR13 and the
assumed sampler; the host time is ``host_time.DEFAULT`` (this machine's measurement, emulated stack, real host
time) against ``HOST_FREE`` (through the Python API, not timings.json).

The workload: every request one 1024x1024 image (4,096 patches, the presets' one 16,384-patch ViT bucket; 1,024 LM
tokens and 2 around them) and 128 text tokens, 256 output tokens; Poisson arrivals as ``vllm bench serve`` sends
them, 1,000 requests per run, seed 0 (tune's defaults).

    python benchmarks/bench_host_share.py presets   # the Model Zoo presets (batch 1)
    python benchmarks/bench_host_share.py batches   # Qwen3-VL-2B at 32,768 tokens, batch 1..32
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SLO = "ttft_p90=2s,tpot_p99=100ms"
PROMPT, OUTPUT, VIT = 1024 + 2 + 128, 256, (16384,)
BLOCK, CHUNK = 8192, 128  # the presets' kvcache_partition_len and optimum-rbln's default prefill_chunk_size
PRESETS = (  # (preset, model, max_seq_len): configs/rebel100-1npu.yaml, rebel100-8b.yaml, rebel100-32b.yaml
    ("rebel100-1npu", "Qwen/Qwen3-VL-2B-Instruct", 262144),
    ("rebel100-8b", "Qwen/Qwen3-VL-8B-Instruct", 262144),
    ("rebel100-32b", "Qwen/Qwen3-VL-32B-Instruct", 40960),
)


def capacity(model_id: str, batch: int, max_len: int, host: Any) -> dict[str, Any]:
    """One replica's capacity under ``SLO`` and its figures there (the simulator's upper end, as tune ranks)."""
    from qwenvl_rbln.tuning.capacity import Kind, Load, capacity, parse_slo
    from qwenvl_rbln.tuning.device_time import time_model_for
    from qwenvl_rbln.tuning.simulate import Engine

    graphs = tuple(b for b in (1, 2, 4, 8, 16, 32) if b < batch) + (batch,)
    engine = Engine(batch=batch, chunk=CHUNK, block_size=BLOCK, num_blocks=batch * math.ceil(max_len / BLOCK),
                    max_model_len=max_len, graphs=graphs)  # fmt: skip
    model = time_model_for(model=model_id, chunk=CHUNK, block=BLOCK)
    load = Load(engine, model, [Kind(PROMPT, VIT, 1.0)], OUTPUT, host=host)
    return capacity(load, parse_slo(SLO))


def row(cap: dict[str, Any]) -> str:
    at = cap.get("at_capacity") or cap.get("at_lightest") or {}
    return (f"{cap['capacity_rps']:.2f} req/s ({cap.get('binding') or 'unreachable'}), NPU busy "
            f"{at.get('npu_busy_share', 0):.0%}, TPOT p99 {at.get('tpot', {}).get('p99', 0) * 1e3:.1f} ms")  # fmt: skip


def main() -> None:
    from qwenvl_rbln.tuning.host_time import DEFAULT, HOST_FREE

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("presets", "batches"))
    opts = ap.parse_args()
    print(f"SLO {SLO}; host time: {DEFAULT.source}")
    print("| case | with host time | host-free | capacity kept |\n|---|---|---|---|")
    cases = (
        [(f"{p} ({m.split('/')[-1]}, batch 1, {n:,} tokens)", m, 1, n) for p, m, n in PRESETS]
        if opts.what == "presets"
        else [(f"Qwen3-VL-2B, batch {b}, 32,768 tokens", PRESETS[0][1], b, 32768) for b in (1, 2, 4, 8, 16, 32)]
    )
    for name, model_id, batch, max_len in cases:
        with_host = capacity(model_id, batch, max_len, DEFAULT)
        free = capacity(model_id, batch, max_len, HOST_FREE)
        kept = with_host["capacity_rps"] / free["capacity_rps"] if free["capacity_rps"] else 0.0
        print(f"| {name} | {row(with_host)} | {row(free)} | {kept:.0%} |", flush=True)


if __name__ == "__main__":
    main()
