"""Quantization must match the checkpoint: the safetensors headers (names and dtypes, never the data) must carry the
scales optimum-rbln 0.12 loads, else qvl refuses (exit 2) before anything compiles."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_8B
from qwenvl_rbln.planning.checkpoint_scales import checkpoint_tensors, read_header
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import run_main
from tests.test_family import config_of, make_hub_cache

LAYER = "model.language_model.layers.0"


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> Path:
    """A real safetensors file: 8-byte header length, the JSON header, then zero bytes for the data."""
    size = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "I8": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)
    return path


def model_dir(root: Path, tensors: dict[str, tuple[str, list[int]]], cfg_extra: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({**config_of(QWEN3_VL_8B), **(cfg_extra or {})}))
    write_safetensors(root / "model-00001-of-00001.safetensors", tensors)
    return root


BF16 = {f"{LAYER}.self_attn.q_proj.weight": ("BF16", [4, 4]), f"{LAYER}.mlp.up_proj.weight": ("BF16", [4, 4])}


def quant(**q) -> str:
    return "quantization=" + json.dumps({"format": "rbln", **q}).replace(" ", "")


def test_header_is_read_without_the_data(tmp_path):
    path = write_safetensors(tmp_path / "x.safetensors", {"a.weight": ("BF16", [2, 3])})
    assert read_header(path) == {"a.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}}
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 8)
    with pytest.raises(InputError, match="not a readable safetensors"):
        checkpoint_tensors(tmp_path)


def test_int8_weights_on_a_bf16_checkpoint_are_refused(tmp_path, capsys):
    d = model_dir(tmp_path / "m", BF16)
    argv = ["compile", "--preset", "rebel100-1npu", "--model", str(d), "--set", quant(weights="int8"), "--dry-run"]
    code, out, err = run_main(argv, capsys)
    assert code == 2, err
    assert "weight_scale" in err and "scale left at 1" in err and "garbage" in err


def test_int4_weights_with_per_channel_scales_plan(tmp_path):
    d = model_dir(tmp_path / "m", {**BF16, f"{LAYER}.self_attn.q_proj.weight_scale": ("F32", [4, 1])})
    assert build_plan("rebel100-1npu", [quant(weights="int4")], model=str(d)).resolved.quantization["weights"] == "int4"


def test_an_alias_of_the_scale_is_accepted(tmp_path):
    d = model_dir(tmp_path / "m", {**BF16, f"{LAYER}.self_attn.q_proj.scales": ("F32", [4])})
    build_plan("rebel100-1npu", [quant(weights="int8")], model=str(d))


@pytest.mark.parametrize(
    ("settings", "present", "missing"),
    [
        ({"weights": "fp8"}, [], "No weight_scale found"),
        ({"weights": "fp8", "activations": "fp8"}, ["weight_scale"], "No input_scale found"),
        ({"weights": "int8", "kv_caches": "fp8"}, ["weight_scale"], "No kv_scale found"),
    ],
)
def test_fp8_without_its_scales_is_refused(tmp_path, settings, present, missing):
    extra = {f"{LAYER}.self_attn.q_proj.{name}": ("F32", [4, 1]) for name in present}
    d = model_dir(tmp_path / "m", {**BF16, **extra})
    with pytest.raises(InputError, match=missing):
        build_plan("rebel100-1npu", [quant(**settings)], model=str(d))
    full = {
        **extra,
        f"{LAYER}.self_attn.q_proj.weight_scale": ("F32", [4, 1]),
        f"{LAYER}.self_attn.q_proj.input_scale": ("F32", [1]),
        f"{LAYER}.self_attn.k_scale": ("F32", []),
        f"{LAYER}.self_attn.v_scale": ("F32", []),
    }
    ok = model_dir(tmp_path / "ok", {**BF16, **full})
    build_plan("rebel100-1npu", [quant(**settings)], model=str(ok))


def test_qwens_blockwise_fp8_checkpoint_is_refused_with_the_reason(tmp_path):
    fp8 = {
        f"{LAYER}.self_attn.q_proj.weight": ("F8_E4M3", [256, 256]),
        f"{LAYER}.self_attn.q_proj.weight_scale_inv": ("F32", [2, 2]),
    }
    qc = {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}
    d = model_dir(tmp_path / "Qwen3-VL-8B-Instruct-FP8", fp8, qc)
    with pytest.raises(InputError) as exc:
        build_plan("rebel100-1npu", [quant(weights="fp8", activations="fp8")], model=str(d))
    line = exc.value.one_line()
    assert "block-wise" in line and "128x128" in line and "weight_scale_inv" in line
    assert "bf16 checkpoint" in line  # what would load


def test_a_cached_hub_checkpoint_is_checked_too(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snap = make_hub_cache(tmp_path / "hub", "acme/Qwen3-VL-8B-Plain", config_of(QWEN3_VL_8B))
    write_safetensors(snap / "model.safetensors", BF16)
    with pytest.raises(InputError, match="weight_scale"):
        build_plan("rebel100-1npu", [quant(weights="int8")], model="acme/Qwen3-VL-8B-Plain")


def test_without_local_weights_the_check_is_a_warning(tmp_path):
    plan = build_plan("rebel100-1npu", [quant(weights="int8")])  # the built-in hub id: nothing on disk
    assert any("scales were not checked" in w for w in plan.warnings)


def test_int8_dynamic_activations_need_no_input_scale(tmp_path):
    """W4: optimum-rbln 0.12 creates input_scale only for fp8 activations or int8 with dynamic false; a
    W8A8-dynamic checkpoint carries weight_scale alone and loads."""
    d = model_dir(tmp_path / "m", {**BF16, f"{LAYER}.self_attn.q_proj.weight_scale": ("F32", [4, 1])})
    dyn = build_plan("rebel100-1npu", [quant(weights="int8", activations="int8", dynamic=True)], model=str(d))
    assert dyn.resolved.quantization["dynamic"] is True
    with pytest.raises(InputError, match="activations=int8 needs input_scale"):
        build_plan("rebel100-1npu", [quant(weights="int8", activations="int8", dynamic=False)], model=str(d))
    with pytest.raises(InputError, match="activations=int8 needs input_scale"):
        build_plan("rebel100-1npu", [quant(weights="int8", activations="int8")], model=str(d))
