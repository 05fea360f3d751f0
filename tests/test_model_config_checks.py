"""A corrupt config.json (a local directory or the Hugging Face cache) is refused in one line naming the file, the
key and the value: the planner builds every shape from these counts, so -4 layers once gave negative memory and
'fits'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_8B, QWEN3_VL_30B_A3B
from tests.fakes_rbln import config_of, run_main
from tests.moe_configs import config_json
from tests.test_family import hub_cache, make_hub_cache  # noqa: F401 - hub_cache is a fixture

BAD = [
    ("text_config", "num_hidden_layers", -4),
    ("text_config", "num_hidden_layers", 36.5),
    ("text_config", "num_key_value_heads", 0),
    ("text_config", "hidden_size", "4096"),
    ("text_config", "head_dim", -128),
    ("text_config", "vocab_size", 0),
    ("vision_config", "depth", -27),
    ("vision_config", "hidden_size", 0),
    ("vision_config", "spatial_merge_size", -2),
]


def _corrupt(cfg: dict, section: str, key: str, value: object) -> dict:
    return {**cfg, section: {**cfg[section], key: value}}


def _refused(argv: list[str], capsys, *needles: str) -> str:
    code, out, err = run_main(argv, capsys)
    assert code == 2, (out, err)
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    for needle in needles:
        assert needle in line, line
    return line


@pytest.mark.parametrize(("section", "key", "value"), BAD)
def test_a_corrupt_local_config_is_refused_naming_file_key_and_value(tmp_path: Path, capsys, section, key, value):
    model = tmp_path / "Neg"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(_corrupt(config_of(QWEN3_VL_8B), section, key, value)))
    argv = ["compile", "--preset", "rebel100-8b", "--model", str(model), "--dry-run"]
    _refused(argv, capsys, str(model / "config.json"), f"{section}.{key}={value!r}", "positive integer")


def test_a_corrupt_cached_config_is_refused_too(hub_cache, capsys):  # noqa: F811 - the fixture
    snap = make_hub_cache(
        hub_cache, "acme/Neg", _corrupt(config_of(QWEN3_VL_8B), "text_config", "num_hidden_layers", -4)
    )
    argv = ["compile", "--preset", "rebel100-8b", "--model", "acme/Neg", "--dry-run"]
    _refused(argv, capsys, str(snap / "config.json"), "text_config.num_hidden_layers=-4")


@pytest.mark.parametrize(
    ("key", "value"), [("num_experts", 0), ("num_experts_per_tok", -2), ("moe_intermediate_size", 0)]
)
def test_a_corrupt_moe_config_is_refused(tmp_path: Path, capsys, key, value):
    model = tmp_path / "NegMoE"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(_corrupt(config_json(QWEN3_VL_30B_A3B), "text_config", key, value)))
    argv = ["compile", "--preset", "rebel100-30b-a3b", "--model", str(model), "--dry-run"]
    _refused(argv, capsys, str(model / "config.json"), f"text_config.{key}={value!r}")


def test_a_whole_float_count_is_read_as_the_count(tmp_path: Path, capsys):
    model = tmp_path / "Float"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(_corrupt(config_of(QWEN3_VL_8B), "text_config", "num_hidden_layers", 36.0))
    )
    code, _, err = run_main(["compile", "--preset", "rebel100-8b", "--model", str(model), "--dry-run"], capsys)
    assert code == 0, err
