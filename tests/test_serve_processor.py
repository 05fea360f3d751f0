"""`qvl serve` on an artifact whose processor files are the checkpoint's (saved by the product doc's scripts or by
plain optimum-rbln, not by `qvl compile`): served safely without editing it. Images are capped per request through
--mm-processor-kwargs, video frames through the plugin with the cap in the environment (QVL_MAX_FRAME_PIXELS)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from qwenvl_rbln.artifacts.processor_files import write_caps
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import run_main, write_artifact

CAP = 16384 * 16 * 16  # the largest bucket of rebel100-1npu x 16^2
# the processor files of Qwen/Qwen3-VL-*-Instruct, as optimum-rbln's save_pretrained copies them
CHECKPOINT_PROCESSOR = {
    "processor_class": "Qwen3VLProcessor",
    "image_processor": {
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "patch_size": 16,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    },
    "video_processor": {
        "video_processor_type": "Qwen3VLVideoProcessor",
        "patch_size": 16,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "fps": 2,
        "min_frames": 4,
        "max_frames": 768,
        "size": {"shortest_edge": 4096, "longest_edge": 25165824},
    },
}


@pytest.fixture
def no_exec(monkeypatch):
    monkeypatch.setattr("os.execvpe", lambda *a, **k: pytest.fail("exec attempted"))


def foreign_artifact(path: Path) -> Path:
    """rebel100-1npu's graphs, no qvl-manifest.json, the checkpoint's processor files."""
    root = write_artifact(path, build_plan("rebel100-1npu"))
    (root / "processor_config.json").write_text(json.dumps(CHECKPOINT_PROCESSOR, indent=2))
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def dry_json(capsys, *args: str) -> dict:
    cut = args.index("--") if "--" in args else len(args)  # qvl's flags before `--`, vllm's after
    code, out, err = run_main(["serve", *args[:cut], "--dry-run", "--json", *args[cut:]], capsys)
    assert code == 0, err
    return json.loads(out)


def flag_value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


def test_checkpoint_processor_files_are_served_capped_without_editing_the_artifact(tmp_path, capsys, no_exec):
    root = foreign_artifact(tmp_path / "art")
    before = snapshot(root)
    data = dry_json(capsys, str(root))
    kwargs = json.loads(flag_value(data["argv"], "--mm-processor-kwargs"))
    assert kwargs == {"max_pixels": CAP, "images_kwargs": {"size": {"shortest_edge": 65536, "longest_edge": CAP}}}
    assert data["env"]["QVL_FRAME_CAP"] == "1" and data["env"]["QVL_MAX_FRAME_PIXELS"] == str(CAP)
    checks = {c["check"]: c for c in data["checks"]}
    assert "processor caps" not in checks  # the files do not agree: the two caps below say what serve does
    assert "image_processor size.longest_edge=16777216" in checks["image cap"]["detail"]
    assert "--mm-processor-kwargs" in checks["image cap"]["detail"]
    assert "video_processor qvl_max_frame_pixels=None" in checks["video cap"]["detail"]
    assert f"QVL_MAX_FRAME_PIXELS={CAP}" in checks["video cap"]["detail"]
    assert snapshot(root) == before  # nothing was written into the artifact
    code, out, err = run_main(["serve", str(root), "--dry-run"], capsys)
    assert code == 0 and f"export QVL_MAX_FRAME_PIXELS={CAP}" in out and "# ok   image cap:" in out


def test_processor_files_that_agree_need_no_cap(tmp_path, capsys, no_exec):
    plan = build_plan("rebel100-1npu")
    root = foreign_artifact(tmp_path / "art")
    write_caps(root, plan.processor.to_dict())  # what `qvl compile` writes
    data = dry_json(capsys, str(root))
    assert "--mm-processor-kwargs" not in data["argv"] and "QVL_MAX_FRAME_PIXELS" not in data["env"]
    checks = {c["check"]: c for c in data["checks"]}
    assert checks["processor caps"]["ok"] and "nothing added" in checks["image cap"]["detail"]
    assert "video cap" not in checks


def test_a_users_max_pixels_alone_is_refused_on_uncapped_files(tmp_path, capsys, no_exec):
    root = foreign_artifact(tmp_path / "art")
    code, _, err = run_main(
        ["serve", str(root), "--dry-run", "--", "--mm-processor-kwargs", '{"max_pixels": 802816}'], capsys
    )
    assert code == 2 and "does not cap images per request" in err and "images_kwargs" in err
    ok_kwargs = json.dumps({"images_kwargs": {"size": {"shortest_edge": 65536, "longest_edge": 802816}}})
    data = dry_json(capsys, str(root), "--", "--mm-processor-kwargs", ok_kwargs)
    assert flag_value(data["argv"], "--mm-processor-kwargs") == ok_kwargs


def test_the_kwargs_serve_passes_cap_images_and_leave_videos_to_the_plugin(tiny_model, tmp_path):
    """The Qwen3-VL processor of transformers, loaded from files with the checkpoint's sizes, called with exactly
    the --mm-processor-kwargs serve passes (per call, as vLLM does, and at load): images land in the cap, videos
    keep their budget over all frames (the per-frame cap is the plugin's)."""
    np = pytest.importorskip("numpy")
    from transformers import AutoProcessor

    from qwenvl_rbln.serving.flags import image_kwargs

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    proc_file = model / "processor_config.json"
    data = json.loads(proc_file.read_text())
    data["image_processor"]["size"] = CHECKPOINT_PROCESSOR["image_processor"]["size"]
    data["video_processor"]["size"] = CHECKPOINT_PROCESSOR["video_processor"]["size"]
    data["video_processor"].pop("qvl_max_frame_pixels", None)
    proc_file.write_text(json.dumps(data))
    cap = 4096 * 256
    kwargs = image_kwargs(65536, cap)
    image = np.zeros((3000, 4000, 3), dtype=np.uint8)
    video = np.zeros((4, 1080, 1920, 3), dtype=np.uint8)

    def grids(processor, **kw):
        text = [f"{processor.image_token} {processor.video_token}"]
        out = processor(text=text, images=[image], videos=[video], return_tensors="np", **kw)
        return out["image_grid_thw"].prod(axis=1)[0], out["video_grid_thw"].tolist()

    plain = AutoProcessor.from_pretrained(str(model), local_files_only=True)
    uncapped_patches, uncapped_video = grids(plain)
    assert uncapped_patches > 4096  # the checkpoint's files let a 12 MP image past the bucket
    for processor, kw in (
        (plain, kwargs),
        (AutoProcessor.from_pretrained(str(model), local_files_only=True, **kwargs), {}),
    ):
        patches, video_grid = grids(processor, **kw)
        assert patches <= 4096 and video_grid == uncapped_video
    assert grids(plain, max_pixels=cap)[0] == uncapped_patches  # why not max_pixels alone: ignored per call


def test_following_the_refusals_hint_is_accepted_and_the_cap_itself_is_allowed(tmp_path, capsys, no_exec):
    """Mutation F05 (max_pixels equal to the cap refused): the refusal suggests max_pixels = the cap, so the cap
    itself must pass, in every spelling the check reads; one pixel above is refused."""
    import re

    root = foreign_artifact(tmp_path / "art")
    code, _, err = run_main(
        ["serve", str(root), "--dry-run", "--", "--mm-processor-kwargs", '{"max_pixels": 802816}'], capsys
    )
    assert code == 2
    (hint,) = re.findall(r"pass e\.g\. '(\{.*\})'", err)
    assert f'"longest_edge": {CAP}' in hint and f'"max_pixels": {CAP}' in hint
    assert flag_value(dry_json(capsys, str(root), "--", "--mm-processor-kwargs", hint)["argv"], "--mm-processor-kwargs")
    at_cap = [
        ("--mm-processor-kwargs", json.dumps({"size": {"longest_edge": CAP}})),
        ("--mm-processor-kwargs", json.dumps({"min_pixels": 65536, "max_pixels": CAP})),
        ("--mm-processor-kwargs.max_pixels", str(CAP)),
    ]
    for flag, value in at_cap:
        dry_json(capsys, str(root), "--", flag, value)
        above = value.replace(str(CAP), str(CAP + 1))
        code, _, err = run_main(["serve", str(root), "--dry-run", "--", flag, above], capsys)
        assert code == 2 and "exceed the largest compiled ViT bucket" in err, (flag, above, err)
