"""Presets resolve to exactly the product document's rbln_config dicts, and every optimum-rbln rule holds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.planning.presets import list_preset_files

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
        "attn_impl",  # said in the preset: optimum-rbln warns when it has to switch to flash_attn itself
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
    plan = build_plan("rebel100-1npu", model="qwen/qwen3-vl-2b-instruct")  # hub ids are case-insensitive
    assert plan.geometry.text.num_hidden_layers == 28 and "built-in" in plan.geometry.source


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


def test_deprecated_and_new_both_set_is_an_error(tmp_path):
    preset = tmp_path / "both.yaml"
    preset.write_text(
        "extends: rebel100-1npu\nrbln_config:\n  visual:\n    max_seq_len: 1024\n    max_seq_lens: [1024]\n"
    )
    with pytest.raises(InputError, match="both"):
        build_plan(str(preset))


@pytest.mark.parametrize("preset", sorted(GOLDEN_NAMES := [n for n in GOLDEN if not n.startswith("_")]))
def test_deprecated_spelling_works_on_every_shipped_preset(preset, tmp_path):
    """The parent's max_seq_len is overridden by the old spelling in --set or in a child file, with a warning."""
    plan = build_plan(preset, ["visual.max_seq_lens=[1024,4096]"])
    assert plan.rbln_config["visual"]["max_seq_len"] == [1024, 4096]
    assert "max_seq_lens" not in plan.rbln_config["visual"]
    assert any("rewritten to rbln_config.visual.max_seq_len" in w for w in plan.warnings)
    child = tmp_path / "child.yaml"
    child.write_text(f"extends: {preset}\nrbln_config: {{visual: {{max_seq_lens: [1024, 4096]}}}}\n")
    assert build_plan(str(child)).rbln_config["visual"]["max_seq_len"] == [1024, 4096]
    tp = build_plan(preset, ["tensor_parallel_size=1"])
    assert "tensor_parallel_size" not in tp.rbln_config and tp.rbln_config["num_devices"] == 1


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
        (["kvcache_partition_len=null", "attn_impl=null", "max_seq_len=32768"], "limit of 16384 for eager"),
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
        (["memory_budget=200GB"], "exceeds the target NPU's available DRAM"),
        (["memory_budget=1"], "memory_budget=1 is 1 byte"),
        (["memory_budget=2"], r"write '2%' \(or 0.02\)"),  # not 2.0, which is refused as a fraction
        (['memory_budget="1000"'], "memory_budget='1000' is 1000 byte"),
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
        (
            ['device_map={"prefill": -1}'],
            r"rbln_config\.device_map=\{'prefill': -1\} is not read.*placement\.device",
        ),
        (["device_map=[0]"], r"rbln_config\.device_map=\[0\] is not read.*placement\.device"),
        (
            ['visual.device_map={"compiled_model": 2}'],
            r"visual\.device_map=\{'compiled_model': 2\} is not.*placement\.visual_device",
        ),
        (["device=3"], r"rbln_config\.device=3 is not read from rbln_config.*set placement\.device instead"),
        (["device=[0,1]"], r"rbln_config\.device=\[0, 1\] is not read.*placement\.device"),
        (["visual.device=2"], r"rbln_config\.visual\.device=2 is not read.*set placement\.visual_device instead"),
        (["num_devices=2", "placement.device=[0,1,2]"], r"placement\.device=\[0, 1, 2\] lists 3 device\(s\) but"),
        (["placement.device=[0,1]"], r"placement\.device=\[0, 1\] lists 2 .* rbln_config\.num_devices is 1"),
        (
            ["num_devices=2", "placement.device=[2,3]", "placement.visual_device=null"],
            r"placement\.visual_device \(defaults to placement\.device\)=\[2, 3\] lists 2",
        ),
        (['visual.npu="RBLN-CA25"'], r"rbln_config\.visual\.npu='RBLN-CA25' but the target npu is 'RBLN-CR13'"),
        (['npu="RBLN-CA25"', 'visual.npu="RBLN-CR13"'], r"visual\.npu='RBLN-CR13' but the target npu is 'RBLN-CA25'"),
        (["zzzz=1"], r"valid keys under rbln_config: .*max_seq_len.*kvcache_partition_len"),
        (["visual.zzzz=1"], r"valid keys under rbln_config\.visual: .*max_seq_len"),
        (['optimum_rbln_version="0.12.0"'], r"optimum_rbln_version' is not a setting: optimum-rbln records"),
        (["cache_metas=[]"], r"cache_metas' is not a setting: optimum-rbln computes"),
        (["kvcache_metas=[]"], r"kvcache_metas' is not a setting.*deprecated name of cache_metas"),
        (['visual.cls_name="X"'], r"visual\.cls_name' is not a setting"),
    ],
)
def test_validation_messages(sets, match):
    with pytest.raises(InputError) as info:
        build_plan("rebel100-1npu", sets)
    text = info.value.one_line()
    assert re.search(match, text), text
    assert "presets show" not in text  # it lists no keys
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


def test_unknown_keys_say_optimum_refuses_only_truly_unknown_ones():
    with pytest.raises(InputError) as info:
        build_plan("rebel100-1npu", ["max_seq_length=4096"])
    assert "optimum-rbln 0.12 refuses it" in info.value.message
    for written in ('optimum_rbln_version="0.12.0"', "cache_metas=[]", "kvcache_metas=[]"):
        with pytest.raises(InputError) as info:
            build_plan("rebel100-1npu", [written])
        assert "refuses" not in info.value.message and "rejects" not in info.value.message, info.value.message


def test_torch_dtype_is_rewritten_to_dtype():
    plan = build_plan("rebel100-1npu", ['_torch_dtype="bfloat16"'])
    assert plan.rbln_config["dtype"] == "bfloat16" and "_torch_dtype" not in plan.rbln_config
    assert any("_torch_dtype is deprecated" in w for w in plan.warnings)


def test_device_map_is_refused_even_with_valid_ids():
    """A per-graph device_map would put graphs where the memory planner does not look: placement.* instead."""
    with pytest.raises(InputError) as exc:
        build_plan("rebel100-1npu", ['device_map={"prefill": 0, "decoder_batch_1": [0]}'])
    line = exc.value.one_line()
    assert "rbln_config.device_map" in line and "placement.device" in line and "\n" not in line


def test_int_device_with_num_devices_expands_to_consecutive_ids():
    from qwenvl_rbln.memory.planner import estimate_plan

    plan = build_plan("rebel100-1npu", ["num_devices=2", "placement.device=2", "placement.visual_device=null"])
    assert plan.placement == {"device": [2, 3], "visual_device": 2}
    assert plan.load_rbln_config == {"visual": {"device": 2}, "device": [2, 3]}
    assert any(
        "placement.device=2 with rbln_config.num_devices=2: placed on devices [2, 3]" in w for w in plan.warnings
    )
    assert sorted(d.device for d in estimate_plan(plan).devices) == [2, 3]  # the planner sees both shards

    plan = build_plan("rebel100-1npu", ["visual.num_devices=2", "placement.visual_device=1"])
    assert plan.placement == {"device": 0, "visual_device": [1, 2]}
    assert plan.load_rbln_config["visual"] == {"device": [1, 2]}

    plan = build_plan("rebel100-1npu", ["num_devices=2", "placement.device=[5,3]"])
    assert plan.placement["device"] == [5, 3]  # an explicit list is kept as given
    assert not any("placed on devices" in w for w in plan.warnings)


def test_num_devices_1_keeps_an_int_device():
    plan = build_plan("rebel100-2npu-batch4")
    assert plan.placement == {"device": 0, "visual_device": 1}
    assert not any("placed on devices" in w for w in plan.warnings)


def test_too_small_vit_bucket_names_the_bucket_not_min_pixels():
    with pytest.raises(InputError) as info:
        build_plan("rebel100-1npu", ["visual.max_seq_len=128"])
    err = info.value
    assert err.message.startswith("--set: visual.max_seq_len=128")
    assert "caps processor.max_pixels at 32768" in err.message and "min_pixels=65536" in err.message
    assert "--set visual.max_seq_len=256" in err.hint and "lower min_pixels" not in err.hint
    # min_pixels 70000 -> 274 patches -> 276, the next multiple of 4
    with pytest.raises(InputError) as info:
        build_plan("rebel100-1npu", ["visual.max_seq_len=[64,128]", "processor.min_pixels=70000"])
    assert "at least 276 patches" in info.value.hint
    assert "(from --set)" in info.value.message
    # an explicit max_pixels below min_pixels is still about the processor keys
    with pytest.raises(InputError, match="processor.min_pixels=65536 is above max_pixels=1000"):
        build_plan("rebel100-1npu", ["processor.max_pixels=1000"])


def test_empty_model_flag_is_refused():
    with pytest.raises(InputError) as info:
        build_plan("rebel100-1npu", model="")
    assert "--model" in info.value.message and info.value.hint
    with pytest.raises(InputError, match="--model"):
        build_plan("rebel100-1npu", model="   ")


@pytest.mark.parametrize(
    "args, code, needle",
    [
        (["--set", "visual.max_seq_lens=[1024,16384]"], 0, "rewritten to rbln_config.visual.max_seq_len"),
        (["--set", "device=3"], 2, "placement.device"),
        (["--set", "extends=cpu-tiny"], 2, "--preset"),
        (["--set", "model="], 2, "has no value"),
        (["--model", ""], 2, "--model"),
    ],
)
def test_repros_through_the_cli(args, code, needle):
    from tests.helpers_cli import run_qvl

    r = run_qvl("compile", "--preset", "rebel100-1npu", "--dry-run", *args, timeout=120)
    assert r.exit_code == code, r.stderr[-800:]
    assert needle in r.stderr, r.stderr[-800:]
    if code == 2:
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("qvl: error:"), r.stderr


def test_an_npu_conflict_names_where_the_override_came_from():
    with pytest.raises(InputError) as info:
        build_plan("rebel100-1npu", ["rbln_config.npu=RBLN-CA25"])
    assert info.value.one_line().startswith("--set: npu='RBLN-CR13' but rbln_config.npu='RBLN-CA25'")
