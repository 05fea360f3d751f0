"""`qvl infer --emulate` on rbln artifacts: optimum-rbln 0.12's real load and generate on qvl's CPU emulator of rebel
(emulated: no NPU ran), with the tiny model.

``rbln_calls`` (tests/conftest.py) wraps optimum-rbln's ``from_pretrained`` (the load-time rbln_config) and every
``generate`` call (batch rows, image grids) and the emulator's ``Runtime`` (the device each graph is placed on),
so the tests see exactly what qvl handed optimum-rbln while the real code runs; the tokens that come back are
checked against the reference backend.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from qwenvl_rbln.artifacts.manifest import manifest_for_plan, write_manifest
from qwenvl_rbln.artifacts.processor_files import write_caps
from qwenvl_rbln.planning.plan import build_plan  # noqa: E402
from tests.emulated_rbln import compile_emulated  # noqa: E402
from tests.fakes_rbln import run_main, write_artifact  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "assets" / "demo.jpg"  # 640x480: 1200 patches at the shipped caps
EMU = "--emulate"
PROCESSOR_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "processor_config.json",
    "chat_template.jinja",
    "generation_config.json",
)


@pytest.fixture(scope="module")
def tiny() -> Path:
    from qwenvl_rbln.backends.tiny.model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="module")
def preset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model on the rbln backend: batch 2, buckets 256/1024, placement LM on NPU 0 and ViT on NPU 1."""
    path = tmp_path_factory.mktemp("rbln") / "tiny-rbln.yaml"
    path.write_text(
        "extends: cpu-tiny\nbackend: rbln\n"
        "rbln_config:\n  visual:\n    max_seq_len: [256, 1024]\n"
        "placement:\n  device: 0\n  visual_device: 1\n"
    )
    return path


@pytest.fixture(scope="module")
def rbln_artifact(tiny: Path, preset: Path) -> tuple[Path, Any]:
    """`qvl compile --preset tiny-rbln.yaml --emulate` (emulated), with the qvl manifest; once per session (the
    compile cache)."""
    art = compile_emulated(preset.parent / "art", preset=str(preset))
    return art, build_plan(str(preset))


@pytest.fixture(scope="module")
def npu_layout(preset: Path, tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same plan in the layout a real NPU compile writes (fake graph files): what a host without optimum-rbln
    meets. An emulated artifact there is refused as emulated before the missing packages are named."""
    plan = build_plan(str(preset))
    art = write_artifact(
        tmp_path_factory.mktemp("npu") / "art", plan, config=json.loads((tiny / "config.json").read_text())
    )
    for name in PROCESSOR_FILES:
        shutil.copy2(tiny / name, art / name)
    write_caps(art, plan.processor.to_dict())  # as `qvl compile` does: the plan's caps in the processor files
    manifest = manifest_for_plan(plan, model={"id": "qvl:tiny", "local_path": str(tiny)}, versions={}, cache_key=None)
    write_manifest(art, manifest)
    return art


def _json(capsys: Any, *args: str) -> tuple[int, dict | None, str, str]:
    code, out, err = run_main(["infer", EMU, *args, "--json"], capsys)
    return code, (json.loads(out) if code == 0 else None), out, err


def _devices(calls: Any, art: Path) -> dict[str, Any]:
    """Graph file (relative to the artifact) -> the device its emulated runtime was created on."""
    return {Path(path).relative_to(art).as_posix(): dev for path, dev in calls.runtimes}


def _expected(plan: Any, device: int, visual_device: int) -> dict[str, int]:
    lm = {f"{name}.rbln": device for name in plan.resolved.graph_names}
    return {**lm, "visual/compiled_model.rbln": visual_device}


def test_load_placement_is_the_load_time_rbln_config(rbln_artifact, rbln_calls, capsys):
    art, plan = rbln_artifact
    code, data, _, err = _json(capsys, str(art), "--prompt", "hi", "--max-new-tokens", "3")
    assert code == 0, err
    # default: the placement recorded at compile (LM on 0, ViT on 1)
    assert rbln_calls.loads == [
        {"model_id": str(art), "export": False, "rbln_config": {"visual": {"device": 1}, "device": 0}, "kwargs": {}}
    ]
    assert data["backend"] == "rbln" and data["placement"] == {"device": 0, "visual_device": 1}
    assert data["runtime"]["load_rbln_config"] == {"visual": {"device": 1}, "device": 0}
    assert data["tiny_model"] is True and "meaningless" in err
    # and optimum-rbln placed each graph's runtime there
    assert _devices(rbln_calls, art) == _expected(plan, 0, 1)
    rbln_calls.runtimes.clear()

    code, data, _, err = _json(
        capsys, str(art), "--prompt", "hi", "--max-new-tokens", "3", "--device", "2", "--visual-device", "3"
    )
    assert code == 0, err
    assert rbln_calls.loads[-1]["rbln_config"] == {"visual": {"device": 3}, "device": 2}
    assert data["placement"] == {"device": 2, "visual_device": 3}
    assert _devices(rbln_calls, art) == _expected(plan, 2, 3)
    assert data["memory"]["source"] == "planner estimate" and {d["device"] for d in data["memory"]["devices"]} == {2, 3}


def test_human_output_names_the_npus_and_the_planner_memory(rbln_artifact, rbln_calls, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    art, _ = rbln_artifact
    code, out, err = run_main(
        ["infer", EMU, str(art), "--image", str(DEMO), "--prompt", "Hi.", "--max-new-tokens", "3"], capsys
    )
    assert code == 0, err
    assert "rbln backend, LM on NPU 0, ViT on NPU 1" in out
    assert "decoder_batch_2 with 1 padded row of 2" in out and "memory (planner estimate): NPU 0:" in out


def test_generate_gets_the_compiled_batch_and_padded_rows_are_dropped(
    rbln_artifact, rbln_calls, tiny, capsys, tmp_path
):
    from qwenvl_rbln.inference.generation import GenerationOptions
    from qwenvl_rbln.inference.reference import ReferenceBackend
    from qwenvl_rbln.inference.requests import parse_batch_file, validate_requests

    art, plan = rbln_artifact
    batch = tmp_path / "r.jsonl"
    batch.write_text(
        json.dumps({"id": "img", "prompt": "Describe this image.", "images": [str(DEMO)]})
        + "\n"
        + json.dumps({"id": "txt", "prompt": "Say hello."})
        + "\n"
        + json.dumps({"id": "last", "prompt": "Count the objects.", "images": [str(DEMO)]})
        + "\n"
    )
    code, data, _, err = _json(capsys, str(art), "--batch-file", str(batch), "--max-new-tokens", "6")
    assert code == 0, err
    assert [g["rows"] for g in rbln_calls.generates] == [2, 2]  # always the compiled batch_size
    assert all(g["do_sample"] is False and g["max_new_tokens"] == 6 for g in rbln_calls.generates)
    padded = rbln_calls.generates[1]["input_ids"]
    image_token = json.loads((art / "config.json").read_text())["image_token_id"]
    assert image_token in padded[0] and image_token not in padded[1]  # the padding row is text only
    pad_id = padded[1][0]
    assert padded[1].count(pad_id) > padded[0].count(pad_id)  # shorter than the real row: left padded further
    assert [r["id"] for r in data["requests"]] == ["img", "txt", "last"]  # padded output dropped
    assert [(b["real_rows"], b["padded_rows"], b["decoder_graph"]) for b in data["batches"]] == [
        (2, 0, "decoder_batch_2"),
        (1, 1, "decoder_batch_2"),
    ]
    assert data["requests"][2]["padded_rows"] == 1
    # the ViT graph ran once per real image: once for "img", once for "last" (its text-only padding row costs no
    # ViT call); each batch reports the runs the emulated runtime counted
    vit_runs = [b["timings"]["vision_calls"] for b in data["batches"]]
    assert vit_runs == [1, 1] and sum(vit_runs) == rbln_calls.graph_runs("compiled_model.rbln")
    # the real rows are what the reference backend gives for the same requests
    reqs = validate_requests(parse_batch_file(batch))
    ref = ReferenceBackend(tiny, plan.processor)
    try:
        for req, got in zip(reqs, data["requests"], strict=True):
            want = ref.run_batch([req], GenerationOptions(max_new_tokens=6)).rows[0].token_ids
            assert got["token_ids"] == want, req.id
    finally:
        ref.close()


def test_max_pixels_capped_to_the_largest_bucket_and_reported(rbln_artifact, rbln_calls, capsys):
    art, _ = rbln_artifact
    code, data, _, err = _json(
        capsys,
        str(art),
        "--image",
        str(DEMO),
        "--prompt",
        "Describe.",
        "--max-new-tokens",
        "2",
        "--set",
        "processor.max_pixels=16777216",
    )
    assert code == 0, err
    (v,) = data["requests"][0]["vision"]
    assert v["capped"] is True and v["patches_before_cap"] == 1200 and v["bucket"] == 1024
    (grid,) = rbln_calls.generates[0]["image_grid_thw"]  # the padding row is text only: one image in the batch
    assert grid[1] * grid[2] == v["patches"] <= 1024  # what optimum-rbln gets fits the bucket
    assert data["requests"][0]["processor"]["max_pixels"] == 1024 * 256  # this request's caps
    assert data["processor"]["max_pixels"] == 16777216  # the plan's: other requests keep them
    assert data["oversize"] == {
        "policy": "resize",
        "capped": [
            {
                "request": "1",
                "input": str(DEMO),
                "kind": "image",
                "patches_before": 1200,
                "patches": v["patches"],
                "bucket": 1024,
            }
        ],
        "notes": data["oversize"]["notes"],
    }
    assert "max_pixels capped 16777216 -> 262144" in err

    # without the override the plan's caps already keep images inside 1024 patches: nothing is capped
    code, data, _, err = _json(capsys, str(art), "--image", str(DEMO), "--prompt", "Describe.", "--max-new-tokens", "2")
    assert code == 0, err
    assert data["oversize"]["capped"] == [] and data["requests"][0]["vision"][0]["patches"] <= 1024


def test_on_oversize_error_names_input_patches_bucket_and_both_fixes(rbln_artifact, rbln_calls, capsys):
    art, _ = rbln_artifact
    code, out, err = run_main(
        [
            "infer",
            EMU,
            str(art),
            "--image",
            str(DEMO),
            "--prompt",
            "Describe.",
            "--set",
            "processor.max_pixels=16777216",
            "--on-oversize",
            "error",
        ],
        capsys,
    )
    assert code == 2 and out == ""
    line = err.strip().splitlines()[-1]
    assert line.startswith("qvl: error: ") and str(DEMO) in line
    assert "1200 patches exceed the largest ViT bucket 1024" in line
    assert "--set visual.max_seq_len=[256,1024,1200]" in line and "--set processor.max_pixels=262144" in line
    # on compiled artifacts the bucket fix is a recompile (a --set on infer cannot change compiled buckets)
    assert f"recompile with a bucket that fits: `qvl compile --preset {art.parent / 'tiny-rbln.yaml'} " in line
    assert f"--set visual.max_seq_len=[256,1024,1200] -o {art} --force`" in line
    assert "--on-oversize resize" in line
    assert rbln_calls.loads == [] and rbln_calls.generates == []  # refused before loading anything


def test_too_long_for_max_seq_len_is_refused_before_generate(rbln_artifact, rbln_calls, capsys):
    art, _ = rbln_artifact
    code, out, err = run_main(["infer", EMU, str(art), "--prompt", "hi", "--max-new-tokens", "5000"], capsys)
    assert code == 2 and out == ""
    assert "exceeds the compiled max_seq_len 4096" in err and rbln_calls.generates == []
    assert rbln_calls.loads == []  # more new tokens than the whole sequence: refused before the load
    code, out, err = run_main(["infer", EMU, str(art), "--prompt", "hi", "--max-new-tokens", "4090"], capsys)
    assert code == 2 and out == ""
    assert "prompt of 12 tokens + --max-new-tokens 4090 = 4102 exceeds the compiled max_seq_len 4096" in err
    assert "at most 4084" in err and rbln_calls.generates == []


def test_artifact_compiled_with_sets_runs_without_repeating_them(rbln_artifact, rbln_calls, capsys, tmp_path):
    """An rbln artifact compiled with --set batch_size=1 runs with its own batch, no --preset or --set needed."""
    art, _ = rbln_artifact
    preset = art.parent / "tiny-rbln.yaml"
    b1 = compile_emulated(tmp_path / "b1", ["batch_size=1", "decoder_batch_sizes=[1]"], preset=str(preset))
    code, data, _, err = _json(capsys, str(b1), "--prompt", "hi", "--max-new-tokens", "2")
    assert code == 0, err
    assert data["batch_size"] == 1 and data["decoder_batch_sizes"] == [1] and data["preset"] == str(preset)
    assert [g["rows"] for g in rbln_calls.generates] == [1]  # generate got the compiled batch, not the preset's 2
    code, out, err = run_main(["infer", EMU, str(b1), "--preset", str(preset), "--prompt", "hi"], capsys)
    assert code == 2 and out == ""
    assert "add" not in err and "--set batch_size=1 --set decoder_batch_sizes=[1]" in err


def test_without_optimum_rbln_exit_3_after_validating_inputs(npu_layout, capsys, monkeypatch):
    art = npu_layout  # missing optimum-rbln / rebel: a host the emulator cannot stand for
    monkeypatch.setitem(sys.modules, "optimum.rbln", None)
    monkeypatch.setitem(sys.modules, "rebel", None)
    code, out, err = run_main(["infer", str(art), "--prompt", "hi"], capsys)
    assert code == 3 and out == "" and "optimum-rbln and rebel-compiler are not installed" in err
    code, _, err = run_main(["infer", str(art), "--image", "missing.png"], capsys)
    assert code == 2 and "missing.png: no such file" in err  # bad input is reported first


def test_placement_must_match_num_devices(rbln_artifact, rbln_calls, capsys):
    art, _ = rbln_artifact
    code, out, err = run_main(["infer", EMU, str(art), "--prompt", "hi", "--device", "0,1"], capsys)
    assert code == 2 and "num_devices=1" in err and rbln_calls.loads == []


def test_generate_failure_is_a_backend_error_exit_5(rbln_artifact, rbln_calls, capsys, monkeypatch):
    import optimum.rbln

    art, _ = rbln_artifact

    def mismatch(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("Cache position size mismatch: got 1, expected 2.\nmore detail")

    # a fault injected into the real, loaded model: the emulator never raises optimum-rbln's runtime errors
    monkeypatch.setattr(optimum.rbln.RBLNQwen3VLForConditionalGeneration, "generate", mismatch)
    code, out, err = run_main(["infer", EMU, str(art), "--prompt", "hi", "--json"], capsys)
    assert code == 5 and json.loads(out)["error"]["exit_code"] == 5
    line = err.strip().splitlines()[-1]
    assert "generate failed for request(s) 1: RuntimeError: Cache position size mismatch" in line
    assert "more detail" not in err and "Traceback" not in err
