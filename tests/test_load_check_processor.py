"""Artifacts saved outside qvl carry the checkpoint's processor files: load-check warns (exit 0, --strict: 2), and
`qvl fix-processor` rewrites them to the compiled buckets, atomically, with backups and a consistent manifest."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME, write_manifest
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import run_main, write_artifact

# the shipped Qwen3-VL checkpoint's processor files, as optimum-rbln's save_pretrained copies them
CHECKPOINT_IMAGE = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    "patch_size": 16,
    "merge_size": 2,
    "temporal_patch_size": 2,
}
CHECKPOINT_VIDEO = {
    "video_processor_type": "Qwen3VLVideoProcessor",
    "size": {"shortest_edge": 4096, "longest_edge": 25165824},
    "fps": 2,
    "min_frames": 4,
    "max_frames": 768,
    "patch_size": 16,
}


@pytest.fixture
def no_npu_stack(monkeypatch):
    monkeypatch.setitem(sys.modules, "optimum.rbln", None)
    monkeypatch.setitem(sys.modules, "rebel", None)


def _outside_qvl(tmp_path, *, manifest: bool):
    """rebel100-1npu (bucket 16384) saved with the checkpoint's processor files; optionally hashed by a manifest."""
    plan = build_plan("rebel100-1npu")
    root = write_artifact(tmp_path / "art", plan)
    (root / "preprocessor_config.json").write_text(json.dumps(CHECKPOINT_IMAGE, indent=2))
    (root / "video_preprocessor_config.json").write_text(json.dumps(CHECKPOINT_VIDEO, indent=2))
    if manifest:
        write_manifest(root, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "m"}})
    return root


def _snapshot(root):
    """Every file and directory under root, hidden ones included, with its bytes."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = "dir"
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def _json(argv, capsys):
    code, out, err = run_main([*argv, "--json"], capsys)
    return code, json.loads(out), err


@pytest.mark.parametrize("manifest", [False, True], ids=["manifest-less", "with-manifest"])
def test_checkpoint_processor_files_are_a_warning_naming_file_key_and_inputs(tmp_path, capsys, no_npu_stack, manifest):
    """They once failed the artifact: exit 2, "runtime: not created (layout problems)"."""
    root = _outside_qvl(tmp_path, manifest=manifest)
    code, data, err = _json(["load-check", str(root), "--no-runtime"], capsys)
    assert code == 0, err
    assert data["ok"] is True and data["layout"]["ok"] is True and data["processor"]["ok"] is False
    image, video = data["processor"]["warnings"]
    assert image.startswith("preprocessor_config.json size.longest_edge=16777216")
    assert (
        "images resized above 4,194,304 px" in image and "a 4000x3000 photo becomes 4000x3008, 47,000 patches" in image
    )
    assert video.startswith("video_preprocessor_config.json has no qvl_max_frame_pixels (size.longest_edge=25165824)")
    assert "videos sampled to 5 frames or fewer" in video and "3840x2160 clip becomes 24,128 patches" in video
    assert data["processor"]["fix"] == f"qvl fix-processor {root}"
    code, out, _ = run_main(["load-check", str(root), "--no-runtime"], capsys)
    last = " ".join(out.split()).rsplit("load-check:", 1)[1]
    assert code == 0 and last.startswith(" ok, with 2 processor-file warnings") and "qvl fix-processor" in last
    code, data, err = _json(["load-check", str(root), "--no-runtime", "--strict"], capsys)
    assert code == 2 and data["ok"] is False and data["exit_code"] == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"qvl: error: {root}: --strict: 2 processor-file warnings: preprocessor_config.json")
    assert "fix: `qvl fix-processor" in line and line.count("fix:") == 1


def test_emulated_artifact_saved_with_the_checkpoints_processor_files_warns(tiny_rbln, emulated, tmp_path, capsys):
    copy = tmp_path / "saved-outside-qvl"
    shutil.copytree(tiny_rbln, copy)
    (copy / MANIFEST_NAME).unlink()  # as a script's save_pretrained leaves it
    path = copy / "processor_config.json"
    data = json.loads(path.read_text())
    data["image_processor"].update(size=CHECKPOINT_IMAGE["size"])
    data["video_processor"].pop("qvl_max_frame_pixels")
    path.write_text(json.dumps(data))
    code, out, err = run_main(["load-check", str(copy), "--emulate", "--no-runtime", "--json"], capsys)
    assert code == 0, err
    warnings = json.loads(out)["processor"]["warnings"]
    image, video = warnings
    assert image.startswith("processor_config.json image_processor.size.longest_edge=16777216 ")
    assert video.startswith("processor_config.json has no video_processor.qvl_max_frame_pixels (video_processor.size")
    code, _, _ = run_main(["fix-processor", str(copy)], capsys)
    code, out, err = run_main(["load-check", str(copy), "--emulate", "--no-runtime", "--strict", "--json"], capsys)
    assert code == 0 and json.loads(out)["processor"]["warnings"] == [], err


def test_infer_runs_an_artifact_saved_with_the_checkpoints_processor_files(tiny_rbln, emulated, tmp_path, capsys):
    """infer applies the plan's caps to the processor it loads, so outside processor files are a warning there too
    (naming fix-processor), not a refusal; the image still lands in a compiled bucket."""
    from pathlib import Path

    copy = tmp_path / "saved-outside-qvl"
    shutil.copytree(tiny_rbln, copy)
    (copy / MANIFEST_NAME).unlink()
    path = copy / "processor_config.json"
    data = json.loads(path.read_text())
    data["image_processor"].update(size=CHECKPOINT_IMAGE["size"])
    data["video_processor"].pop("qvl_max_frame_pixels")
    path.write_text(json.dumps(data))
    image = Path(__file__).resolve().parent.parent / "assets" / "demo.jpg"
    args = ["infer", str(copy), "--preset", "cpu-tiny-rbln", "--emulate", "--image", str(image)]
    code, out, err = run_main([*args, "--max-new-tokens", "2", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    warning = [w for w in doc["warnings"] if "its processor files let inputs exceed the largest ViT bucket" in w]
    assert warning and "qvl fix-processor" in warning[0] and "images <= 1,048,576 px" in warning[0]
    assert doc["requests"] and doc["vit_buckets"] == [256, 1024, 4096]


@pytest.mark.parametrize("manifest", [False, True], ids=["manifest-less", "with-manifest"])
def test_fix_processor_rewrites_keeps_byte_identical_backups_and_is_idempotent(
    tmp_path, capsys, no_npu_stack, manifest
):
    root = _outside_qvl(tmp_path, manifest=manifest)
    before = _snapshot(root)
    code, data, err = _json(["fix-processor", str(root), "--dry-run"], capsys)
    assert code == 0, err
    assert _snapshot(root) == before and data["dry_run"] is True and data["changed"] is False
    planned = {f["file"]: f for f in data["files"]}
    assert planned["preprocessor_config.json"]["keys"] == {"size.longest_edge": [16777216, 4194304]}
    assert planned["video_preprocessor_config.json"]["keys"] == {"qvl_max_frame_pixels": [None, 4194304]}
    code, data, err = _json(["fix-processor", str(root)], capsys)
    assert code == 0 and data["changed"] is True, err
    for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
        assert (root / f"{name}.orig").read_bytes() == before[name]
    assert json.loads((root / "preprocessor_config.json").read_text())["size"]["longest_edge"] == 4194304
    assert json.loads((root / "video_preprocessor_config.json").read_text())["qvl_max_frame_pixels"] == 4194304
    assert not [n for n in os.listdir(root) if ".qvl-tmp-" in n]
    code, check, err = _json(["load-check", str(root), "--no-runtime", "--strict"], capsys)
    assert code == 0 and check["processor"]["warnings"] == [] and check["layout"]["ok"], err
    if manifest:
        assert check["layout"]["manifest"]["ok"] is True  # new files and backups hashed, nothing "added later"
        recorded = json.loads((root / MANIFEST_NAME).read_text())
        assert recorded["processor"]["max_pixels"] == 4194304 and recorded["processor_fixes"][0]["backups"]
    after = _snapshot(root)
    code, data, _ = _json(["fix-processor", str(root)], capsys)
    assert code == 0 and data["changed"] is False and data["files"] == []
    assert _snapshot(root) == after  # a second run changes nothing, writes no second backup


def test_fix_processor_never_replaces_an_existing_backup(tmp_path, capsys, no_npu_stack):
    root = _outside_qvl(tmp_path, manifest=False)
    (root / "preprocessor_config.json.orig").write_text("someone's own backup")
    original = (root / "preprocessor_config.json").read_bytes()
    code, data, err = _json(["fix-processor", str(root)], capsys)
    assert code == 0, err
    assert {f["file"]: f["backup"] for f in data["files"]}[
        "preprocessor_config.json"
    ] == "preprocessor_config.json.orig-2"
    assert (root / "preprocessor_config.json.orig").read_text() == "someone's own backup"
    assert (root / "preprocessor_config.json.orig-2").read_bytes() == original


@pytest.mark.parametrize("where", ["staging", "moving"])
def test_fix_processor_leaves_the_artifact_untouched_when_writing_fails(
    tmp_path, capsys, no_npu_stack, monkeypatch, where
):
    from qwenvl_rbln.jobs import processor_fix

    root = _outside_qvl(tmp_path, manifest=True)
    before = _snapshot(root)
    if where == "staging":  # the new manifest cannot be written (disk full)

        def full(*args, **kwargs):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr("qwenvl_rbln.artifacts.manifest.write_json_atomic", full)
    else:  # the second processor file cannot be moved into place: the first is put back
        real, calls = os.replace, []

        def flaky(src, dst):
            calls.append(dst)
            if len(calls) == 2:
                raise OSError(5, "Input/output error")
            return real(src, dst)

        monkeypatch.setattr(processor_fix.os, "replace", flaky)
    code, out, err = run_main(["fix-processor", str(root)], capsys)
    assert code == 2 and out == ""
    assert "nothing was changed" in err.strip().splitlines()[-1]
    assert _snapshot(root) == before  # no new file, no backup, no temp directory, every byte the same


def test_fix_processor_refuses_a_damaged_manifest_and_a_torch_artifact_changing_nothing(tmp_path, capsys, no_npu_stack):
    root = _outside_qvl(tmp_path, manifest=True)
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    manifest["files"]["config.json"] = "x"
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    before = _snapshot(root)
    code, out, err = run_main(["fix-processor", str(root)], capsys)
    assert code == 2 and out == "" and _snapshot(root) == before
    assert err.strip().splitlines()[-1].startswith(f"qvl: error: {root / MANIFEST_NAME}: damaged")
    assert f"recompile with `qvl compile --preset PRESET -o {root} --force`" in err  # this artifact (audit N1)
    torch_art = tmp_path / "torch"
    torch_art.mkdir()
    (torch_art / "qvl-rbln-config.json").write_text(json.dumps({"backend": "torch"}))
    code, _, err = run_main(["fix-processor", str(torch_art)], capsys)
    assert code == 2 and "Traceback" not in err
