"""`qvl bucket-plan` with ViT packing: packed and unpacked side by side, "images": N, --optimize on the
packed cost, --no-vit-packing, and the preset key runtime.vit_packing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qwenvl_rbln.cli import app
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.views import render
from qwenvl_rbln.vision.workload import read_workload
from tests.helpers_cli import run_qvl

PRESET = "rebel100-1npu-vit-buckets"
VIDEO_5MIN = '{"width": 1280, "height": 720, "frames": 9000, "fps": 30}\n'
EIGHT_IMAGES = '{"width": 320, "height": 240, "images": 8}\n'
PACKED_KEYS = {"vit_calls", "executed_flops", "executed_over_useful", "attn_mask_bytes"}


def _json(*args: str) -> dict:
    render.reset_consoles()
    r = CliRunner().invoke(app, ["bucket-plan", "--preset", PRESET, *args, "--json"], env={"NO_COLOR": "1"})
    render.reset_consoles()
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _workload(tmp_path: Path, text: str, name: str = "wl.jsonl") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_five_minute_video(tmp_path):
    d = _json("-w", _workload(tmp_path, VIDEO_5MIN))
    s, it = d["summary"], d["items"][0]
    assert (s["vit_calls"], s["executed_over_useful"]) == (300, pytest.approx(9.06, abs=0.01))  # today
    assert set(s["packed"]) >= PACKED_KEYS
    assert s["packed"]["vit_calls"] == 38 and s["packed"]["executed_over_useful"] <= 1.2
    assert s["packed"]["attn_mask_bytes"] == 38 * 1024 * 1024 * 2
    assert (it["vit_calls"], it["vit_calls_packed"]) == (300, 38)


def test_images_in_one_request_and_separate_requests(tmp_path):
    d = _json("-w", _workload(tmp_path, EIGHT_IMAGES))
    assert (d["summary"]["vit_calls"], d["summary"]["packed"]["vit_calls"]) == (8, 3)
    assert d["items"][0]["lm_tokens"] == 8 * 80
    # eight separate single-image requests are never packed across requests
    d = _json("-w", _workload(tmp_path, '{"width": 320, "height": 240, "count": 8}\n'))
    assert d["summary"]["packed"]["vit_calls"] == 8 and d["items"][0]["vit_calls_packed"] == 1  # per request
    assert d["summary"]["packed"]["executed_flops"] == d["summary"]["executed_flops"]


def test_no_vit_packing_gives_todays_figures(tmp_path):
    wl = _workload(tmp_path, VIDEO_5MIN + EIGHT_IMAGES)
    on, off = _json("-w", wl), _json("-w", wl, "--no-vit-packing")
    assert "packed" not in off["summary"]
    assert all(it["vit_calls_packed"] == it["vit_calls"] for it in off["items"])
    same = ("vit_calls", "executed_flops", "executed_over_useful", "buckets")
    assert {k: on["summary"][k] for k in same} == {k: off["summary"][k] for k in same}
    by_preset = _json("-w", wl, "--set", "runtime.vit_packing=false")
    assert "packed" not in by_preset["summary"]


def test_optimize_packed_cost(tmp_path):
    wl = _workload(tmp_path, VIDEO_5MIN + '{"width": 1024, "height": 1024, "count": 20}\n')
    on, off = _json("-w", wl, "--optimize", "1"), _json("-w", wl, "--optimize", "1", "--no-vit-packing")
    assert on["optimized"]["cost"] == "packed" and off["optimized"]["cost"] == "unpacked"
    # the packed optimum is at most the unpacked optimum costed packed, and is what the packed summary finds
    assert on["optimized"]["executed"] <= off["optimized"]["executed"]
    assert on["optimized"]["vit_calls_packed"] < on["optimized"]["vit_calls"]


def test_human_output_side_by_side(tmp_path):
    render.reset_consoles()
    r = CliRunner().invoke(
        app, ["bucket-plan", "--preset", PRESET, "-w", _workload(tmp_path, VIDEO_5MIN)], env={"COLUMNS": "200"}
    )
    render.reset_consoles()
    assert r.exit_code == 0 and "300 -> 38 calls" in r.stdout and "packed" in r.stdout


def test_workload_images_key(tmp_path):
    wl = read_workload(_workload(tmp_path, EIGHT_IMAGES + '{"width": 320, "height": 240, "images": 1}\n'))
    assert wl.sizes == {(320, 240, None, None, 8): 1, (320, 240, None, None): 1}
    for bad in ('{"width": 3, "height": 4, "images": 0}', '{"width": 3, "height": 4, "frames": 9, "images": 2}'):
        with pytest.raises(InputError, match="images"):
            read_workload(_workload(tmp_path, bad + "\n", "bad.jsonl"))
    csv = tmp_path / "w.csv"
    csv.write_text("width,height,images\n320,240,8\n")
    assert read_workload(csv).sizes == {(320, 240, None, None, 8): 1}


@pytest.mark.parametrize("value", ["1", '"yes"', "[true]", "null"])
def test_runtime_vit_packing_must_be_boolean(value):
    with pytest.raises(InputError, match=r"runtime\.vit_packing=.* must be true or false"):
        build_plan(PRESET, [f"runtime.vit_packing={value}"])


def test_runtime_section_default_and_cli_error():
    assert build_plan(PRESET).runtime == {"vit_packing": True}
    assert build_plan(PRESET, ["runtime.vit_packing=false"]).runtime == {"vit_packing": False}
    with pytest.raises(InputError, match="unknown key 'runtime.vit_pack'"):
        build_plan(PRESET, ["runtime.vit_pack=true"])
    r = run_qvl("bucket-plan", "--preset", PRESET, "--size", "640x480", "--set", "runtime.vit_packing=2")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "qvl: error: --set: runtime.vit_packing=2 must be true or false; "
        "fix: set runtime.vit_packing: true or runtime.vit_packing: false"
    ]


def test_optimize_packed_with_max_bucket_costs_every_list_on_the_same_calls(tmp_path):
    lines = [
        {"width": 1920, "height": 1080, "count": 100},
        {"width": 640, "height": 480, "count": 300},
        {"width": 1280, "height": 720, "count": 10, "frames": 64, "fps": 30},
    ]
    wl = _workload(tmp_path, "".join(json.dumps(x) + "\n" for x in lines))
    opt = _json("-w", wl, "--optimize", "2", "--max-bucket", "4096")["optimized"]
    assert opt["buckets"][-1] == 4096 and opt["cost"] == "packed"  # the cap is the top, as unpacked
    assert {(b["covered_calls"], b["uncovered_calls"]) for b in [opt, *opt["baselines"].values()]} == {(420, 0)}
    assert all(opt["executed"] <= b["executed"] for b in opt["baselines"].values())


@pytest.mark.parametrize(("flags", "expected"), [((), True), (("--no-vit-packing",), False)])
def test_infer_flag_reaches_the_runner(monkeypatch, flags, expected):
    from qwenvl_rbln.inference import runner

    seen = {}

    def fake_run_infer(opts, **_):
        seen["vit_packing"] = opts.vit_packing
        raise InputError("stop here", "test")

    monkeypatch.setattr(runner, "run_infer", fake_run_infer)
    render.reset_consoles()
    CliRunner().invoke(app, ["infer", "--prompt", "hi", *flags])
    render.reset_consoles()
    assert seen == {"vit_packing": expected}
