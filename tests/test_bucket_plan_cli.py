"""`qvl bucket-plan` end to end: files, sizes, workloads, --optimize, --batch-trace, bad inputs."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qwenvl_rbln.cli import app
from qwenvl_rbln.errors import DoesNotFit, InputError
from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_2B
from qwenvl_rbln.views import render
from qwenvl_rbln.vision import buckets as bk
from tests.helpers_cli import run_qvl

Image = pytest.importorskip("PIL.Image")

ITEM_KEYS = {
    "input",
    "kind",
    "height",
    "width",
    "resized_height",
    "resized_width",
    "patches",
    "bucket",
    "lm_tokens",
    "vit_calls",
    "error",
    "padding_pct",
    "count",
}


def _invoke(*args: str, columns: str | None = "200"):
    """``columns=None``: no COLUMNS at all, as when a user pipes the output (CliRunner's stdout is no terminal)."""
    render.reset_consoles()
    result = CliRunner().invoke(app, ["bucket-plan", *args], env={"COLUMNS": columns, "NO_COLOR": "1"})
    render.reset_consoles()
    return result


def _json(*args: str) -> tuple[int, dict]:
    r = _invoke(*args, "--json")
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.exit_code, json.loads(r.stdout)


def _png_header_only(width: int, height: int) -> bytes:
    """A structurally complete PNG declaring any size (pixels are never read)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


@pytest.fixture()
def media_dir(tmp_path: Path) -> Path:
    d = tmp_path / "imgs"
    d.mkdir()
    Image.new("RGB", (640, 480), "red").save(d / "a_small.png")
    Image.new("RGB", (1920, 1080), "blue").save(d / "b_fullhd.jpg", quality=50)
    (d / "c_corrupt.jpg").write_bytes(b"this is not a jpeg at all")
    full = (d / "a_small.png").read_bytes()
    (d / "d_truncated.png").write_bytes(full[: len(full) // 2])
    (d / "e_bomb.png").write_bytes(_png_header_only(20000, 20000))  # 400 Mpx > 2x Pillow's limit
    (d / "f_skinny.png").write_bytes(_png_header_only(10, 3000))  # aspect ratio 300 > 200
    (d / "g_clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 but nothing else")
    return d


def test_files_with_bad_ones_are_items_with_errors(media_dir: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing.jpg"
    code, data = _json(str(media_dir), str(missing))
    assert code == 2
    items = {Path(it["input"]).name: it for it in data["items"]}
    assert set(items) == {
        "a_small.png",
        "b_fullhd.jpg",
        "c_corrupt.jpg",
        "d_truncated.png",
        "e_bomb.png",
        "f_skinny.png",
        "g_clip.mp4",
        "missing.jpg",
    }
    for it in data["items"]:
        assert set(it) >= ITEM_KEYS
    good = items["b_fullhd.jpg"]
    assert (good["kind"], good["width"], good["height"]) == ("image", 1920, 1080)
    assert (good["resized_width"], good["resized_height"], good["patches"], good["bucket"]) == (1920, 1088, 8160, 16384)
    assert good["lm_tokens"] == 2040 and good["vit_calls"] == 1 and good["error"] is None
    assert items["a_small.png"]["patches"] == 1200
    for name, needle in [
        ("c_corrupt.jpg", "not a recognised image"),
        ("d_truncated.png", "truncated"),
        ("e_bomb.png", "decompression-bomb"),
        ("f_skinny.png", "aspect ratio"),
        ("g_clip.mp4", "video"),
        ("missing.jpg", "no such file"),
    ]:
        it = items[name]
        assert it["error"] and needle in it["error"], (name, it["error"])
        assert name in it["error"]
        assert it["bucket"] is None
    assert items["g_clip.mp4"]["kind"] == "video"
    s = data["summary"]
    assert s["items"] == 8 and s["errors"] == 6 and s["vit_calls"] == 2


def test_human_output_still_summarises_and_exits_nonzero(media_dir: Path, tmp_path: Path) -> None:
    r = _invoke(str(media_dir), str(tmp_path / "missing.jpg"))
    assert r.exit_code == 2
    assert "b_fullhd.jpg" in r.stdout and "8,160" in r.stdout
    assert "per bucket" in r.stdout
    assert "cannot run" in r.stdout and "missing.jpg" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr
    assert "6 of 8 inputs" in r.stderr


@pytest.mark.parametrize("preset", ["rebel100-1npu", "rebel100-1npu-vit-buckets"])
def test_size_1920x1080(preset: str) -> None:
    code, data = _json("--preset", preset, "--size", "1920x1080")
    assert code == 0
    (it,) = data["items"]
    assert it["kind"] == "size" and it["patches"] == 8160 and it["bucket"] == 16384
    assert it["padding_pct"] == pytest.approx(100 * (16384 - 8160) / 16384, abs=0.01)
    row = {b["bucket"]: b for b in data["summary"]["buckets"]}[16384]
    assert row["calls"] == 1 and row["share"] == 1.0
    assert row["executed_over_useful"] > 1.5  # padding 8160 -> 16384 roughly doubles+ the compute
    assert row["attn_mask_bytes"] == 16384 * 16384 * 2


def test_json_shape() -> None:
    code, data = _json("--preset", "rebel100-1npu-vit-buckets", "--size", "640x480", "--size", "1280x720")
    assert code == 0
    assert set(data) >= {"items", "summary"}
    s = data["summary"]
    for key in (
        "preset",
        "vit_buckets",
        "processor",
        "buckets",
        "vit_calls",
        "lm_tokens",
        "executed_flops",
        "useful_flops",
        "executed_over_useful",
        "errors",
        "uncovered",
    ):
        assert key in s
    assert [b["bucket"] for b in s["buckets"]] == [1024, 3136, 16384]
    assert [it["bucket"] for it in data["items"]] == [3136, 16384]  # 1200 and 3520 patches
    assert sum(b["share"] for b in s["buckets"]) == pytest.approx(1.0)


def test_oversize_item_names_both_fixes() -> None:
    code, data = _json("--set", "processor.max_pixels=16777216", "--size", "4000x3000", "--on-oversize", "error")
    assert code == 2
    (it,) = data["items"]
    assert it["patches"] == 47000 and it["bucket"] is None
    assert "--set visual.max_seq_len=[16384,47000]" in it["error"]
    assert "--set processor.max_pixels=4194304" in it["error"]
    assert data["summary"]["uncovered"]["calls"] == 1


def test_oversize_item_is_planned_resized_by_default_as_infer_runs_it() -> None:
    code, data = _json("--set", "processor.max_pixels=16777216", "--size", "4000x3000")
    assert code == 0 and data["summary"]["on_oversize"] == "resize"
    (it,) = data["items"]
    assert it["error"] is None and it["oversize_capped"] is True and it["capped"] is True
    assert it["patches_before_cap"] == 47000 and it["patches"] <= 16384 and it["bucket"] == 16384
    assert (it["resized_width"], it["resized_height"]) == (2336, 1760)  # smart_resize under max_pixels 4194304
    assert any("--on-oversize resize" in n for n in it["notes"])
    assert data["summary"]["uncovered"]["calls"] == 0


def test_oversize_item_is_resized_into_the_largest_of_several_buckets_as_infer_runs_it() -> None:
    """The cap of --on-oversize resize is the largest bucket, not the first: with [1024, 3136, 16384] a 4000x3000
    image is planned at 2336x1760 (16,060 patches, bucket 16384), exactly as infer's vision plan runs it."""
    from qwenvl_rbln.inference import requests as rq
    from qwenvl_rbln.inference.vision_report import plan_vision
    from qwenvl_rbln.planning.plan import build_plan
    from qwenvl_rbln.vision.media import ImageInfo

    sets = ("--set", "processor.max_pixels=16777216")
    code, data = _json("-p", "rebel100-1npu-vit-buckets", *sets, "--size", "4000x3000")
    assert code == 0 and data["summary"]["vit_buckets"] == [1024, 3136, 16384]
    (it,) = data["items"]
    assert (it["resized_width"], it["resized_height"], it["patches"]) == (2336, 1760, 16060)
    assert it["bucket"] == 16384 and it["oversize_capped"] is True and it["patches_before_cap"] == 47000
    assert "processor.max_pixels=4194304" in it["notes"][-1]
    plan = build_plan("rebel100-1npu-vit-buckets", ["processor.max_pixels=16777216"])
    req = rq.Request(id="r", prompt="x")
    req.image_info = [ImageInfo(Path("a.jpg"), 4000, 3000, "JPEG", 1)]
    (ran,) = plan_vision([req], plan.processor, plan.vit_buckets).items["r"]
    assert (ran.resized_width, ran.resized_height, ran.patches, ran.bucket) == (2336, 1760, 16060, 16384)


def test_the_footnote_names_the_cap_that_resized_each_input() -> None:
    """8000x8000 under processor.max_pixels=16777216 resizes to 4096x4096 (65,536 patches), above the bucket:
    --on-oversize resize caps it to 2048x2048, and the footnote says so instead of blaming processor.max_pixels.
    Under the preset's own cap the same image is downscaled by processor.max_pixels, and that footnote stays."""
    r = _invoke("--set", "processor.max_pixels=16777216", "--size", "8000x8000")
    assert r.exit_code == 0, r.output
    assert "2048x2048\u2020" in r.stdout and "2048x2048*" not in r.stdout
    assert (
        "\u2020 capped by --on-oversize resize (from 65,536 patches): above the largest ViT bucket 16,384" in r.stdout
    )
    assert "downscaled by processor.max_pixels" not in r.stdout
    r = _invoke("--size", "8000x8000")
    assert r.exit_code == 0, r.output
    assert "2048x2048*" in r.stdout and "* downscaled by processor.max_pixels=4,194,304" in r.stdout
    assert "--on-oversize resize (from" not in r.stdout


def test_the_preset_key_sets_the_policy_and_the_flag_overrides_it() -> None:
    big = ("--set", "processor.max_pixels=16777216", "--size", "4000x3000")
    code, data = _json(*big, "--set", "runtime.on_oversize=error")
    assert code == 2 and data["items"][0]["bucket"] is None and data["summary"]["on_oversize"] == "error"
    code, data = _json(*big, "--set", "runtime.on_oversize=error", "--on-oversize", "resize")
    assert code == 0 and data["items"][0]["bucket"] == 16384
    r = _invoke("--size", "64x64", "--on-oversize", "shrink")
    assert isinstance(r.exception, InputError) and "--on-oversize 'shrink'" in r.exception.message


def _workload(tmp_path: Path) -> Path:
    p = tmp_path / "wl.jsonl"
    lines = [
        {"width": 640, "height": 480, "count": 500},
        {"width": 1280, "height": 720, "count": 300},
        {"width": 1920, "height": 1080, "count": 120},
        {"width": 1024, "height": 1024, "count": 50},
        {"width": 1280, "height": 720, "frames": 300, "fps": 30, "count": 10},
    ]
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def test_optimize_on_a_workload(tmp_path: Path) -> None:
    code, data = _json(
        "--preset", "rebel100-1npu-vit-buckets", "--workload", str(_workload(tmp_path)), "--optimize", "3"
    )
    assert code == 0
    assert data["workload"]["requests"] == 980 and data["workload"]["distinct"] == 5
    items = {it["input"]: it for it in data["items"]}
    assert items["640x480"]["count"] == 500 and items["640x480"]["source"] == "workload"
    video = items["1280x720 300f@30fps"]
    assert video["kind"] == "video" and video["vit_calls"] == 10 and video["patches"] == 3520
    opt = data["optimized"]
    # 4 distinct patch counts (1200 x500, 3520 x400 incl. 10 videos x 10 calls, 4096 x50, 8160 x120), K=3:
    # padding the 3520s to 4096 costs less ViT compute than padding the 4096s to 8160.
    assert opt["buckets"] == [1200, 4096, 8160]
    assert opt["set"] == "--set visual.max_seq_len=[1200,4096,8160]"
    cost = bk.vit_cost_fn(QWEN3_VL_2B.vision)
    counts = {1200: 500, 3520: 400, 4096: 50, 8160: 120}
    assert opt["executed"] == bk.evaluate_buckets(counts, [1200, 4096, 8160], cost).executed
    assert opt["executed"] < bk.evaluate_buckets(counts, [1200, 3520, 8160], cost).executed
    assert set(opt["baselines"]) == {"preset", "single_largest", "powers_of_two"}
    assert opt["executed_over_useful"] >= 1.0
    assert opt["executed_over_useful"] <= opt["baselines"]["preset"]["executed_over_useful"]
    assert opt["executed_over_useful"] <= opt["baselines"]["single_largest"]["executed_over_useful"]
    assert opt["baselines"]["single_largest"]["buckets"] == [8160]
    assert opt["baselines"]["powers_of_two"]["buckets"][-1] == 8192
    human = _invoke("--workload", str(_workload(tmp_path)), "--optimize", "2", "--rows", "2")
    assert human.exit_code == 0
    assert "use: --set visual.max_seq_len=[" in human.stdout
    assert "3 more distinct sizes not shown" in human.stdout


def test_optimize_with_max_bucket(tmp_path: Path) -> None:
    code, data = _json("--workload", str(_workload(tmp_path)), "--optimize", "2", "--max-bucket", "4096")
    assert code == 0
    opt = data["optimized"]
    assert opt["buckets"][-1] == 4096  # the cap is the top bucket: the re-planned inputs resize into it
    assert opt["uncovered_calls"] == 0 and opt["covered_calls"] == data["summary"]["vit_calls"] == 1070
    rep = opt["replanned"]
    assert rep["inputs"] == 120 and rep["vit_calls"] == 120 and rep["max_patches_before"] == 8160
    assert rep["processor"] == {"max_pixels": 4096 * 256}
    assert opt["set"] == "--set visual.max_seq_len=[" + ",".join(map(str, opt["buckets"])) + "] " + rep["set"]


def _max_bucket_workload(tmp_path: Path) -> Path:
    """The audit's workload: 100 full-HD images above a 4096 cap, 360 below it, one video."""
    p = tmp_path / "w1.jsonl"
    lines = [
        {"width": 1920, "height": 1080, "count": 100},
        {"width": 640, "height": 480, "count": 300},
        {"width": 224, "height": 224, "count": 50},
        {"width": 1280, "height": 720, "count": 10, "frames": 64, "fps": 30},
    ]
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def test_max_bucket_costs_every_list_on_the_same_calls(tmp_path: Path) -> None:
    """Audit: the preset row counted 470 calls, the others 370 (the 100 above the cap left out): 44x 'speedup'."""
    from qwenvl_rbln.vision.geometry import image_geometry

    wl = str(_max_bucket_workload(tmp_path))
    args = ("--preset", "rebel100-1npu", "--workload", wl, "--optimize", "2", "--max-bucket", "4096")
    code, data = _json(*args, "--no-vit-packing")  # unpacked costs (test_packing_cli checks the packed ones)
    assert code == 0
    opt = data["optimized"]
    lists = [opt, *opt["baselines"].values()]
    assert {(b["covered_calls"], b["uncovered_calls"]) for b in lists} == {(470, 0)}
    resized = image_geometry(1920, 1080, max_pixels=4096 * 256).patches  # what --set processor.max_pixels does
    assert resized <= 4096
    cost = bk.vit_cost_fn(QWEN3_VL_2B.vision)
    counts = {resized: 100, 1200: 300, 256: 50, 3520: 20}
    assert opt["useful"] == sum(n * cost(v) for v, n in counts.items())
    for name, b in opt["baselines"].items():
        assert b["useful"] == opt["useful"], name  # the same calls at the same patch counts
        assert b["executed"] == bk.evaluate_buckets(counts, b["buckets"], cost).executed, name
    assert opt["speedup_vs_preset"] == pytest.approx(opt["baselines"]["preset"]["executed"] / opt["executed"], 1e-3)
    assert opt["speedup_vs_preset"] < 44  # the audit's figure compared 470 calls with 370
    assert "--set processor.max_pixels=1048576" in opt["set"]
    assert "470 ViT calls" in opt["compared_on"] and "100 of them re-planned" in opt["compared_on"]
    human = _invoke("--preset", "rebel100-1npu", "--workload", wl, "--optimize", "2", "--max-bucket", "4096")
    assert human.exit_code == 0
    assert "every list on the same 470 ViT calls" in human.stdout
    assert "above --max-bucket 4,096" in human.stdout and "processor.max_pixels=1048576" in human.stdout


def test_max_bucket_replans_a_video_with_a_per_frame_cap(tmp_path: Path) -> None:
    p = tmp_path / "v.jsonl"
    p.write_text(json.dumps({"width": 3840, "height": 2160, "frames": 8, "fps": 2, "count": 3}) + "\n")
    code, data = _json("--workload", str(p), "--optimize", "1", "--max-bucket", "4096")
    assert code == 0
    opt = data["optimized"]
    (item,) = data["items"]
    assert item["patches"] > 4096 and item["sampled_frames"] == 8
    assert opt["replanned"]["processor"] == {"video_max_frame_pixels": 4096 * 256}  # per frame, any frame count
    assert "--set processor.video_max_frame_pixels=1048576" in opt["set"]
    assert opt["buckets"] == [4096] and opt["uncovered_calls"] == 0
    assert opt["covered_calls"] == item["vit_calls"] * 3


def test_max_bucket_below_min_pixels_is_an_input_error() -> None:
    r = _invoke("--size", "1920x1080", "--optimize", "1", "--max-bucket", "128")
    assert isinstance(r.exception, InputError), r.output
    text = r.exception.one_line()
    assert "processor.max_pixels=32768" in text and "processor.min_pixels=65536" in text


def test_no_speedup_against_a_preset_that_cannot_run_every_call() -> None:
    code, data = _json(
        "--set",
        "processor.max_pixels=16777216",
        "--size",
        "4000x3000",
        "--size",
        "640x480",
        "--optimize",
        "2",
        "--on-oversize",
        "error",
    )
    assert code == 2  # the 4000x3000 item has no bucket in the preset
    opt = data["optimized"]
    assert opt["baselines"]["preset"]["uncovered_calls"] == 1 and opt["uncovered_calls"] == 0
    assert opt["speedup_vs_preset"] is None
    assert "cannot run 1 of these ViT calls" in opt["speedup_note"]


def test_batch_trace_and_decoder_optimiser(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps([4, 4, 3, 3, 3, 1, 2, 4]))
    code, data = _json("--preset", "rebel100-1npu-batch4", "--batch-trace", str(trace), "--optimize-decoder", "2")
    assert code == 0
    dec = data["decoder"]
    assert dec["decoder_batch_sizes"] == [1, 2, 4]
    per = {e["batch"]: e for e in dec["per_batch"]}
    assert per[3]["graph"] == 4 and per[3]["padded_rows"] == 3
    assert dec["padded_rows"] == 3 and dec["steps"] == 8
    opt = dec["optimized"]
    assert opt["decoder_batch_sizes"] == [3, 4] and opt["padded_rows"] == 3  # 1->3, 2->3
    assert opt["set"] == "--set decoder_batch_sizes=[3,4]"
    assert "vllm-rbln" in dec["note"]
    r = _invoke("--preset", "rebel100-1npu-batch4", "--batch-trace", str(trace))
    assert r.exit_code == 0 and "decoder graphs" in r.stdout


def test_batch_trace_above_the_largest_graph(tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text("1\n2\n")
    code, data = _json("--batch-trace", str(trace))  # rebel100-1npu: batch 1
    assert code == 2
    assert data["decoder"]["uncovered_steps"] == 1
    assert "--set batch_size=2" in data["decoder"]["per_batch"][1]["error"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "needs something to plan"),
        (["--size", "1920by1080"], "1920by1080"),
        (["--size", "640x480", "--optimize", "0"], "--optimize 0"),
        (["--size", "640x480", "--max-bucket", "4096"], "--max-bucket only applies"),
        (["--size", "640x480", "--optimize", "2", "--max-bucket", "1001"], "multiple of 4"),
        (["--size", "640x480", "--optimize-decoder", "2"], "--batch-trace"),
        (["--optimize-decoder", "2"], "--optimize-decoder needs --batch-trace FILE"),
        (["--optimize", "2"], "--optimize needs inputs"),
        (["--workload", "/nonexistent/w.jsonl"], "no such workload file"),
    ],
)
def test_bad_flags_are_input_errors(args: list[str], needle: str) -> None:
    r = _invoke(*args)
    assert isinstance(r.exception, InputError), r.output
    assert needle in r.exception.one_line()


def test_exit_code_and_one_line_error_through_the_real_entry_point(tmp_path: Path) -> None:
    r = run_qvl("bucket-plan", "--size", "640x480", str(tmp_path / "nope.png"), "--json")
    assert r.exit_code == 2
    data = json.loads(r.stdout)
    assert data["items"][0]["error"] and data["items"][1]["bucket"] == 16384
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("qvl: error:") and len(r.stderr.strip().splitlines()) == 1
    bad = run_qvl("bucket-plan", "--size", "nope")
    assert bad.exit_code == 2 and "Traceback" not in bad.stderr and "'nope'" in bad.stderr


# --- human tables: never a cut number -------------------------------------------------------------


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("│", "┃"))]


def test_piped_tables_keep_every_cell_whole() -> None:
    """Audit: `bucket-plan --size 1920x1080 | cat` printed `1920x1…` and `773… GFL…` (80 columns)."""
    r = _invoke("--preset", "rebel100-1npu-vit-buckets", "--size", "1920x1080", columns=None)
    assert r.exit_code == 0, r.output
    assert "…" not in r.stdout
    for cell in ("1920x1080", "1920x1088", "8,160", "16,384", "37.11 TFLOP", "512.00 MiB", "LM tokens"):
        assert cell in r.stdout, cell
    assert "left out" not in r.stdout


@pytest.mark.parametrize("columns", ["80", "60"])
def test_narrow_terminal_leaves_columns_out_instead_of_cutting_numbers(tmp_path: Path, columns: str) -> None:
    wl = str(_max_bucket_workload(tmp_path))
    args = ("--preset", "rebel100-1npu", "--workload", wl, "--optimize", "2", "--max-bucket", "4096")
    r = _invoke(*args, columns=columns)
    assert r.exit_code == 0, r.output
    assert "…" not in r.stdout
    if columns == "80":
        assert all(len(line) <= 80 for line in r.stdout.splitlines())
        assert "1920x1088" in r.stdout and "11.28x" in r.stdout
    for number in ("1,200", "8,160", "16,384", "17.44 PFLOP", "843.88 TFLOP", "1200, 4096"):
        assert number in r.stdout, number
    assert "left out at" in r.stdout and "LM tokens" in r.stdout.split("left out at", 1)[1]


def test_render_print_table_drops_by_priority_and_never_truncates() -> None:
    from rich.console import Console

    console = Console(width=40, record=True, file=open(os.devnull, "w"), color_system=None)  # noqa: SIM115
    cols = [render.Col("name", "left", fold=True), render.Col("a", drop=2), render.Col("big"), render.Col("b", drop=1)]
    rows = [["some long file name.png", "123,456", "98,765,432,100", "777,777,777"]]
    dropped = render.print_table(console, cols, rows)
    text = console.export_text()
    assert dropped == ["a", "b"] and "98,765,432,100" in text and "…" not in text
    wide = Console(width=30, record=True, file=open(os.devnull, "w"), color_system=None)  # noqa: SIM115
    render.print_table(wide, [render.Col("x"), render.Col("y")], [["1" * 20, "2" * 20]])  # cannot fit: wraps
    text = wide.export_text()
    assert "1" * 20 in text and "2" * 20 in text


# --- the closing error line and empty inputs ------------------------------------------------------------


def test_json_mode_final_error_points_into_the_json(tmp_path: Path) -> None:
    """Audit: --json said '(listed above)' on stderr, where nothing was listed."""
    trace = tmp_path / "t.txt"
    trace.write_text("1\n2\n")
    r = run_qvl("bucket-plan", "--size", "640x480", str(tmp_path / "nope.png"), "--batch-trace", str(trace), "--json")
    assert r.exit_code == 2
    json.loads(r.stdout)
    (line,) = r.stderr.strip().splitlines()
    assert "listed above" not in line
    assert "items[].error" in line and "decoder.per_batch[].error" in line and "in the JSON" in line
    human = run_qvl("bucket-plan", "--size", "640x480", str(tmp_path / "nope.png"))
    assert "(listed above)" in human.stderr and "cannot run" in human.stdout


@pytest.mark.parametrize("files", [[], ["c.heic", "noext"], ["notes.txt"]])
def test_nothing_to_plan_is_an_error_naming_the_inputs(tmp_path: Path, files: list[str]) -> None:
    """Audit: an empty directory, or one with only .heic / extension-less files, exited 0 with items: []."""
    d = tmp_path / "photos"
    d.mkdir()
    for name in files:
        (d / name).write_bytes(b"x")
    r = run_qvl("bucket-plan", str(d), "--json")
    assert r.exit_code == 2 and json.loads(r.stdout)["error"]["exit_code"] == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("qvl: error: nothing to plan:") and str(d) in line and "; fix: " in line
    for name in files:
        assert name in line


def test_skipped_files_are_reported_with_count_and_names(tmp_path: Path) -> None:
    d = tmp_path / "photos"
    d.mkdir()
    Image.new("RGB", (64, 48)).save(d / "a.png")
    for name in ("b.heic", "c.HEIC", "README"):
        (d / name).write_bytes(b"x")
    (d / ".DS_Store").write_bytes(b"x")  # hidden: not worth a warning
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_qvl("bucket-plan", str(d), str(empty), "--json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert [Path(it["input"]).name for it in data["items"]] == ["a.png"]
    assert data["skipped_files"]["count"] == 3
    assert "skipped 3 file(s)" in r.stderr and "b.heic" in r.stderr and "README" in r.stderr
    assert ".DS_Store" not in r.stderr
    assert f"{empty}: no image or video files" in r.stderr


def test_each_bucket_says_whether_the_whole_plan_fits_with_it_as_the_largest():
    """Issue: memory per bucket in bucket-plan. Batch 4 at 262144 does not fit beside a 16384 ViT bucket; the
    summary carries the plan's verdict and the planner's first fix, as `compile --dry-run` does."""
    sets = ["--set", "max_seq_len=262144", "--set", "visual.max_seq_len=[1024,4096,16384]"]
    r = _invoke("--preset", "rebel100-1npu-batch4", *sets, "--size", "1920x1080", "--json")
    assert isinstance(r.exception, DoesNotFit), r.exception  # the plan does not fit: exit 4, as compile --dry-run
    data = json.loads(r.stdout)
    verdicts = {r["bucket"]: r["plan_fits_with_this_as_largest"] for r in data["summary"]["buckets"]}
    assert verdicts == {1024: True, 4096: True, 16384: False}
    mem = data["summary"]["memory"]
    assert mem["fits"] is False and mem["devices"][0]["device"] == 0 and not mem["devices"][0]["fits"]
    assert mem["verdict"] == "does_not_fit" and mem["devices"][0]["verdict"] == "does_not_fit"
    assert mem["suggestions"][0] == "--set max_seq_len=163840"
    code, data = _json("--preset", "rebel100-1npu", "--size", "1920x1080")
    assert code == 0
    assert data["summary"]["memory"]["fits"] is True and data["summary"]["memory"]["suggestions"] == []
    result = _invoke("--preset", "rebel100-1npu-batch4", *sets, "--size", "1920x1080")
    assert isinstance(result.exception, DoesNotFit)
    assert "memory (whole plan): does not fit" in result.stdout and "try --set max_seq_len=163840" in result.stdout


def test_the_whole_plan_memory_line_names_what_decides_it() -> None:
    """Audit D9: bucket-plan's one-line verdict names the constraint (here the fullest chiplet), not only the card
    totals that look comfortable; --json carries the same headline and decided_by."""
    result = _invoke("--preset", "rebel100-8b", "--set", "batch_size=2", "--size", "1920x1080")
    line = next(x for x in result.stdout.splitlines() if x.startswith("memory (whole plan)"))
    assert line.startswith("memory (whole plan): uncertain: fullest chiplet"), line
    assert "of 35.00 GiB" in line and "device 0 113.49 GiB of 140.00 GiB" in line
    code, data = _json("--preset", "rebel100-8b", "--set", "batch_size=2", "--size", "1920x1080", "--uncertain-ok")
    mem = data["summary"]["memory"]
    assert mem["headline"].startswith("uncertain: fullest chiplet") and mem["decided_by"]


def test_an_ignored_workload_key_that_looks_like_markup_prints_literally(tmp_path: Path) -> None:
    """The warning names the key as written: no rich tag swallowed, no stray backslash from double escaping."""
    wl = tmp_path / "w.jsonl"
    wl.write_text('{"width": 640, "height": 480, "[bold]note": "x"}\n')
    r = run_qvl("bucket-plan", "-w", str(wl), "--json")
    assert r.exit_code == 0, r.stderr
    (line,) = [x for x in r.stderr.splitlines() if "ignored keys" in x]
    assert "[bold]note" in line and "\\[" not in line


def test_the_processor_line_names_the_per_frame_video_cap() -> None:
    """The human header states the cap that keeps every video frame inside the largest bucket, as --json has it."""
    code, data = _json("--size", "640x480")
    cap = data["summary"]["processor"]["video_max_frame_pixels"]
    human = _invoke("--size", "640x480")
    assert code == human.exit_code == 0 and cap == 16384 * 256  # rebel100-1npu: the largest bucket x 256
    assert f"and {cap:,} px per frame" in human.stdout
