"""Preset loading: safe YAML, extends, --set parsing, and errors that name file, line and key."""

from __future__ import annotations

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.presets import load_preset, parse_set, parse_set_value


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
