"""A --device/--visual-device remap gets load-check's own memory check and the compile gate (audit D5): an artifact
compiled with the ViT on its own NPU, remapped to share one card, is not served silently."""

from __future__ import annotations

import json

import pytest

from qwenvl_rbln.artifacts.manifest import write_manifest
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import run_main, write_artifact


@pytest.fixture
def no_exec(monkeypatch):
    monkeypatch.setattr("os.execvpe", lambda *a, **k: pytest.fail("exec attempted"))


def artifact(tmp_path, preset: str):
    plan = build_plan(preset)
    root = write_artifact(tmp_path / preset, plan)
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "m/m"}})
    return root


def serve(capsys, *args: str) -> tuple[int, str, str]:
    return run_main(["serve", *args, "--dry-run", "--json"], capsys)


def error_of(code: int, out: str, err: str) -> str:
    assert code == 4, (code, err)
    assert "Traceback" not in err
    return json.loads(out)["error"]["message"] if out.strip() else err


def test_the_audits_remap_is_uncertain_and_stops_unless_uncertain_ok(tmp_path, capsys, no_exec):
    root = artifact(tmp_path, "rebel100-8b-2npu-batch3")  # ViT on NPU 1, LM on NPU 0
    message = error_of(*serve(capsys, str(root), "--device", "3", "--visual-device", "3"))
    assert "--device 3 --visual-device 3" in message and "load-check's memory check" in message
    assert "uncertain" in message and "--uncertain-ok" in message
    code, out, err = serve(capsys, str(root), "--device", "3", "--visual-device", "3", "--uncertain-ok")
    assert code == 0, err
    (memory,) = [c for c in json.loads(out)["checks"] if c["check"] == "memory"]
    assert "uncertain" in memory["detail"]


def test_a_remap_that_does_not_fit_exits_4_even_with_uncertain_ok(tmp_path, capsys, no_exec):
    root = artifact(tmp_path, "rebel100-2npu-batch4")
    for extra in ([], ["--uncertain-ok"]):
        code, out, err = run_main(
            ["serve", str(root), "--device", "3", "--visual-device", "3", "--dry-run", *extra], capsys
        )
        assert code == 4, err
        line = err.strip().splitlines()[-1]
        assert "predicts this will not fit" in line and "qvl load-check" in line


def test_remaps_that_fit_are_served_and_the_compiled_placement_is_not_rechecked(tmp_path, capsys, no_exec):
    root = artifact(tmp_path, "rebel100-2npu-batch4")
    code, out, err = serve(capsys, str(root), "--device", "3", "--visual-device", "4")
    assert code == 0, err
    (memory,) = [c for c in json.loads(out)["checks"] if c["check"] == "memory"]
    assert memory["ok"] and "fits" in memory["detail"]
    code, out, err = serve(capsys, str(root), "--device", "0", "--visual-device", "1")  # as compiled
    assert code == 0, err
    assert not [c for c in json.loads(out)["checks"] if c["check"] == "memory"]
