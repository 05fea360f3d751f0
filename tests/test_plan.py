"""Presets resolve to exactly the product document's rbln_config dicts, and every optimum-rbln rule holds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.plan import build_plan
from qwenvl_rbln.presets import list_preset_files

GOLDEN = json.loads((Path(__file__).parent / "golden" / "presets.json").read_text())
PRESETS = [name for name in GOLDEN if not name.startswith("_")]


def test_every_shipped_preset_has_a_golden():
    assert sorted(list_preset_files()) == sorted(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_golden_dicts(name):
    plan = build_plan(name)
    golden = GOLDEN[name]
    assert plan.rbln_config == golden["compile"]
    assert plan.load_rbln_config == golden["load"]
    assert {k: plan.processor.to_dict()[k] for k in golden["processor"]} == golden["processor"]


def test_key_order_follows_the_document():
    plan = build_plan("rebel100-1npu")
    assert list(plan.rbln_config) == [
        "visual",
        "num_devices",
        "kvcache_partition_len",
        "max_seq_len",
        "create_runtimes",
        "npu",
    ]


def test_resolved_values_for_batch4():
    r = build_plan("rebel100-1npu-batch4").resolved
    assert r.attn_impl == "flash_attn"
    assert r.kvcache_block_size == 8192
    assert r.prefill_chunk_size == 512  # RBLN-CR default
    assert r.decoder_batch_sizes == [4, 2, 1]
    assert r.graph_names == ["prefill", "decoder_batch_4", "decoder_batch_2", "decoder_batch_1"]
    assert r.num_full_blocks == 16
    assert r.num_min_blocks == 5


def test_set_overrides_and_model_flag(tmp_path):
    plan = build_plan("rebel100-1npu", ["visual.max_seq_len=[1024,16384]", "max_seq_len=32768"])
    assert plan.rbln_config["visual"]["max_seq_len"] == [1024, 16384]
    assert plan.rbln_config["max_seq_len"] == 32768
    plan = build_plan("rebel100-1npu", ["placement.visual_device=1"])
    assert plan.load_rbln_config == {"visual": {"device": 1}, "device": 0}
    plan = build_plan("rebel100-1npu", model="Qwen/Qwen3-VL-4B-Instruct")
    assert plan.model_id == "Qwen/Qwen3-VL-4B-Instruct"
    assert plan.geometry.text.num_hidden_layers == 36


def test_local_model_dir_geometry(tmp_path):
    cfg = {
        "model_type": "qwen3_vl",
        "text_config": {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "intermediate_size": 128,
            "vocab_size": 300,
            "max_position_embeddings": 4096,
        },
        "vision_config": {
            "depth": 2,
            "hidden_size": 32,
            "num_heads": 2,
            "intermediate_size": 64,
            "out_hidden_size": 64,
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="max_position_embeddings"):
        build_plan("rebel100-1npu", model=str(tmp_path))
    plan = build_plan("rebel100-1npu", ["max_seq_len=4096", "kvcache_partition_len=1024"], model=str(tmp_path))
    assert plan.geometry.text.hidden_size == 64


def test_not_a_qwen3_vl_model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(InputError, match="not 'qwen3_vl'"):
        build_plan("rebel100-1npu", model=str(tmp_path))


def test_deprecated_max_seq_lens_is_rewritten(tmp_path):
    preset = tmp_path / "old.yaml"
    preset.write_text(
        "extends: rebel100-1npu\nrbln_config:\n  visual:\n    max_seq_len: null\n    max_seq_lens: [1024, 16384]\n"
    )
    plan = build_plan(str(preset))
    assert plan.rbln_config["visual"]["max_seq_len"] == [1024, 16384]
    assert "max_seq_lens" not in plan.rbln_config["visual"]
    assert any("max_seq_lens" in w for w in plan.warnings)


def test_deprecated_and_new_both_set_is_an_error():
    with pytest.raises(InputError, match="both"):
        build_plan("rebel100-1npu", ["visual.max_seq_lens=[1024]"])


def test_decoder_batch_sizes_appended_like_optimum():
    plan = build_plan("rebel100-1npu-batch4", ["decoder_batch_sizes=[1,2]"])
    assert plan.resolved.decoder_batch_sizes == [4, 2, 1]
    assert any("appends 4" in w for w in plan.warnings)


@pytest.mark.parametrize(
    "sets, match",
    [
        (["max_seq_len=300000"], "max_position_embeddings"),
        (["max_seq_len=20000"], "multiple of kvcache_partition_len"),
        (["max_seq_len=8192"], "at least 2x"),
        (["kvcache_partition_len=512"], r"1024 <= P <= 16384"),
        (["kvcache_partition_len=32768", "max_seq_len=65536"], r"1024 <= P <= 16384"),
        (["kvcache_partition_len=null", "max_seq_len=32768"], "limit of 16384 for eager"),
        (
            ["kvcache_partition_len=null", "attn_impl=eager", "max_seq_len=16384", "kvcache_block_size=8192"],
            "must equal max_seq_len",
        ),
        (["kvcache_block_size=4096"], "must equal kvcache_partition_len"),
        (["attn_impl=sdpa"], "Unknown attn_impl"),
        (["prefill_chunk_size=100"], "divisible by 64"),
        (["batch_size=0"], "below the minimum 1"),
        (["batch_size=4", "decoder_batch_sizes=[8,4]"], "must be <= batch_size"),
        (["batch_size=8", "decoder_batch_sizes=[4]"], "single entry different from batch_size"),
        (["batch_size=4", "decoder_batch_sizes=[1,2,2,4]"], "duplicates"),
        (["visual.max_seq_len=[1022,16384]"], "not a multiple of 4"),
        (["visual.max_seq_len=[1024,1024]"], "duplicates"),
        (["visual.batch_size=2"], "only supports batch_size=1"),
        (["kvcache_num_blocks=3"], "less than the minimum number of blocks"),
        (["kvcache_num_blocks=40", "memory_budget=0.5"], "mutually exclusive"),
        (["memory_budget=1.5"], r"fraction must be in \(0, 1\]"),
        (["memory_budget=200GiB"], "exceeds the target NPU's available DRAM"),
        (["placement.device=-1"], "not a device id"),
        (["placement.visual_device=[0,0]"], "repeats a device id"),
        (["placement.device=gpu0"], "not a device id"),
        (["use_inputs_embeds=false"], "requires use_inputs_embeds=True"),
        (["logits_to_keep=4"], "not supported"),
        (["npu=RBLN-XYZ"], "unknown npu name"),
        (["max_seq_length=4096"], "did you mean 'rbln_config.max_seq_len'"),
        (["visual.max_seq=4096"], "unknown rbln_config key 'rbln_config.visual.max_seq'"),
        (["batch_size=four"], "must be an integer"),
        (["processor.max_pixels=-3"], "below the minimum 1"),
    ],
)
def test_validation_messages(sets, match):
    with pytest.raises(InputError) as info:
        build_plan("rebel100-1npu", sets)
    text = info.value.one_line()
    assert re.search(match, text), text
    assert "\n" not in text
    assert info.value.hint  # every error says the fix


def test_error_names_the_file_that_set_the_key(tmp_path):
    preset = tmp_path / "mine.yaml"
    preset.write_text("extends: rebel100-1npu\nrbln_config:\n  max_seq_len: 12345\n")
    with pytest.raises(InputError) as info:
        build_plan(str(preset))
    assert "mine.yaml" in info.value.message
    assert "12345" in info.value.message
    with pytest.raises(InputError) as info:
        build_plan("rebel100-1npu", ["max_seq_len=12345"])
    assert info.value.message.startswith("--set")


def test_atom_limits_apply_to_ca_npus():
    plan = build_plan("rebel100-1npu", ["npu=RBLN-CA25", "kvcache_partition_len=16384"])
    assert plan.npu_spec.family == "ATOM"
    assert plan.resolved.prefill_chunk_size == 128


def test_max_pixels_follows_the_largest_bucket():
    plan = build_plan("rebel100-1npu", ["visual.max_seq_len=[1024,4096]"])
    assert plan.processor.max_pixels == 4096 * 256
    plan = build_plan("rebel100-1npu", ["processor.max_pixels=16777216"])
    assert any("exceed the largest ViT bucket" in w for w in plan.warnings)
