"""Qwen3-VL-MoE where a user meets it: serve and load-check accept the MoE config class and name the MoE numbers
(ViT depth 27, out_hidden_size 2048 for 30B-A3B), bucket-plan computes with them, `qvl tiny-model --moe` writes the
tiny MoE, and a non-Qwen3-VL cls_name is still refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qwenvl_rbln.artifacts.manifest import write_manifest
from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_30B_A3B
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import rbln_config_json, run_main, write_artifact
from tests.helpers_cli import run_qvl
from tests.moe_configs import config_json

MOE_CLS = "RBLNQwen3VLMoeForConditionalGenerationConfig"


@pytest.fixture
def moe_art(tmp_path: Path) -> Path:
    """A compiled-looking rebel100-30b-a3b artifact in optimum-rbln 0.12's layout (fake graphs)."""
    plan = build_plan("rebel100-30b-a3b")
    cfg = rbln_config_json(plan)
    cfg["cls_name"] = MOE_CLS
    cfg["visual"]["cls_name"] = "RBLNQwen3VLMoeVisionModelConfig"
    root = write_artifact(tmp_path / "art", plan, config=config_json(QWEN3_VL_30B_A3B), cfg=cfg)
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": plan.model_id}})
    return root


@pytest.fixture
def no_exec(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError(f"exec was attempted: {args[:2]}")

    monkeypatch.setattr(os, "execvpe", boom)


def test_serve_accepts_the_moe_artifact_and_names_its_numbers(moe_art, capsys, no_exec):
    code, out, err = run_main(["serve", str(moe_art), "--dry-run", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    checks = {c["check"]: c["detail"] for c in data["checks"]}
    assert checks["cls_name"] == MOE_CLS
    assert "ViT depth 27" in checks["model"] and "out_hidden_size 2048" in checks["model"]
    assert "128 experts, top 8" in checks["model"]
    argv = data["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "3" and argv[argv.index("--max-model-len") + 1] == "262144"
    assert argv[argv.index("--served-model-name") + 1] == "Qwen/Qwen3-VL-30B-A3B-Instruct"
    assert json.loads(argv[argv.index("--mm-processor-kwargs") + 1])["max_pixels"] == 4096 * 16 * 16


def test_serve_still_refuses_another_model_class(moe_art, capsys, no_exec):
    cfg_path = moe_art / "rbln_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["cls_name"] = "RBLNLlamaForCausalLMConfig"
    cfg_path.write_text(json.dumps(cfg))
    code, _, err = run_main(["serve", str(moe_art), "--dry-run"], capsys)
    assert code == 2 and "RBLNLlamaForCausalLMConfig" in err and MOE_CLS in err


def test_load_check_accepts_the_moe_artifact_and_plans_it_as_moe(moe_art, capsys):
    code, out, err = run_main(["load-check", str(moe_art), "--no-runtime", "--json"], capsys)
    data = json.loads(out)
    assert not data["layout"]["problems"], data["layout"]
    assert "ViT depth 27" in data["target"]["model_moe"] and "out_hidden_size 2048" in data["target"]["model_moe"]
    items = {i["name"]: i for i in data["memory"]["devices"][0]["items"]}
    assert "lm.moe_workspace" in items and items["lm.weights"]["bytes"] == 60_441_915_392
    code, out, _ = run_main(["load-check", str(moe_art), "--no-runtime"], capsys)
    assert "Qwen3-VL-MoE" in out and "ViT depth 27" in out


def test_bucket_plan_uses_the_moe_vision_tower(capsys):
    moe = run_qvl("bucket-plan", "--preset", "rebel100-30b-a3b", "--size", "640x480", "--json")
    dense = run_qvl(
        "bucket-plan",
        "--preset",
        "rebel100-1npu",
        "--size",
        "640x480",
        "--json",
        "--set",
        "visual.max_seq_len=[1024,4096]",
    )
    assert moe.exit_code == 0, moe.stderr
    s, d = json.loads(moe.stdout)["summary"], json.loads(dense.stdout)["summary"]
    assert "ViT depth 27" in s["model_moe"] and "model_moe" not in d
    flops = {r["bucket"]: r["flops_per_call"] for r in s["buckets"]}
    dense_flops = {r["bucket"]: r["flops_per_call"] for r in d["buckets"]}
    assert flops[4096] > dense_flops[4096]  # 27 blocks of hidden 1152 against the 2B's 24 of 1024
    human = run_qvl("bucket-plan", "--preset", "rebel100-30b-a3b", "--size", "640x480")
    assert "out_hidden_size 2048" in human.stdout


def test_tiny_model_moe_cli(tmp_path: Path):
    res = run_qvl("tiny-model", str(tmp_path / "m"), "--moe", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["moe"] is True and data["created"] is True
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_vl_moe" and cfg["architectures"] == ["Qwen3VLMoeForConditionalGeneration"]
    text = cfg["text_config"]
    assert text["num_experts_per_tok"] < text.get("num_experts", text.get("num_local_experts"))
    assert text["mlp_only_layers"] == [1]
    marker = json.loads((tmp_path / "m" / "qvl_tiny_model.json").read_text())
    assert marker["moe"] is True
    again = run_qvl("tiny-model", str(tmp_path / "m"), "--moe", "--json")
    assert json.loads(again.stdout)["created"] is False
    dense = run_qvl("tiny-model", str(tmp_path / "m"), "--json")  # another variant in the same place: --force
    assert dense.exit_code == 2 and "--force" in dense.stderr


def test_reference_backend_compiles_and_loads_the_tiny_moe(tmp_path: Path, capsys):
    """cpu-tiny-moe (torch backend): the artifact records the MoE config class, load-check loads it with
    transformers' Qwen3VLMoeForConditionalGeneration."""
    out = tmp_path / "ref"
    res = run_qvl("compile", "--preset", "cpu-tiny-moe", "-o", str(out), "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads((out / "qvl-rbln-config.json").read_text())["cls_name"] == MOE_CLS
    code, stdout, err = run_main(["load-check", str(out), "--json"], capsys)
    assert code == 0, err
    data = json.loads(stdout)
    assert data["runtime"]["ok"] is True and data["runtime"]["class"] == "Qwen3VLMoeForConditionalGeneration"
    assert "4 experts, top 2" in data["target"]["model_moe"]
