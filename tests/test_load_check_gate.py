"""load-check gates an uncertain estimate as the dry run does, and phrases suggestions it cannot apply as the
command that applies them (audit D4)."""

from __future__ import annotations

import json
import sys

import pytest

from qwenvl_rbln.artifacts.manifest import write_manifest
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import run_main, write_artifact

PRESET = "rebel100-8b-2npu-batch3"  # compiled with the ViT on NPU 1; --visual-device 0 is "uncertain" at the estimate


@pytest.fixture
def shared_card(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "optimum.rbln", None)
    monkeypatch.setitem(sys.modules, "rebel", None)
    plan = build_plan(PRESET)
    root = write_artifact(tmp_path / "art", plan)
    manifest = {"format": 1, "npu": plan.npu, "placement": plan.placement, "preset": {"name": plan.preset}}
    write_manifest(root, manifest)
    return root


def test_uncertain_exits_4_unless_uncertain_ok_and_never_says_ok(shared_card, capsys):
    args = ["load-check", str(shared_card), "--no-runtime", "--visual-device", "0"]
    code, out, err = run_main([*args, "--json"], capsys)
    data = json.loads(out)
    assert data["memory"]["verdict"] == "uncertain"
    assert code == 4 and data["ok"] is False and data["exit_code"] == 4
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"qvl: error: {shared_card}: the memory planner cannot tell whether this fits")
    assert "--uncertain-ok" in line and "load with --visual-device 1" in line
    code, out, _ = run_main(args, capsys)
    assert code == 4 and "load-check: ok" not in out and "load-check: failed" in out
    code, out, err = run_main([*args, "--uncertain-ok", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["ok"] is True, err
    assert data["accepted"] == ["memory uncertain at the estimate (accepted with --uncertain-ok)"]
    code, out, _ = run_main([*args, "--uncertain-ok"], capsys)
    last = " ".join(out.split()).rsplit("load-check:", 1)[1]
    assert code == 0 and last.startswith(" ok, with memory uncertain at the estimate (accepted with --uncertain-ok)")


def test_load_check_suggestions_are_commands_that_apply_them(shared_card, capsys):
    code, out, _ = run_main(["load-check", str(shared_card), "--no-runtime", "--visual-device", "0", "--json"], capsys)
    memory = json.loads(out)["memory"]
    applies = [s["apply"] for s in memory["suggestions"]]
    assert "qvl load-check --visual-device 1" in applies  # a placement change: load-check's own flag, no recompile
    recompiles = [a for a in applies if "--set" in a]
    assert recompiles and all(a.startswith(f"qvl compile --preset {PRESET} --set ") for a in recompiles)
    code, out, _ = run_main(["load-check", str(shared_card), "--no-runtime", "--visual-device", "0"], capsys)
    text = " ".join(out.split())
    assert "append to the same command" not in text
    assert "load-check has no --set: each line is the command that applies it" in text
    assert f"qvl compile --preset {PRESET} --set" in text


def test_dry_run_suggestions_keep_their_append_phrasing(capsys):
    sets = ["--set", "placement.visual_device=0"]
    code, out, _ = run_main(["compile", "--preset", PRESET, *sets, "--dry-run"], capsys)
    text = " ".join(out.split())
    assert code == 4 and "append to the same command" in text and "qvl compile --preset" not in text
