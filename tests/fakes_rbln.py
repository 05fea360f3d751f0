"""Test doubles for optimum-rbln 0.12.0 and rebel: same call signatures, same on-disk layout, no NPU.

- ``rbln_config_json(plan)``: the rbln_config.json optimum-rbln 0.12 would write for a plan (keys, order of
  decoder graphs, ``_compile_cfgs`` with input_info/npu/num_devices, cache_metas, nested ``visual``).
- ``write_artifact(dir, plan)``: a full artifact directory in the real layout (fake ``.rbln`` files hold the
  allocation table the fake ``rebel.RBLNCompiledModel`` reads back).
- ``FakeRBLNAuto``: ``from_pretrained`` records every call (deep copies) and mimics export (writes into
  ``model_save_dir``, calls ``RBLNBaseModel.compile`` per graph, mutates the passed dict like optimum-rbln)
  and load (missing file -> FileNotFoundError, runtime failure -> optimum-rbln's wrapped RuntimeError).
  ``save_pretrained`` copies like optimum-rbln (``<dir>.tmp`` then merge/rename) and can raise or
  KeyboardInterrupt half-way.
- ``install(monkeypatch, ...)``: puts fake ``optimum``, ``optimum.rbln``, ``optimum.rbln.modeling_base`` and
  ``rebel`` modules into ``sys.modules``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import time
import types
from pathlib import Path
from typing import Any

GiB = 1 << 30
MiB = 1 << 20

# Qwen3-VL-2B text/vision numbers (config.json of Qwen/Qwen3-VL-2B-Instruct).
QWEN3_VL_2B_CONFIG = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
    "text_config": {
        "hidden_size": 2048,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 6144,
        "vocab_size": 151936,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": True,
    },
    "vision_config": {
        "depth": 24,
        "hidden_size": 1024,
        "num_heads": 16,
        "intermediate_size": 4096,
        "out_hidden_size": 2048,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "in_channels": 3,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [5, 11, 17],
    },
}


def config_of(geometry: Any) -> dict:
    """The config.json of a family member (modelinfo geometry) in the released layout: the 2B's keys, its numbers."""
    t, v = geometry.text, geometry.vision
    cfg = json.loads(json.dumps(QWEN3_VL_2B_CONFIG))
    cfg["tie_word_embeddings"] = t.tie_word_embeddings
    cfg["text_config"].update(
        hidden_size=t.hidden_size,
        num_hidden_layers=t.num_hidden_layers,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        head_dim=t.head_dim,
        intermediate_size=t.intermediate_size,
        vocab_size=t.vocab_size,
        max_position_embeddings=t.max_position_embeddings,
        tie_word_embeddings=t.tie_word_embeddings,
    )
    cfg["vision_config"].update(
        depth=v.depth,
        hidden_size=v.hidden_size,
        num_heads=v.num_heads,
        intermediate_size=v.intermediate_size,
        out_hidden_size=v.out_hidden_size,
        deepstack_visual_indexes=[5, 11, 17] if v.depth == 24 else [8, 16, 24],
    )
    return cfg


TINY_CONFIG = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    "tie_word_embeddings": True,
    "dtype": "float32",
    "text_config": {
        "hidden_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 512,
        "max_position_embeddings": 8192,
    },
    "vision_config": {
        "depth": 3,
        "hidden_size": 64,
        "num_heads": 4,
        "intermediate_size": 128,
        "out_hidden_size": 64,
        "deepstack_visual_indexes": [0, 1, 2],
    },
}


def write_hf_model(path: Path, config: dict | None = None, weights: bytes = b"\x00weights\x01" * 64) -> Path:
    """A Hugging Face model directory (config, weights, tokenizer/processor files); no torch needed."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or QWEN3_VL_2B_CONFIG, indent=2))
    (path / "model.safetensors").write_bytes(weights)
    (path / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (path / "tokenizer_config.json").write_text('{"tokenizer_class": "Qwen2Tokenizer"}')
    (path / "processor_config.json").write_text('{"processor_class": "Qwen3VLProcessor"}')
    (path / "generation_config.json").write_text('{"do_sample": false}')
    return path


# ------------------------------------------------------------------------------------------ rbln_config.json


def _kv_layers(plan: Any) -> tuple[int, int, int]:
    t = plan.geometry.text
    return t.num_hidden_layers, t.num_key_value_heads, t.head_dim


def _kv_inputs(plan: Any, num_blocks_compile: int) -> list[list]:
    layers, kv_heads, head_dim = _kv_layers(plan)
    block = plan.resolved.kvcache_block_size
    return [
        [f"past_key_values_{i}", [num_blocks_compile, kv_heads, block, head_dim], "bfloat16"] for i in range(2 * layers)
    ]


def rbln_config_json(
    plan: Any, *, kv_blocks: int | None = None, npu: str | None = "plan", version: str = "0.12.0"
) -> dict:
    """The top-level rbln_config.json optimum-rbln 0.12.0 writes for ``plan`` (values resolved at export)."""
    r = plan.resolved
    t, v = plan.geometry.text, plan.geometry.vision
    target = plan.npu if npu == "plan" else npu
    chunk = r.prefill_chunk_size
    auto = r.attn_impl == "flash_attn" and not r.kvcache_num_blocks
    resolved_blocks = kv_blocks if kv_blocks is not None else (r.kvcache_num_blocks or r.num_full_blocks)
    compile_blocks = 1 if auto else resolved_blocks
    per_seq_blocks = r.max_seq_len // r.kvcache_block_size
    prefill_info = [
        ["inputs_embeds", [1, chunk, t.hidden_size], "bfloat16"],
        ["cache_position", [1, chunk], "int32"],
        ["block_tables", [per_seq_blocks], "int16"],
        ["position_emb", [2, 1, 1, chunk, t.head_dim], "bfloat16"],
        ["query_position", [], "int16"],
        ["visual_pos_mask", [1, chunk], "bool"],
        ["deepstack_visual_embeds", [v.num_deepstack, chunk, t.hidden_size], "bfloat16"],
        *_kv_inputs(plan, compile_blocks),
    ]
    cfgs = [{"compiled_model_name": "prefill", "input_info": prefill_info, "npu": target, "num_devices": r.num_devices}]
    for b in r.decoder_batch_sizes:
        info = [
            ["inputs_embeds", [b, 1, t.hidden_size], "bfloat16"],
            ["cache_position", [b, 1], "int32"],
            ["block_tables", [b, per_seq_blocks], "int16"],
            ["position_emb", [2, b, 1, 1, t.head_dim], "bfloat16"],
            *_kv_inputs(plan, compile_blocks),
        ]
        cfgs.append(
            {
                "compiled_model_name": f"decoder_batch_{b}",
                "input_info": info,
                "npu": target,
                "num_devices": r.num_devices,
            }
        )
    head_dim_v = v.hidden_size // v.num_heads
    buckets_desc = sorted(r.vit_buckets, reverse=True)
    vis_info = [
        [
            ["hidden_states", [s, v.hidden_size], "bfloat16"],
            ["attn_mask", [1, 1, s, s], "bfloat16"],
            ["cos", [1, 1, s, head_dim_v], "bfloat16"],
            ["sin", [1, 1, s, head_dim_v], "bfloat16"],
        ]
        for s in buckets_desc
    ]
    layers, kv_heads, head_dim = _kv_layers(plan)
    return {
        "cls_name": "RBLNQwen3VLForConditionalGenerationConfig",
        "dtype": "bfloat16",
        "optimum_rbln_version": version,
        "_compile_cfgs": cfgs,
        "batch_size": r.batch_size,
        "max_seq_len": r.max_seq_len,
        "use_inputs_embeds": True,
        "use_position_ids": False,
        "use_attention_mask": False,
        "quantization": {},
        "lora_config": None,
        "attn_impl": r.attn_impl,
        "kvcache_partition_len": r.kvcache_partition_len,
        "kvcache_block_size": r.kvcache_block_size,
        "prefill_chunk_size": chunk,
        "kvcache_num_blocks": resolved_blocks,
        "cache_impl": "static",
        "sliding_window": None,
        "sliding_window_layers": [],
        "phases": ["prefill", "decode"],
        "logits_to_keep": 1,
        "output_hidden_states": False,
        "_requires_batch_sort": r.attn_impl == "flash_attn" and (target or "").startswith("RBLN-CR1"),
        "decoder_batch_sizes": list(r.decoder_batch_sizes),
        "cache_metas": [
            {
                "name": f"past_key_values_{i}",
                "layer_index": i // 2,
                "shape": [resolved_blocks, kv_heads, r.kvcache_block_size, head_dim],
                "layer_type": "full_attention",
                "is_auto": auto,
                "dtype": "bfloat16",
            }
            for i in range(2 * layers)
        ],
        "visual": {
            "cls_name": "RBLNQwen3VLVisionModelConfig",
            "dtype": "bfloat16",
            "optimum_rbln_version": version,
            "_compile_cfgs": [
                {
                    "compiled_model_name": "compiled_model",
                    "input_info": vis_info,
                    "npu": target,
                    "num_devices": r.visual_num_devices,
                }
            ],
            "batch_size": 1,
            "max_seq_len": buckets_desc,
        },
    }


def allocation_table(
    plan: Any, *, kv_bytes: int = 28 * GiB, lm_weights: int = int(3.2 * GiB), vit_bytes: int = 26 * GiB
) -> dict:
    """Per graph: {key: [[bytes per chiplet]]} (one node, 4 chiplets) the fake rebel reports."""

    def split(n: int) -> list[list[int]]:
        return [[n // 4] * 4]

    table = {"prefill": {"Weight": split(lm_weights), "Workspace": split(256 * MiB), "DramTensor": split(kv_bytes)}}
    for b in plan.resolved.decoder_batch_sizes:
        table[f"decoder_batch_{b}"] = {
            "Weight": split(0),
            "Workspace": split(64 * MiB * b),
            "DramTensor": split(kv_bytes),
        }
    table["visual/compiled_model"] = {"Weight": split(int(0.75 * GiB)), "Workspace": split(vit_bytes)}
    return table


def write_artifact(
    root: Path,
    plan: Any,
    *,
    config: dict | None = None,
    alloc: dict | None = None,
    cfg: dict | None = None,
) -> Path:
    """An optimum-rbln 0.12 Qwen3-VL artifact directory in the real layout."""
    root = Path(root)
    (root / "visual").mkdir(parents=True, exist_ok=True)
    cfg = cfg or rbln_config_json(plan)
    alloc = alloc or allocation_table(plan)
    if config is None and plan.geometry.name != "Qwen3-VL-2B" and plan.geometry.dtype_bytes == 2:
        config = config_of(plan.geometry)  # the plan's own model (4B, 8B, 32B), not the 2B's numbers
    (root / "rbln_config.json").write_text(json.dumps(cfg, indent=2))
    (root / "config.json").write_text(json.dumps(config or QWEN3_VL_2B_CONFIG, indent=2))
    (root / "generation_config.json").write_text('{"do_sample": false}')
    (root / "torch_artifacts.pth").write_bytes(b"embed_tokens" * 16)
    for name in ("tokenizer.json", "tokenizer_config.json", "processor_config.json", "chat_template.jinja"):
        (root / name).write_text("{}")
    for c in cfg["_compile_cfgs"]:
        name = c["compiled_model_name"]
        (root / f"{name}.rbln").write_text(json.dumps({"graph": name, "alloc": alloc.get(name, {})}))
    (root / "visual" / "rbln_config.json").write_text(json.dumps(cfg["visual"], indent=2))
    (root / "visual" / "config.json").write_text(json.dumps((config or QWEN3_VL_2B_CONFIG)["vision_config"]))
    (root / "visual" / "torch_artifacts.pth").write_bytes(b"patch_embed+pos_embed" * 8)
    (root / "visual" / "compiled_model.rbln").write_text(
        json.dumps({"graph": "visual/compiled_model", "alloc": alloc.get("visual/compiled_model", {})})
    )
    return root


def deploy_artifact(root: Path, preset: str = "rebel100-1npu", *, cfg: dict | None = None,
                    placement: dict | None = None, model_id: str = "Qwen/Qwen3-VL-2B-Instruct") -> Path:  # fmt: skip
    """``write_artifact`` of ``preset`` plus the manifest compile writes (``placement``: default the plan's)."""
    from qwenvl_rbln.artifacts.manifest import write_manifest
    from qwenvl_rbln.planning.plan import build_plan

    plan = build_plan(preset)
    write_artifact(root, plan, cfg=cfg)
    placement = placement or plan.placement
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": placement, "model": {"id": model_id}})
    return root


# -------------------------------------------------------------------------------------------- fake rebel


class FakeCompiledModel:
    def __init__(self, path: str):
        self.path = str(path)
        data = json.loads(Path(path).read_text())
        self._alloc = data.get("alloc") or {}

    def get_alloc_per_chiplet_by_key(self) -> dict:
        return copy.deepcopy(self._alloc)


def make_rebel(*, runtime_error: str | None = None) -> types.ModuleType:
    """A fake ``rebel`` module; ``runtime_error`` makes every Runtime() raise RuntimeError(runtime_error)."""
    mod = types.ModuleType("rebel")
    mod.RBLNCompiledModel = FakeCompiledModel

    class Runtime:
        def __init__(self, compiled_model: Any, tensor_type: str = "pt", device: Any = None, **kwargs: Any):
            if runtime_error:
                raise RuntimeError(runtime_error)

    mod.Runtime = Runtime
    mod.__version__ = "0.12.0"
    return mod


# ------------------------------------------------------------------------------------------ fake optimum


class _CompileCfg:
    def __init__(self, name: str):
        self.compiled_model_name = name


class FakeRBLNBaseModel:
    """Stands in for optimum.rbln.modeling_base.RBLNBaseModel: its classmethod ``compile`` is what qvl hooks."""

    compiled: list[str] = []

    @classmethod
    def compile(
        cls, model: Any, rbln_compile_config: Any, create_runtimes: bool = False, device: Any = None, **kw: Any
    ):
        FakeRBLNBaseModel.compiled.append(rbln_compile_config.compiled_model_name)
        return f"compiled:{rbln_compile_config.compiled_model_name}"


class FakeRBLNAuto:
    """Records from_pretrained calls; ``behavior`` controls failures: see make_auto()."""

    calls: list[dict] = []
    saves: list[str] = []
    behavior: dict[str, Any] = {}
    plan: Any = None

    def __init__(self, model_save_dir: str, rbln_config: dict):
        self.model_save_dir = Path(model_save_dir)
        self.rbln_config = rbln_config

    @classmethod
    def from_pretrained(cls, model_id: Any, export: bool | None = None, rbln_config: dict | None = None, **kwargs: Any):
        cls.calls.append(
            {
                "model_id": str(model_id),
                "export": export,
                "rbln_config": copy.deepcopy(rbln_config),
                "kwargs": dict(kwargs),
            }
        )
        b = cls.behavior
        if export:
            if b.get("export_error"):
                raise ValueError(b["export_error"])
            save_dir = Path(kwargs["model_save_dir"])
            save_dir.mkdir(exist_ok=True)  # optimum-rbln: mkdir(exist_ok=True), parent must exist
            # optimum-rbln mutates the dict it gets: visual.max_seq_len sorted in place, rbln_ kwargs merged
            vis = rbln_config.get("visual", {})
            if isinstance(vis.get("max_seq_len"), list):
                vis["max_seq_len"].sort(reverse=True)
            rbln_config["_mutated_by_fake_optimum"] = True
            mb = sys.modules.get("optimum.rbln.modeling_base")
            base = mb.RBLNBaseModel if mb else FakeRBLNBaseModel
            # like modeling.py:76 (ViT, keyword) and modeling_decoderonly.py:243 (LM graphs, positional)
            vision_cls = type("RBLNQwen3VLVisionModel", (base,), {})
            lm_cls = type("RBLNQwen3VLForConditionalGeneration", (base,), {})
            vision_cls.compile(
                None, rbln_compile_config=_CompileCfg("compiled_model"), create_runtimes=False, device=None
            )
            for name in cls.plan.resolved.graph_names:
                lm_cls.compile(None, _CompileCfg(name), create_runtimes=False, device=None)
            wait_for = b.get("wait_for_file")
            if wait_for:
                deadline = time.monotonic() + 300
                while not Path(wait_for).exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
            src = Path(str(model_id))
            write_artifact(
                save_dir,
                cls.plan,
                config=json.loads((src / "config.json").read_text()) if (src / "config.json").is_file() else None,
            )
            return cls(str(save_dir), rbln_config)
        # load
        root = Path(str(model_id))
        cfg = json.loads((root / "rbln_config.json").read_text())
        for c in cfg["_compile_cfgs"]:
            if not (root / f"{c['compiled_model_name']}.rbln").exists():
                raise FileNotFoundError(
                    f"Expected RBLN compiled model '{c['compiled_model_name']}.rbln' not found at '{root}'. "
                    "Please ensure all models specified in `rbln_config` are present."
                )
        if rbln_config.get("create_runtimes") is not False:
            rebel = sys.modules["rebel"]
            try:
                vis = rbln_config.get("visual", {}).get("device", rbln_config.get("device"))
                rebel.Runtime(FakeCompiledModel(root / "visual" / "compiled_model.rbln"), device=vis)
                for c in cfg["_compile_cfgs"]:
                    rebel.Runtime(
                        FakeCompiledModel(root / f"{c['compiled_model_name']}.rbln"), device=rbln_config.get("device")
                    )
            except RuntimeError as e:  # modeling_base.py:360-378
                msg = f"\nFailed to create RBLN runtime: {e}\n\nIf you only need to compile the model ...\n"
                if "Lack of device memory" in str(e):
                    msg += "\n\nNot enough NPU memory to load the model. \n\nThis model has submodules (visual).\n"
                raise RuntimeError(msg) from e
        return cls(str(root), rbln_config)

    def save_pretrained(self, save_directory: str) -> None:
        """optimum-rbln 0.12 modeling_base.py:637-724, with injectable failures half-way."""
        type(self).saves.append(str(save_directory))
        real = self.model_save_dir.resolve()
        dest = Path(save_directory).resolve()
        if dest == real:
            raise FileExistsError(
                f"Cannot save model to '{save_directory}'. This directory already exists and contains the model files."
            )
        tmp = str(dest) + ".tmp"
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        b = type(self).behavior
        try:
            shutil.copytree(real, tmp)
            if b.get("save_interrupt"):
                raise KeyboardInterrupt
            if b.get("save_error"):
                raise OSError(b["save_error"])
            if dest.exists():
                for name in os.listdir(tmp):
                    src_item, dst_item = os.path.join(tmp, name), os.path.join(dest, name)
                    if os.path.isdir(src_item):
                        shutil.copytree(src_item, dst_item, dirs_exist_ok=True)
                    else:
                        os.replace(src_item, dst_item)
                shutil.rmtree(tmp)
            else:
                os.rename(tmp, dest)
        except Exception:
            if os.path.exists(tmp):
                shutil.rmtree(tmp)
            raise


def make_auto(plan: Any, **behavior: Any) -> type[FakeRBLNAuto]:
    """A fresh FakeRBLNAuto subclass for one test (its own call log and behavior)."""
    return type(
        "RBLNAutoModelForImageTextToText",
        (FakeRBLNAuto,),
        {"calls": [], "saves": [], "behavior": behavior, "plan": plan},
    )


def install(
    monkeypatch: Any, auto: type | None = None, *, rebel: types.ModuleType | None = None, with_optimum: bool = True
):
    """Fake ``optimum.rbln`` (with ``auto`` as RBLNAutoModelForImageTextToText) and ``rebel`` in sys.modules."""
    if rebel is not None:
        monkeypatch.setitem(sys.modules, "rebel", rebel)
    if not with_optimum:
        return None
    optimum = types.ModuleType("optimum")
    optimum.__path__ = []
    orbln = types.ModuleType("optimum.rbln")
    orbln.__path__ = []
    orbln.__version__ = "0.12.0"
    if auto is not None:
        orbln.RBLNAutoModelForImageTextToText = auto
    base_mod = types.ModuleType("optimum.rbln.modeling_base")

    class RBLNBaseModel:
        compiled: list[str] = []

        @classmethod
        def compile(cls, model: Any, rbln_compile_config: Any, create_runtimes: bool = False, device: Any = None, **kw):
            RBLNBaseModel.compiled.append(rbln_compile_config.compiled_model_name)
            return f"compiled:{rbln_compile_config.compiled_model_name}"

    base_mod.RBLNBaseModel = RBLNBaseModel
    optimum.rbln = orbln
    orbln.modeling_base = base_mod
    monkeypatch.setitem(sys.modules, "optimum", optimum)
    monkeypatch.setitem(sys.modules, "optimum.rbln", orbln)
    monkeypatch.setitem(sys.modules, "optimum.rbln.modeling_base", base_mod)
    if "rebel" not in sys.modules or sys.modules["rebel"] is None:
        monkeypatch.setitem(sys.modules, "rebel", make_rebel())
    return orbln


def install_plain(auto: type, rebel_mod: types.ModuleType | None = None) -> None:
    """install() without pytest's monkeypatch (for subprocesses that run cli.main)."""

    class _MP:
        @staticmethod
        def setitem(mapping: dict, key: str, value: Any) -> None:
            mapping[key] = value

    install(_MP(), auto, rebel=rebel_mod or make_rebel())


def run_main(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    """cli.main in-process with sys.argv patched: (exit code, stdout, stderr), exactly as a user sees them."""
    from qwenvl_rbln import cli
    from qwenvl_rbln.views import render

    render.reset_consoles()
    capsys.readouterr()
    old = sys.argv
    sys.argv = ["qvl", *argv]
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = old
    captured = capsys.readouterr()
    render.reset_consoles()
    return code, captured.out, captured.err


def rbln_presets() -> list[str]:
    from qwenvl_rbln.planning.presets import list_preset_files, load_preset

    return [name for name in list_preset_files() if load_preset(name).data.get("backend", "rbln") == "rbln"]


def temp_entries(parent: Path) -> list[str]:
    """qvl temp/old siblings (and optimum-rbln's '.tmp' copies) left in ``parent``."""
    return sorted(
        p.name
        for p in Path(parent).iterdir()
        if ".qvl-tmp-" in p.name or ".qvl-old-" in p.name or p.name.endswith(".tmp")
    )


def refused_infer(capsys: Any, *args: str) -> str:
    """`qvl infer ARGS` refused as bad input: exit 2, nothing streamed, exactly one error line (returned)."""
    code, out, err = run_main(["infer", *args], capsys)
    assert code == 2, err
    if "--json" in args:  # the error document alone: nothing streamed, nothing half-done
        assert set(json.loads(out)) == {"error"}, out
    else:
        assert out == ""  # nothing streamed, nothing half-done
    lines = [ln for ln in err.splitlines() if ln.startswith("qvl: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
