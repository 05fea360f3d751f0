"""`qvl tiny-model --shape 8b` (model id qvl:tiny-8b): its own directory, marker and id, reused like the other
variants, and never mistaken for the 2B-shaped tiny model or the tiny MoE."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.helpers_cli import run_qvl  # noqa: E402


def test_tiny_model_shape_8b_cli(tmp_path: Path):
    res = run_qvl("tiny-model", str(tmp_path / "m"), "--shape", "8b", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["shape"] == "8b" and data["moe"] is False and data["created"] is True
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False and cfg["architectures"] == ["Qwen3VLForConditionalGeneration"]
    assert cfg["vision_config"]["hidden_size"] == 48 and cfg["vision_config"]["out_hidden_size"] == 64
    marker = json.loads((tmp_path / "m" / "qvl_tiny_model.json").read_text())
    assert marker["shape"] == "8b" and "moe" not in marker
    again = run_qvl("tiny-model", str(tmp_path / "m"), "--shape", "8b", "--json")
    assert json.loads(again.stdout)["created"] is False
    dense = run_qvl("tiny-model", str(tmp_path / "m"), "--json")  # another variant in the same place: --force
    assert dense.exit_code == 2 and "8b shape, seed 0" in dense.stderr and "--force" in dense.stderr


@pytest.mark.parametrize(
    ("args", "words"), [(["--shape", "4b"], "'4b' is not one of 2b, 8b"), (["--moe", "--shape", "8b"], "not both")]
)
def test_unknown_or_combined_shapes_are_refused(tmp_path: Path, args: list[str], words: str):
    res = run_qvl("tiny-model", str(tmp_path / "m"), *args)
    assert res.exit_code == 2 and words in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "m").exists()


def test_the_id_resolves_to_its_own_directory_and_geometry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from qwenvl_rbln.planning.catalogue import modelinfo as mi

    monkeypatch.setenv("QVL_HOME", str(tmp_path))
    assert mi.resolve_model_path(mi.TINY_8B_MODEL_ID) == tmp_path / "tiny-qwen3-vl-8b"
    assert mi.resolve_model_path(mi.TINY_MODEL_ID) == tmp_path / "tiny-qwen3-vl"
    assert mi.resolve_model_path(mi.TINY_MOE_MODEL_ID) == tmp_path / "tiny-qwen3-vl-moe"
    geometry, _ = mi.load_geometry(mi.TINY_8B_MODEL_ID)  # not created yet: the built-in numbers
    assert geometry.source.startswith("built-in") and geometry.vision == mi.QWEN3_VL_TINY_8B.vision
    assert not geometry.text.tie_word_embeddings
