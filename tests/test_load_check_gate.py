"""load-check gates an uncertain estimate as the dry run does, and phrases suggestions it cannot apply as the
command that applies them (audit D4)."""

from __future__ import annotations

import json
import shlex
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
    assert "--uncertain-ok" in line
    assert f"load with `qvl load-check {shared_card} --device 0 --visual-device 1 --no-runtime`" in line
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
    # a placement change: load-check's own flags, the whole placement, no recompile
    assert f"qvl load-check {shared_card} --device 0 --visual-device 1 --no-runtime" in applies
    recompiles = [a for a in applies if "--set" in a]
    assert recompiles and all(a.startswith(f"qvl compile --preset {PRESET} --set ") for a in recompiles)
    assert all(a.endswith(f" -o {shared_card} --force") for a in recompiles)  # rebuilds this artifact
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


def _as_written(command: str, capsys) -> tuple[int, dict]:
    """Run a suggested `qvl ...` command exactly as printed (with --json added)."""
    argv = shlex.split(command)
    assert argv[0] == "qvl"
    code, out, _ = run_main([*argv[1:], "--json"], capsys)
    return code, json.loads(out)


def test_placement_suggestion_keeps_the_users_lm_device_and_fits_as_written(shared_card, capsys):
    # audit N1: `--device 3 --visual-device 3` was told "qvl load-check --visual-device 0", which puts the LM back
    # on device 0 next to the ViT (uncertain again, exit 4); the suggestion is the whole placement it estimated
    args = ["load-check", str(shared_card), "--no-runtime", "--device", "3", "--visual-device", "3"]
    code, out, err = run_main([*args, "--json"], capsys)
    memory = json.loads(out)["memory"]
    assert code == 4 and memory["verdict"] == "uncertain"
    moves = [s for s in memory["suggestions"] if s["kind"] == "visual_device"]
    assert len(moves) == 1
    move = moves[0]
    apply = move["apply"]
    assert apply.startswith(f"qvl load-check {shared_card} --device 3 --visual-device ") and "--no-runtime" in apply
    vit = move["apply_placement"]["visual_device"]
    assert move["apply_placement"] == {"device": 3, "visual_device": vit} and vit != 3
    assert f"--visual-device {vit} " in apply + " " and "is an example" in move["text"]
    line = err.strip().splitlines()[-1]
    assert f"fix: load with `{apply}`" in line and "the id is an example" in line
    assert "fix: load with --visual-device" not in line
    code, data = _as_written(apply, capsys)  # exactly as written: it fits, as re-estimated
    assert code == 0 and data["ok"] is True, data["error"]
    assert data["placement"]["requested"] == {"device": 3, "visual_device": vit}
    assert data["memory"]["verdict"] == "fits" and data["memory"]["fits"] is True


def test_recompile_suggestions_and_the_gate_hint_rebuild_the_checked_artifact(shared_card, capsys):
    # audit N1: `qvl compile --preset P --set ... --force` with no -o rebuilt the preset's default output folder
    args = ["load-check", str(shared_card), "--no-runtime", "--device", "3", "--visual-device", "3"]
    code, out, err = run_main([*args, "--json"], capsys)
    recompiles = [s["apply"] for s in json.loads(out)["memory"]["suggestions"] if s["kind"] != "visual_device"]
    assert code == 4 and recompiles
    for apply in recompiles:
        argv = shlex.split(apply)
        assert argv[:4] == ["qvl", "compile", "--preset", PRESET] and argv[-1] == "--force"
        assert argv[argv.index("-o") + 1] == str(shared_card)
    line = err.strip().splitlines()[-1]
    assert f"recompile this artifact with `{recompiles[0]}`" in line
    code, out, _ = run_main(args, capsys)
    assert f"-o{shared_card}--force" in "".join(out.split())  # however the table wraps it


def test_a_layout_problem_names_the_recompile_of_this_artifact(shared_card, capsys):
    # audit N1: "recompile with `qvl compile --force`" rebuilt nothing in particular (no preset, no -o)
    (shared_card / "prefill.rbln").unlink()
    code, _, err = run_main(["load-check", str(shared_card), "--no-runtime"], capsys)
    line = err.strip().splitlines()[-1]
    assert code == 2 and f"recompile with `qvl compile --preset {PRESET} -o {shared_card} --force`" in line
