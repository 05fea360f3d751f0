"""A fleet replica's placement moved onto its own NPUs (serving/fleet.py ``_remapped``; audit 2026-12-06, mutant
L11): the LM and the ViT each land on this replica's physical NPU at the compiled position, and the dry run's
placement line says so. Dry runs and pure functions; no engine."""

from __future__ import annotations

import json

import pytest

from qwenvl_rbln.serving.fleet import _remapped
from tests.fakes_rbln import run_main
from tests.test_serve_emulate import emulated_artifact


def test_a_placement_is_moved_position_for_position_onto_the_replicas_npus():
    two = {"device": 0, "visual_device": 1, "visible": [0, 1], "source": "qvl-manifest.json"}
    assert _remapped(two, [6, 7]) == {
        "device": 6,
        "visual_device": 7,
        "visible": [6, 7],
        "source": "qvl-manifest.json, moved to this replica's NPUs",
    }
    wide = {"device": [0, 1], "visual_device": 1, "visible": [0, 1], "source": "s"}
    assert (_remapped(wide, [2, 3])["device"], _remapped(wide, [2, 3])["visual_device"]) == ([2, 3], 3)


def test_the_dry_runs_placement_line_names_the_replicas_npu(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("os.execvpe", lambda *a, **k: pytest.fail("exec attempted"))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    art = emulated_artifact(tmp_path / "emu")
    code, out, err = run_main(["serve", str(art), "--emulate", "--devices", "1,3", "--dry-run", "--json"], capsys)
    assert code == 0, err
    (line,) = [c["detail"] for c in json.loads(out)["checks"] if c["check"] == "placement"]
    assert line.startswith("LM on NPU 1, ViT on NPU 1 (") and "RBLN_DEVICES=1;" in line
