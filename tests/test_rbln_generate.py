"""`qvl infer` on rbln artifacts with an injected optimum-rbln class (no NPU, no optimum-rbln here).

The fake ``RBLNAutoModelForImageTextToText`` records ``from_pretrained`` (the load-time rbln_config) and every
``generate`` call (batch rows, image grids), times nothing itself, and generates with the real tiny torch
model, so the tokens that come back are real and can be checked against the reference backend.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from qwenvl_rbln import artifacts  # noqa: E402
from qwenvl_rbln.plan import build_plan  # noqa: E402
from tests.fakes_rbln import install, make_rebel, run_main, write_artifact  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "assets" / "demo.jpg"  # 640x480: 1200 patches at the shipped caps
PROCESSOR_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "processor_config.json",
    "chat_template.jinja",
    "generation_config.json",
)


class FakeRBLNModel:
    """Stands in for RBLNQwen3VLForConditionalGeneration as returned by the auto class."""

    loads: list[dict[str, Any]] = []
    generates: list[dict[str, Any]] = []
    visual_calls: list[Any] = []
    torch_model: Any = None
    generate_error: str | None = None

    def __init__(self) -> None:
        self.generation_config = self.torch_model.generation_config
        calls = type(self).visual_calls
        self.visual = lambda pixel_values, grid_thw=None: calls.append(grid_thw.tolist())

    @classmethod
    def from_pretrained(cls, model_id: Any, export: bool | None = None, rbln_config: dict | None = None, **kw: Any):
        cls.loads.append(
            {"model_id": str(model_id), "export": export, "rbln_config": copy.deepcopy(rbln_config), "kwargs": kw}
        )
        return cls()

    def generate(self, input_ids: Any, attention_mask: Any = None, **kwargs: Any) -> Any:
        inputs = {k: v for k, v in kwargs.items() if hasattr(v, "shape")}
        options = {k: v for k, v in kwargs.items() if k not in inputs}
        self.generates.append(
            {
                "rows": int(input_ids.shape[0]),
                "input_ids": input_ids.tolist(),
                "image_grid_thw": inputs["image_grid_thw"].tolist() if "image_grid_thw" in inputs else None,
                "options": sorted(options),
                "max_new_tokens": options.get("max_new_tokens"),
                "do_sample": options.get("do_sample"),
            }
        )
        if self.generate_error:
            raise RuntimeError(self.generate_error)
        if "pixel_values" in inputs:  # optimum-rbln runs the ViT submodule before the LM prefill
            self.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"])
        return self.torch_model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)


@pytest.fixture(scope="module")
def tiny() -> Path:
    from qwenvl_rbln.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="module")
def rbln_artifact(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """An optimum-rbln 0.12 layout compiled (as far as files go) from the tiny model: batch 2, buckets 256/1024,
    placement LM on NPU 0 and ViT on NPU 1, plus the qvl manifest."""
    root = tmp_path_factory.mktemp("rbln")
    preset = root / "tiny-rbln.yaml"
    preset.write_text(
        "extends: cpu-tiny\nbackend: rbln\n"
        "rbln_config:\n  visual:\n    max_seq_len: [256, 1024]\n"
        "placement:\n  device: 0\n  visual_device: 1\n"
    )
    plan = build_plan(str(preset))
    art = write_artifact(root / "art", plan, config=json.loads((tiny / "config.json").read_text()))
    for name in PROCESSOR_FILES:
        shutil.copy2(tiny / name, art / name)
    manifest = artifacts.manifest_for_plan(
        plan, model={"id": "qvl:tiny", "local_path": str(tiny)}, versions={}, cache_key=None
    )
    artifacts.write_manifest(art, manifest)
    return art, plan


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tiny: Path) -> type[FakeRBLNModel]:
    from transformers import Qwen3VLForConditionalGeneration

    if FakeRBLNModel.torch_model is None:
        FakeRBLNModel.torch_model = Qwen3VLForConditionalGeneration.from_pretrained(tiny).eval()
    cls = type("RBLNAutoModelForImageTextToText", (FakeRBLNModel,), {"loads": [], "generates": [], "visual_calls": []})
    install(monkeypatch, cls, rebel=make_rebel())
    return cls


def _json(capsys: Any, *args: str) -> tuple[int, dict | None, str, str]:
    code, out, err = run_main(["infer", *args, "--json"], capsys)
    return code, (json.loads(out) if code == 0 else None), out, err


def test_load_placement_is_the_load_time_rbln_config(rbln_artifact, fake, capsys):
    art, _ = rbln_artifact
    code, data, _, err = _json(capsys, str(art), "--prompt", "hi", "--max-new-tokens", "3")
    assert code == 0, err
    # default: the placement recorded at compile (LM on 0, ViT on 1)
    assert fake.loads == [
        {"model_id": str(art), "export": False, "rbln_config": {"visual": {"device": 1}, "device": 0}, "kwargs": {}}
    ]
    assert data["backend"] == "rbln" and data["placement"] == {"device": 0, "visual_device": 1}
    assert data["runtime"]["load_rbln_config"] == {"visual": {"device": 1}, "device": 0}
    assert data["tiny_model"] is True and "meaningless" in err

    code, data, _, err = _json(
        capsys, str(art), "--prompt", "hi", "--max-new-tokens", "3", "--device", "2", "--visual-device", "3"
    )
    assert code == 0, err
    assert fake.loads[-1]["rbln_config"] == {"visual": {"device": 3}, "device": 2}
    assert data["placement"] == {"device": 2, "visual_device": 3}
    assert data["memory"]["source"] == "planner estimate" and {d["device"] for d in data["memory"]["devices"]} == {2, 3}


def test_human_output_names_the_npus_and_the_planner_memory(rbln_artifact, fake, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    art, _ = rbln_artifact
    code, out, err = run_main(
        ["infer", str(art), "--image", str(DEMO), "--prompt", "Hi.", "--max-new-tokens", "3"], capsys
    )
    assert code == 0, err
    assert "rbln backend, LM on NPU 0, ViT on NPU 1" in out
    assert "decoder_batch_2 with 1 padded row of 2" in out and "memory (planner estimate): NPU 0:" in out


def test_generate_gets_the_compiled_batch_and_padded_rows_are_dropped(rbln_artifact, fake, tiny, capsys, tmp_path):
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
    assert [g["rows"] for g in fake.generates] == [2, 2]  # always the compiled batch_size
    assert all(g["do_sample"] is False and g["max_new_tokens"] == 6 for g in fake.generates)
    padded = fake.generates[1]["input_ids"]
    assert padded[0] == padded[1]  # the padding row is a copy of the real one
    assert [r["id"] for r in data["requests"]] == ["img", "txt", "last"]  # padded output dropped
    assert [(b["real_rows"], b["padded_rows"], b["decoder_graph"]) for b in data["batches"]] == [
        (2, 0, "decoder_batch_2"),
        (1, 1, "decoder_batch_2"),
    ]
    assert data["requests"][2]["padded_rows"] == 1
    assert len(fake.visual_calls) == 2 and data["batches"][0]["timings"]["vision_calls"] == 1
    # the real rows are what the reference backend gives for the same requests
    reqs = validate_requests(parse_batch_file(batch))
    ref = ReferenceBackend(tiny, plan.processor)
    try:
        for req, got in zip(reqs, data["requests"], strict=True):
            want = ref.run_batch([req], GenerationOptions(max_new_tokens=6)).rows[0].token_ids
            assert got["token_ids"] == want, req.id
    finally:
        ref.close()


def test_max_pixels_capped_to_the_largest_bucket_and_reported(rbln_artifact, fake, capsys):
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
    grid, copy_of_it = fake.generates[0]["image_grid_thw"]  # the padding row is a copy of the request
    assert grid == copy_of_it and grid[1] * grid[2] == v["patches"] <= 1024  # what optimum-rbln gets fits the bucket
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


def test_on_oversize_error_names_input_patches_bucket_and_both_fixes(rbln_artifact, fake, capsys):
    art, _ = rbln_artifact
    code, out, err = run_main(
        [
            "infer",
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
    assert fake.loads == [] and fake.generates == []  # refused before loading anything


def test_too_long_for_max_seq_len_is_refused_before_generate(rbln_artifact, fake, capsys):
    art, _ = rbln_artifact
    code, out, err = run_main(["infer", str(art), "--prompt", "hi", "--max-new-tokens", "5000"], capsys)
    assert code == 2 and out == ""
    assert "exceeds the compiled max_seq_len 4096" in err and fake.generates == []
    assert fake.loads == []  # more new tokens than the whole sequence: refused before the load
    code, out, err = run_main(["infer", str(art), "--prompt", "hi", "--max-new-tokens", "4090"], capsys)
    assert code == 2 and out == ""
    assert "prompt of 12 tokens + --max-new-tokens 4090 = 4102 exceeds the compiled max_seq_len 4096" in err
    assert "at most 4084" in err and fake.generates == []


def test_artifact_compiled_with_sets_runs_without_repeating_them(rbln_artifact, fake, tiny, capsys, tmp_path):
    """An rbln artifact compiled with --set batch_size=1 runs with its own batch, no --preset or --set needed."""
    art, _ = rbln_artifact
    preset = art.parent / "tiny-rbln.yaml"
    b1_plan = build_plan(str(preset), ["batch_size=1", "decoder_batch_sizes=[1]"])
    b1 = write_artifact(tmp_path / "b1", b1_plan, config=json.loads((tiny / "config.json").read_text()))
    for name in PROCESSOR_FILES:
        shutil.copy2(tiny / name, b1 / name)
    manifest = artifacts.manifest_for_plan(
        b1_plan, model={"id": "qvl:tiny", "local_path": str(tiny)}, versions={}, cache_key=None
    )
    artifacts.write_manifest(b1, manifest)
    code, data, _, err = _json(capsys, str(b1), "--prompt", "hi", "--max-new-tokens", "2")
    assert code == 0, err
    assert data["batch_size"] == 1 and data["decoder_batch_sizes"] == [1] and data["preset"] == str(preset)
    assert [g["rows"] for g in fake.generates] == [1]  # generate got the compiled batch, not the preset's 2
    code, out, err = run_main(["infer", str(b1), "--preset", str(preset), "--prompt", "hi"], capsys)
    assert code == 2 and out == ""
    assert "add" not in err and "--set batch_size=1 --set decoder_batch_sizes=[1]" in err


def test_without_optimum_rbln_exit_3_after_validating_inputs(rbln_artifact, capsys, monkeypatch):
    art, _ = rbln_artifact
    monkeypatch.setitem(sys.modules, "optimum.rbln", None)
    monkeypatch.setitem(sys.modules, "rebel", None)
    code, out, err = run_main(["infer", str(art), "--prompt", "hi"], capsys)
    assert code == 3 and out == "" and "optimum-rbln and rebel-compiler are not installed" in err
    code, _, err = run_main(["infer", str(art), "--image", "missing.png"], capsys)
    assert code == 2 and "missing.png: no such file" in err  # bad input is reported first


def test_placement_must_match_num_devices(rbln_artifact, fake, capsys):
    art, _ = rbln_artifact
    code, out, err = run_main(["infer", str(art), "--prompt", "hi", "--device", "0,1"], capsys)
    assert code == 2 and "num_devices=1" in err and fake.loads == []


def test_generate_failure_is_a_backend_error_exit_5(rbln_artifact, fake, capsys, monkeypatch):
    art, _ = rbln_artifact
    monkeypatch.setattr(fake, "generate_error", "Cache position size mismatch: got 1, expected 2.\nmore detail")
    code, out, err = run_main(["infer", str(art), "--prompt", "hi", "--json"], capsys)
    assert code == 5 and json.loads(out)["error"]["exit_code"] == 5
    line = err.strip().splitlines()[-1]
    assert "generate failed for request(s) 1: RuntimeError: Cache position size mismatch" in line
    assert "more detail" not in err and "Traceback" not in err
