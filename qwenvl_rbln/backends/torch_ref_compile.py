"""The torch backend's "compile": a copy of the Hugging Face model plus qvl's config and manifest.

There is nothing to compile for transformers on CPU, but ``load-check`` and ``infer`` should treat both
backends alike, so the artifact has the same shape of files qvl reads:

    config.json, model.safetensors (or an index + shards), tokenizer.json / tokenizer_config.json,
    processor_config.json (or preprocessor_config.json), chat_template.*, generation_config.json,
    qvl-rbln-config.json   the plan's rbln_config resolved the way optimum-rbln would (same keys as
                           rbln_config.json: batch_size, max_seq_len, decoder_batch_sizes, visual.max_seq_len
                           sorted descending, _compile_cfgs with npu/num_devices, ...)
    qvl-manifest.json      provenance + sha256 of every file

Nothing heavy is imported at module level; ``load_model`` imports transformers.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts.layout import QWEN3_VL_CONFIG_CLS, QWEN3_VL_MOE_CONFIG_CLS
from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME, TORCH_CONFIG_NAME, list_files
from qwenvl_rbln.errors import BackendError, DependencyMissing, InputError

TORCH_INSTALL_HINT = "pip install torch torchvision transformers==5.15.1 (or `pip install 'qwenvl-rbln[torch]'`)"


def check_dependencies() -> None:
    """The torch backend's compile only copies files; torch is needed when loading (load-check, infer)."""


def torch_rbln_config(plan: Any, *, dtype: str | None = None) -> dict[str, Any]:
    """An rbln_config.json-shaped dict: what optimum-rbln would save for this plan (values resolved)."""
    r = plan.resolved
    lm_cfgs = [
        {"compiled_model_name": name, "input_info": None, "npu": plan.npu, "num_devices": r.num_devices}
        for name in r.graph_names
    ]
    return {
        "cls_name": QWEN3_VL_MOE_CONFIG_CLS if plan.geometry.text.moe is not None else QWEN3_VL_CONFIG_CLS,
        "qvl_backend": "torch",
        "dtype": dtype or "float32",
        "_compile_cfgs": lm_cfgs,
        "batch_size": r.batch_size,
        "max_seq_len": r.max_seq_len,
        "use_inputs_embeds": True,
        "use_position_ids": False,
        "use_attention_mask": False,
        "attn_impl": r.attn_impl,
        "kvcache_partition_len": r.kvcache_partition_len,
        "kvcache_block_size": r.kvcache_block_size,
        "prefill_chunk_size": r.prefill_chunk_size,
        "kvcache_num_blocks": r.kvcache_num_blocks,
        "cache_impl": "static",
        "phases": ["prefill", "decode"],
        "logits_to_keep": 1,
        "decoder_batch_sizes": sorted(r.decoder_batch_sizes, reverse=True),
        "memory_budget": r.memory_budget,
        "visual": {
            "cls_name": "RBLNQwen3VLMoeVisionModelConfig"
            if plan.geometry.text.moe is not None
            else "RBLNQwen3VLVisionModelConfig",
            "dtype": dtype or "float32",
            "_compile_cfgs": [
                {
                    "compiled_model_name": "compiled_model",
                    "input_info": None,
                    "npu": plan.npu,
                    "num_devices": r.visual_num_devices,
                }
            ],
            "batch_size": 1,
            "max_seq_len": sorted(r.vit_buckets, reverse=True),
        },
        "preset_rbln_config": copy.deepcopy(plan.rbln_config),
    }


def _model_dtype(src: Path) -> str | None:
    try:
        cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    text = cfg.get("text_config") or {}
    value = cfg.get("dtype") or cfg.get("torch_dtype") or text.get("dtype")
    return str(value) if value else None


def compile_model(plan: Any, out_dir: Path, progress: Any, model_cls: Any = None, *, source: str | None = None) -> dict:
    """Copy the model directory ``source`` into ``out_dir`` and write qvl-rbln-config.json."""
    from qwenvl_rbln.planning.catalogue.modelinfo import read_model_config

    if source is None:
        raise InputError(f"backend torch needs a local model directory, got {plan.model_id!r}", "pass --model DIR")
    src = Path(source)
    read_model_config(src)  # config.json must be a Qwen3-VL config
    files = [rel for rel in list_files(src) if rel != MANIFEST_NAME and not rel.endswith(".rbln")]
    progress.stage("copying model", f"{len(files)} files from {src}")
    for rel in files:
        dst = Path(out_dir) / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dst)
    progress.stage("writing config", TORCH_CONFIG_NAME)
    cfg = torch_rbln_config(plan, dtype=_model_dtype(src))
    (Path(out_dir) / TORCH_CONFIG_NAME).write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return {"class": "transformers (no compile)", "source": str(src), "files_copied": len(files)}


def load_model(artifact_dir: Path, create_runtimes: bool = True) -> dict[str, Any]:
    """The torch analogue of creating runtimes: load model + processor with transformers on CPU."""
    import time

    if not create_runtimes:
        return {"attempted": False, "ok": None, "reason": "--no-runtime"}
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError as exc:
        raise DependencyMissing(
            f"the torch backend needs {exc.name or 'torch'}, which is not installed", TORCH_INSTALL_HINT
        ) from None
    from transformers.utils import logging as hf_logging

    t0 = time.monotonic()
    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar on stderr
    try:
        model = transformers.AutoModelForImageTextToText.from_pretrained(str(artifact_dir), local_files_only=True)
        processor = transformers.AutoProcessor.from_pretrained(str(artifact_dir), local_files_only=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise BackendError(
            f"transformers could not load {artifact_dir}: {type(exc).__name__}: {first}",
            "recompile the artifact (`qvl compile --preset cpu-tiny --force`)",
        ) from exc
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "attempted": True,
        "ok": True,
        "backend": "torch",
        "class": type(model).__name__,
        "processor": type(processor).__name__,
        "device": "cpu",
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "parameters": n_params,
        "seconds": round(time.monotonic() - t0, 3),
        "note": f"transformers {type(model).__name__} loaded on CPU with its processor",
    }
