"""Preset loading: safe YAML, extends, --set parsing, and errors that name file, line and key."""

from __future__ import annotations

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.presets import load_preset, parse_set, parse_set_value


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_named_and_path_presets_agree():
    a = load_preset("rebel100-1npu")
    b = load_preset("configs/rebel100-1npu.yaml")
    assert a.data == b.data
    assert a.content_hash() == b.content_hash()


def test_extends_chain_merges_and_replaces_lists():
    loaded = load_preset("rebel100-2npu-batch4")
    assert loaded.chain == [
        "configs/rebel100-1npu.yaml",
        "configs/rebel100-1npu-batch4.yaml",
        "configs/rebel100-2npu-batch4.yaml",
    ]
    assert loaded.data["rbln_config"]["max_seq_len"] == 262144
    assert loaded.data["rbln_config"]["decoder_batch_sizes"] == [1, 2, 4]
    assert loaded.data["placement"] == {"device": 0, "visual_device": 1}
    assert loaded.source_of("rbln_config.max_seq_len") == "configs/rebel100-2npu-batch4.yaml"
    assert loaded.source_of("rbln_config.batch_size") == "configs/rebel100-1npu-batch4.yaml"


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "bad.yaml", "description: x\nrbln_config:\n  max_seq_len: [1, 2\n  batch_size: 4\n")
    with pytest.raises(InputError) as info:
        load_preset(path)
    assert "bad.yaml line" in info.value.message


def test_python_tags_are_refused_not_executed(tmp_path):
    path = write(tmp_path, "evil.yaml", "description: !!python/object/apply:os.system ['touch pwned']\n")
    with pytest.raises(InputError, match="YAML tag not allowed"):
        load_preset(path)
    assert not (tmp_path / "pwned").exists()


def test_unknown_top_level_key_suggests_closest(tmp_path):
    path = write(tmp_path, "typo.yaml", "extends: rebel100-1npu\nrbln_confg: {}\n")
    with pytest.raises(InputError) as info:
        load_preset(path)
    assert "unknown key 'rbln_confg'" in info.value.message
    assert "rbln_config" in info.value.hint


def test_unknown_placement_key(tmp_path):
    path = write(tmp_path, "p.yaml", "extends: rebel100-1npu\nplacement:\n  visual_dev: 1\n")
    with pytest.raises(InputError, match="placement.visual_dev"):
        load_preset(path)


def test_unknown_preset_lists_known_ones():
    with pytest.raises(InputError) as info:
        load_preset("rebel100-1npuu")
    assert "rebel100-1npu" in info.value.message
    assert "did you mean 'rebel100-1npu'" in info.value.hint


def test_missing_preset_file():
    with pytest.raises(InputError, match="does not exist"):
        load_preset("no/such/preset.yaml")


def test_extends_cycle(tmp_path):
    write(tmp_path, "a.yaml", "extends: b.yaml\n")
    write(tmp_path, "b.yaml", "extends: a.yaml\n")
    with pytest.raises(InputError, match="extends cycle: a.yaml -> b.yaml -> a.yaml"):
        load_preset(str(tmp_path / "a.yaml"))


def test_extends_self(tmp_path):
    path = write(tmp_path, "self.yaml", "extends: self.yaml\n")
    with pytest.raises(InputError, match="extends cycle"):
        load_preset(path)


def test_preset_must_be_a_mapping(tmp_path):
    with pytest.raises(InputError, match="must be a mapping"):
        load_preset(write(tmp_path, "list.yaml", "- a\n- b\n"))


@pytest.mark.parametrize(
    "raw, value",
    [
        ("4", 4),
        ("[1024,16384]", [1024, 16384]),
        ("true", True),
        ("off", False),
        ("null", None),
        ("0.8", 0.8),
        ("Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen3-VL-2B-Instruct"),
        ('"80%"', "80%"),
        ("80%", "80%"),
    ],
)
def test_set_values(raw, value):
    assert parse_set_value(raw) == value


@pytest.mark.parametrize("item", ["max_seq_len", "=4", "a..b=1", "visual.max_seq_len=[1024,", "x.=3"])
def test_malformed_set(item):
    with pytest.raises(InputError):
        parse_set(item)


def test_set_routes_top_level_keys():
    assert parse_set("model=/tmp/m")[0] == ["model"]
    assert parse_set("placement.device=1")[0] == ["placement", "device"]
    assert parse_set("visual.max_seq_len=4096")[0] == ["rbln_config", "visual", "max_seq_len"]


def test_set_into_a_scalar_is_an_error():
    with pytest.raises(InputError, match="not a mapping"):
        load_preset("rebel100-1npu", ["max_seq_len.x=1"])


# --- deprecated spellings are rewritten per source, before the merge -------------------------------------


def test_old_spelling_in_a_child_file_overrides_the_parent(tmp_path):
    path = write(
        tmp_path, "old.yaml", "extends: rebel100-1npu\nrbln_config:\n  visual:\n    max_seq_lens: [1024, 16384]\n"
    )
    loaded = load_preset(path)
    visual = loaded.data["rbln_config"]["visual"]
    assert visual["max_seq_len"] == [1024, 16384] and "max_seq_lens" not in visual
    assert loaded.source_of("rbln_config.visual.max_seq_len").endswith("old.yaml")
    assert any("old.yaml: rbln_config.visual.max_seq_lens" in w and "rewritten" in w for w in loaded.warnings)


def test_old_spelling_in_set_overrides_the_preset():
    loaded = load_preset("rebel100-1npu", ["visual.max_seq_lens=[1024,16384]", "tensor_parallel_size=1"])
    assert loaded.data["rbln_config"]["visual"]["max_seq_len"] == [1024, 16384]
    assert "tensor_parallel_size" not in loaded.data["rbln_config"]
    assert loaded.source_of("rbln_config.visual.max_seq_len") == "--set"
    assert load_preset("rebel100-1npu", ['visual={"max_seq_lens": [1024]}']).data["rbln_config"]["visual"] == {
        "max_seq_len": [1024]
    }


def test_old_spelling_keeps_the_key_order(tmp_path):
    path = write(tmp_path, "tp.yaml", "extends: rebel100-1npu\nrbln_config:\n  tensor_parallel_size: 1\n")
    assert list(load_preset(path).data["rbln_config"]) == list(load_preset("rebel100-1npu").data["rbln_config"])


def test_deprecation_warnings_say_what_0_12_does():
    removed = load_preset("rebel100-1npu", ["visual.max_seq_lens=[1024]"]).warnings
    assert any("0.12 refuses it" in w for w in removed), removed
    for key in ("tensor_parallel_size=1", "visual.tensor_parallel_size=1", '_torch_dtype="bfloat16"'):
        warnings = load_preset("rebel100-1npu", [key]).warnings
        assert any("0.12 still accepts it with a warning, and 0.13 removes it" in w for w in warnings), warnings
        assert not any("rejects" in w or "refuses" in w for w in warnings), warnings


@pytest.mark.parametrize(
    "text",
    [
        "extends: rebel100-1npu\nrbln_config:\n  visual:\n    max_seq_len: 1024\n    max_seq_lens: [1024]\n",
        "extends: rebel100-1npu\nrbln_config:\n  num_devices: 1\n  tensor_parallel_size: 1\n",
    ],
)
def test_both_spellings_in_one_file_is_an_error(tmp_path, text):
    with pytest.raises(InputError, match=r"both\.yaml: both .* \(deprecated\) and .* are set"):
        load_preset(write(tmp_path, "both.yaml", text))


@pytest.mark.parametrize(
    "sets",
    [
        ['visual={"max_seq_len": 1024, "max_seq_lens": [1024]}'],
        ["visual.max_seq_len=1024", "visual.max_seq_lens=[1024]"],
        ["tensor_parallel_size=1", "num_devices=1"],
    ],
)
def test_both_spellings_on_the_command_line_is_an_error(sets):
    with pytest.raises(InputError, match="deprecated"):
        load_preset("rebel100-1npu", sets)


# --- --set edge cases ----------------------------------------------------------------------------------


@pytest.mark.parametrize("item", ["extends=cpu-tiny", "extends.x=1"])
def test_set_extends_is_refused(item):
    with pytest.raises(InputError) as info:
        parse_set(item)
    assert "extends cannot be changed with --set" in info.value.message
    assert "--preset" in info.value.hint


@pytest.mark.parametrize("item", ["model=", "model=  ", "visual.max_seq_len="])
def test_empty_set_value_says_so(item):
    with pytest.raises(InputError) as info:
        parse_set(item)
    assert "has no value" in info.value.message and "JSON" not in info.value.message
    assert "null" in info.value.hint
    with pytest.raises(InputError, match="empty"):
        parse_set_value("")


def test_empty_json_string_is_still_a_value():
    assert parse_set('description=""') == (["description"], "")


# --- YAML: where an unclosed construct opens; duplicate keys ---------------------------------------------


def test_unclosed_bracket_names_the_line_it_opens(tmp_path):
    path = write(tmp_path, "open.yaml", "description: x\nrbln_config:\n  visual:\n    max_seq_len: [1, 2\n")
    with pytest.raises(InputError) as info:
        load_preset(path)
    assert "flow sequence that starts at line 4 column 18" in info.value.message
    assert "line 4" in info.value.hint


def test_unclosed_quote_names_the_line_it_opens(tmp_path):
    path = write(tmp_path, "quote.yaml", 'description: "never closed\nbackend: rbln\nnpu: RBLN-CR13\n')
    with pytest.raises(InputError) as info:
        load_preset(path)
    assert "quoted scalar that starts at line 1 column 14" in info.value.message


@pytest.mark.parametrize(
    "text, key, line, first",
    [
        ("extends: rebel100-1npu\nnpu: RBLN-CR13\nnpu: RBLN-CA25\n", "npu", 3, 2),
        (
            "extends: rebel100-1npu\nrbln_config:\n  batch_size: 1\n  max_seq_len: 32768\n  batch_size: 4\n",
            "batch_size",
            5,
            3,
        ),
        (
            "extends: rebel100-1npu\nrbln_config: {visual: {max_seq_len: 1024, max_seq_len: 4096}}\n",
            "max_seq_len",
            2,
            2,
        ),
    ],
)
def test_duplicate_keys_are_refused(tmp_path, text, key, line, first):
    with pytest.raises(InputError) as info:
        load_preset(write(tmp_path, "dup.yaml", text))
    assert f"dup.yaml line {line}: duplicate key '{key}' (already given at line {first})" in info.value.message
    assert info.value.hint


def test_same_key_in_different_mappings_and_merge_overrides_are_fine(tmp_path):
    text = (
        "extends: rebel100-1npu\n"
        "rbln_config:\n"
        "  max_seq_len: 32768\n"
        "  quantization: &q {format: rbln, weights: fp16}\n"
        "  lora_config: {<<: *q, weights: fp8, max_seq_len: 1}\n"
    )
    data = load_preset(write(tmp_path, "ok.yaml", text)).data["rbln_config"]
    assert data["lora_config"] == {"format": "rbln", "weights": "fp8", "max_seq_len": 1}


def test_duplicate_keys_use_the_c_loader_when_present():
    import yaml

    from qwenvl_rbln.planning.presets import _loader_class

    cls = _loader_class(yaml)
    assert issubclass(cls, getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert _loader_class(yaml) is cls  # built once
    assert not issubclass(yaml.SafeLoader, cls)  # PyYAML's own loader is left alone
