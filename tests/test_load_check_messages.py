"""load-check's and fix-processor's messages as a user reads them (audit 2026-12-04 L10: JSON's spelling, never
Python's `None`; key paths that are paths), fix-processor's backup names (mutation F1) and its manifest rewrite
through processor_files.rehash."""

from __future__ import annotations

import json
import sys

import pytest

from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME, write_manifest
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import run_main, write_artifact

CHECKPOINT_PROCESSOR = {  # the shipped checkpoint's processor_config.json: one file, two sections
    "image_processor": {
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "size": {"shortest_edge": 65536, "longest_edge": 16777216},
        "patch_size": 16,
        "merge_size": 2,
        "temporal_patch_size": 2,
    },
    "video_processor": {
        "video_processor_type": "Qwen3VLVideoProcessor",
        "size": {"shortest_edge": 4096, "longest_edge": 25165824},
        "fps": 2,
        "patch_size": 16,
    },
}


@pytest.fixture(autouse=True)
def no_npu_stack(monkeypatch):
    monkeypatch.setitem(sys.modules, "optimum.rbln", None)
    monkeypatch.setitem(sys.modules, "rebel", None)


def _artifact(tmp_path, *, manifest: bool = False):
    plan = build_plan("rebel100-1npu")
    root = write_artifact(tmp_path / "art", plan)
    (root / "processor_config.json").write_text(json.dumps(CHECKPOINT_PROCESSOR, indent=2))
    if manifest:
        write_manifest(root, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "m"}})
    return root


def test_load_check_names_a_missing_key_by_its_path(tmp_path, capsys):
    """L10: `processor_config.json video_processor.no qvl_max_frame_pixels with size.longest_edge=...` read as a key
    path `video_processor.no qvl_max_frame_pixels`."""
    root = _artifact(tmp_path)
    code, out, err = run_main(["load-check", str(root), "--no-runtime", "--json"], capsys)
    assert code == 0, err
    image, video = json.loads(out)["processor"]["warnings"]
    assert image.startswith("processor_config.json image_processor.size.longest_edge=16777216 lets images exceed")
    assert video.startswith(
        "processor_config.json has no video_processor.qvl_max_frame_pixels (video_processor.size.longest_edge=25165824)"
    )
    assert ".no " not in video and "None" not in image + video


def test_fix_processor_shows_old_values_as_json_and_an_absent_key_as_not_set(tmp_path, capsys):
    """L10: `video_processor.qvl_max_frame_pixels: None -> 1048576` (Python's spelling, for a key that was absent)."""
    root = _artifact(tmp_path)
    code, out, err = run_main(["fix-processor", str(root), "--dry-run"], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "video_processor.qvl_max_frame_pixels: (not set) -> 4194304" in text
    assert "image_processor.size.longest_edge: 16777216 -> 4194304" in text
    assert "None" not in out
    code, out, err = run_main(["fix-processor", str(root), "--dry-run", "--json"], capsys)
    (entry,) = json.loads(out)["files"]
    assert entry["keys"]["video_processor.qvl_max_frame_pixels"] == [None, 4194304]  # JSON: null
    assert (
        "video_processor.qvl_max_frame_pixels" in entry["added"]
        and "image_processor.size.longest_edge" not in entry["added"]
    )


def test_fix_processor_takes_the_next_free_backup_name_past_several(tmp_path, capsys):
    """Mutation F1 (`while` -> `if` in _backup_name): with .orig and .orig-2 present, .orig-2 was chosen again and
    the fix failed (File exists)."""
    root = _artifact(tmp_path)
    (root / "processor_config.json.orig").write_text("mine")
    (root / "processor_config.json.orig-2").write_text("mine too")
    code, out, err = run_main(["fix-processor", str(root), "--json"], capsys)
    assert code == 0, err
    (entry,) = json.loads(out)["files"]
    assert entry["backup"] == "processor_config.json.orig-3"
    assert (root / "processor_config.json.orig-2").read_text() == "mine too"
    assert json.loads((root / "processor_config.json.orig-3").read_text()) == CHECKPOINT_PROCESSOR


def test_fix_processor_rehashes_the_manifest_through_processor_files_rehash(tmp_path, capsys, monkeypatch):
    """One re-hash of written processor files (compile's and fix-processor's), not a second hand-written loop."""
    from qwenvl_rbln.artifacts import processor_files

    root = _artifact(tmp_path, manifest=True)
    real, calls = processor_files.rehash, []

    def spy(where, files, written):
        calls.append(sorted(written))
        return real(where, files, written)

    monkeypatch.setattr(processor_files, "rehash", spy)
    code, out, err = run_main(["fix-processor", str(root), "--json"], capsys)
    assert code == 0, err
    assert calls == [["processor_config.json", "processor_config.json.orig"]]
    code, out, err = run_main(["load-check", str(root), "--no-runtime", "--strict", "--json"], capsys)
    assert code == 0 and json.loads(out)["layout"]["manifest"]["ok"] is True, err
    files = json.loads((root / MANIFEST_NAME).read_text())["files"]
    assert {"processor_config.json", "processor_config.json.orig"} <= set(files)
