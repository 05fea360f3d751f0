"""The compiled graphs of an artifact and synthetic inputs of their compiled shapes, read from ``rbln_config.json``.

Why call the graphs directly and not through optimum-rbln's model: optimum-rbln 0.12 holds one
``rebel.Runtime`` per compiled graph (``decoderonly/decoderonly_runtime_utils.py``: ``RBLNPytorchRuntime``
subclasses call ``runtime(*inputs, out=...)``; ``qwen3_vl/modeling_qwen3_vl.py`` one runtime over the ViT file,
which picks the bucket graph by input shape). Its wrappers do host work around each call (masks, sorting,
padding, the chunk loop) and pick the graph themselves, so timing them mixes host time into every figure and
cannot aim at one decoder batch or one chunk position. qvl builds each runtime the same way
(``rebel.Runtime(compiled, tensor_type="pt", device=...)``) and hands it the graph's non-static inputs in
``input_info`` order: exactly one graph runs per call, at the context the inputs name. The KV cache
(``past_key_values_*``, marked static at compile) is the runtime's own buffer, as in optimum-rbln's calls.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.memory.calibration import decoder_key, prefill_key
from qwenvl_rbln.tuning.measured import visual_call_key

STATIC_PREFIX = "past_key_values"


@dataclass(frozen=True)
class Graph:
    """One compiled graph: its file, calibration key, kind, the device it runs on and its non-static inputs."""

    key: str
    kind: str  # "vit" | "prefill" | "decoder"
    file: str  # relative to the artifact
    device: int
    inputs: tuple[tuple[str, tuple[int, ...], str], ...]
    size: int  # the ViT bucket, the prefill chunk, the decoder batch


@dataclass(frozen=True)
class Shapes:
    """The LM facts the synthetic inputs and the context points need."""

    max_seq_len: int
    chunk: int
    block: int  # kvcache_partition_len (flash attention) or max_seq_len: the calibration keys' "block"
    num_blocks: int


def _read(path: Path, raw: bytes | OSError | None = None) -> dict[str, Any]:
    """rbln_config.json, from ``raw`` when the caller read its bytes already (``CheckedArtifact.raw``)."""
    try:
        if raw is None:
            raw = path.read_bytes()
        if isinstance(raw, OSError):
            raise raw
        data = json.loads(raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n"))
    except FileNotFoundError:
        raise InputError(f"{path} is missing", "profile an artifact that `qvl compile` wrote (rbln backend)") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} cannot be read ({exc})", "recompile with `qvl compile --force`") from None
    if not isinstance(data, dict) or not isinstance(data.get("_compile_cfgs"), list):
        raise InputError(f"{path} has no _compile_cfgs (not an optimum-rbln artifact)", "recompile with qvl compile")
    return data


def _dynamic(info: list[Any], static: set[str]) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    return tuple((str(n), tuple(int(d) for d in s), str(t)) for n, s, t in info if n not in static and
                 not str(n).startswith(STATIC_PREFIX))  # fmt: skip


def discover(
    artifact: Path, device: int, visual_device: int, *, raw: bytes | OSError | None = None
) -> tuple[list[Graph], Shapes]:
    """Every graph of the artifact: the ViT buckets (on ``visual_device``), the prefill chunk and each decoder batch
    (on ``device``). ``raw``: rbln_config.json's bytes when the caller read them already."""
    cfg = _read(artifact / "rbln_config.json", raw)
    static = {str(m.get("name")) for m in cfg.get("cache_metas") or [] if isinstance(m, dict)}
    max_seq_len = int(cfg["max_seq_len"])
    shapes = Shapes(
        max_seq_len=max_seq_len,
        chunk=int(cfg.get("prefill_chunk_size") or 128),
        block=int(cfg.get("kvcache_partition_len") or max_seq_len),
        num_blocks=int(cfg.get("kvcache_num_blocks") or 1),
    )
    graphs: list[Graph] = []
    visual = cfg.get("visual")
    if isinstance(visual, dict) and isinstance(visual.get("_compile_cfgs"), list):
        for cc in visual["_compile_cfgs"]:
            for info in cc["input_info"]:  # one graph per bucket, all in one file
                bucket = int(info[0][1][0])
                graphs.append(Graph(visual_call_key(bucket), "vit", f"visual/{cc['compiled_model_name']}.rbln",
                                    visual_device, _dynamic(info, static), bucket))  # fmt: skip
    for cc in cfg["_compile_cfgs"]:
        name = str(cc["compiled_model_name"])
        info = cc["input_info"]
        if name == "prefill":
            key, kind, size = prefill_key(shapes.chunk, shapes.block), "prefill", shapes.chunk
        elif name.startswith("decoder_batch_"):
            size = int(name.rsplit("_", 1)[1])
            key, kind = decoder_key(size, shapes.block), "decoder"
        else:
            continue
        graphs.append(Graph(key, kind, f"{name}.rbln", device, _dynamic(info, static), size))
    graphs.sort(key=lambda g: ({"vit": 0, "prefill": 1, "decoder": 2}[g.kind], g.size))
    return graphs, shapes


def contexts(graph: Graph, shapes: Shapes, points: int) -> list[int | None]:
    """The context positions to time ``graph`` at: none for the ViT; tokens already cached before a prefill chunk
    (multiples of the chunk, up to the last chunk that fits); the decode position for a decoder batch."""
    if graph.kind == "vit":
        return [None]
    if graph.kind == "prefill":
        last = max(0, (shapes.max_seq_len - shapes.chunk) // shapes.chunk)
        picks = {round(i * last / max(points - 1, 1)) * shapes.chunk for i in range(points)}
        return sorted(picks)
    last = shapes.max_seq_len - 1
    return sorted({round(i * last / max(points - 1, 1)) for i in range(points)})


def synthetic_inputs(graph: Graph, shapes: Shapes, context: int | None, seed: int = 0) -> list[Any]:
    """Inputs of the compiled shapes: positions at ``context``, block tables over the KV pool, small random
    activations, empty masks for images (text-only rows)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    n = int(context or 0)
    out = []
    for name, shape, dtype in graph.inputs:
        dt = getattr(torch, dtype.removeprefix("torch."))
        if name in ("cache_position", "position_ids"):
            rows, width = (shape[0], shape[-1]) if shape else (1, 1)
            base = torch.arange(n, n + width, dtype=torch.int64).expand(rows, width) if width > 1 else None
            x = base.reshape(shape) if base is not None else torch.full(shape, n, dtype=torch.int64)
        elif name in ("block_tables", "local_block_tables"):
            x = torch.arange(max(1, math.prod(shape))).reshape(shape) % max(shapes.num_blocks, 1)
        elif name == "query_position":
            x = torch.full(shape, shapes.chunk - 1)
        elif name == "attention_mask":
            x = torch.ones(shape)
        elif dt.is_floating_point and "mask" not in name and "deepstack" not in name:
            x = torch.randn(shape, generator=gen) * 0.02
        else:
            x = torch.zeros(shape)
        out.append(x.to(dt))
    return out
