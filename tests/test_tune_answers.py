"""qvl tune's answers hold up: every request fits --context, a video workload gets buckets the plan accepts, the
margin shown is the one that binds, smaller images are offered when they are what fits, a narrow table says what
it left out, -o never loses a file, and the batch search reaches its cap."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict
from pathlib import Path

import pytest

from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_TINY
from qwenvl_rbln.tuning.search import BATCH_CAP, Needs
from qwenvl_rbln.tuning.tune import run_tune
from tests.helpers_cli import run_qvl


def _workload(path: Path, *lines: dict) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """Two common image sizes: tunes in well under a second."""
    root = tmp_path_factory.mktemp("answers")
    return _workload(root / "small.jsonl", {"width": 1280, "height": 720, "count": 5}, {"width": 640, "height": 480})


# --- S02: the batch search reaches BATCH_CAP ---------------------------------------------------------------------


def test_a_tiny_model_reaches_the_batch_cap_and_says_so(tmp_path):
    text, vision = asdict(QWEN3_VL_TINY.text), asdict(QWEN3_VL_TINY.vision)
    text.pop("moe", None)
    tied = text.pop("tie_word_embeddings")
    config = {"model_type": "qwen3_vl", "tie_word_embeddings": tied, "text_config": text, "vision_config": vision}
    (tmp_path / "config.json").write_text(json.dumps(config))
    wl = _workload(tmp_path / "wl.jsonl", {"width": 256, "height": 256, "count": 10})
    # a load of BATCH_CAP requests in flight: only the largest batch carries it all (without it, tune ranks at half)
    doc, error = run_tune(Needs(model=str(tmp_path), context=1024, concurrency=BATCH_CAP), wl)
    assert error is None
    assert [(f["largest_batch"], f["batch_cap_reached"]) for f in doc["frontier"]] == [(BATCH_CAP, True)]
    assert BATCH_CAP == 256 and doc["best"]["batch_size"] == 256
    res = run_qvl("tune", "--model", str(tmp_path), "-w", str(wl), "--context", "1024")
    assert res.exit_code == 0, res.stderr
    assert "batch 256 is the search's cap" in " ".join(res.stdout.split())


# --- D6, D24: -o never loses a file --------------------------------------------------------------------------------


def test_output_never_replaces_a_file_tune_did_not_write(small, tmp_path):
    notes = tmp_path / "existing.yaml"
    notes.write_text("my precious notes\n")
    res = run_qvl("tune", "-w", str(small), "--context", "32768", "-o", str(notes))
    assert res.exit_code == 2 and "was not written by qvl tune" in res.stderr and "--force" in res.stderr
    assert "Traceback" not in res.stderr and notes.read_text() == "my precious notes\n"
    assert [p.name for p in tmp_path.iterdir()] == ["existing.yaml"]  # no temporary file left behind
    forced = run_qvl("tune", "-w", str(small), "--context", "32768", "-o", str(notes), "--force")
    assert forced.exit_code == 0, forced.stderr
    assert notes.read_text().startswith("# Written by `qvl tune`.") and "replaced" in forced.stdout


def test_output_replaces_its_own_preset_with_umask_permissions(small, tmp_path):
    out = tmp_path / "t.yaml"
    old = os.umask(0o022)
    try:
        first = run_qvl("tune", "-w", str(small), "--context", "32768", "-o", str(out))
        again = run_qvl("tune", "-w", str(small), "--context", "32768", "-o", str(out), "--json")
    finally:
        os.umask(old)
    assert first.exit_code == 0 and "written" in first.stdout and "replaced" not in first.stdout
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout)["preset_replaced"] is True
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # what the umask gives any new file, not 0600


def test_output_never_creates_folders_and_names_a_file_in_the_path(small, tmp_path):
    missing = tmp_path / "nodir" / "t.yaml"
    res = run_qvl("tune", "-w", str(small), "--context", "32768", "-o", str(missing))
    assert res.exit_code == 2 and "does not exist" in res.stderr and str(missing.parent) in res.stderr
    assert not missing.parent.exists()
    (tmp_path / "existing.yaml").write_text("x\n")
    under_file = tmp_path / "existing.yaml" / "t.yaml"
    res = run_qvl("tune", "-w", str(small), "--context", "32768", "-o", str(under_file))
    assert res.exit_code == 2 and "is a file, not a folder" in res.stderr and "File exists" not in res.stderr


# --- D2: every request fits --context ------------------------------------------------------------------------------


def test_a_request_above_the_context_is_refused_with_its_line_and_the_fix(tmp_path):
    wl = _workload(tmp_path / "img40.jsonl", {"width": 1920, "height": 1080, "images": 40, "count": 10})
    res = run_qvl("tune", "-w", str(wl), "--context", "32768", "-o", str(tmp_path / "img40.yaml"))
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res.stderr
    line = " ".join(res.stderr.split())
    assert "request 1920x1080 x40 needs 82,064 tokens" in line and "above --context 32768" in line
    assert "raise --context to 82064" in line and "send at most 15 of these images per request" in line
    assert not (tmp_path / "img40.yaml").exists()


@pytest.mark.parametrize(
    ("line", "context", "extra", "needle"),
    [
        ({"width": 640, "height": 480}, 8192, {"prompt_tokens": 300000}, "lower --prompt-tokens/--output-tokens"),
        ({"width": 640, "height": 480}, 8192, {"output_tokens": 100000}, "raise --context to 100"),
        ({"width": 1920, "height": 1080, "images": 100000}, 32768, {}, "of these images per request"),
    ],
)
def test_prompt_output_and_image_tokens_all_count_against_the_context(tmp_path, line, context, extra, needle):
    from qwenvl_rbln.errors import InputError

    wl = _workload(tmp_path / "wl.jsonl", line)
    with pytest.raises(InputError) as err:
        run_tune(Needs(model=None, context=context), wl, **extra)
    assert f"above --context {context}" in err.value.one_line() and needle in err.value.one_line()


# --- D1: a video workload gets buckets the plan accepts ------------------------------------------------------------


def test_a_video_workload_gets_a_largest_bucket_that_holds_min_pixels(tmp_path):
    wl = _workload(tmp_path / "video.jsonl", {"width": 1280, "height": 720, "frames": 9000, "fps": 30, "count": 100})
    doc, error = run_tune(Needs(model=None, context=32768), wl)
    assert error is None, error
    assert doc["workload"]["vit_buckets"][-1] == 256 and "min_pixels=65536" in doc["workload"]["vit_buckets_note"]
    assert doc["best"]["batch_size"] >= 16 and doc["preset_verdict"] == "fits"


# --- D7: the margin shown is the one that binds --------------------------------------------------------------------


def test_the_margin_shown_is_the_fullest_chiplets_when_it_binds(small):
    from qwenvl_rbln.memory.planner import estimate_plan
    from qwenvl_rbln.planning.plan import build_plan
    from qwenvl_rbln.tuning.search import BASE_PRESET

    doc, _ = run_tune(Needs(model=None, context=32768, min_batch=4), small)
    best = doc["best"]
    report = estimate_plan(build_plan(BASE_PRESET, best["set"]), None, suggest=False).to_dict()
    chip = report["devices"][0]["chiplets"]
    chiplet = chip["usable_per_chiplet_bytes"] - chip["fullest_high_bytes"]
    assert chiplet < report["margin_low_bytes"]  # this case: the card has room, its fullest chiplet less
    assert best["margin_binding_bytes"] == chiplet and best["margin_binds"] == "chiplet"
    res = run_qvl("tune", "-w", str(small), "--context", "32768", "--min-batch", "4")
    row = next(line for line in res.stdout.splitlines() if line.startswith("│ 1 "))
    assert f"{chiplet / (1 << 30):+.2f} chiplet" in row and f"{report['margin_low_bytes'] / (1 << 30):+.2f}" not in row


def test_ties_go_to_the_larger_binding_margin_not_the_card_margin():
    from qwenvl_rbln.tuning.search import Config
    from qwenvl_rbln.tuning.tune import _rank_key

    cfg = Config(False, 8192, 32768, 4)
    roomy_card = {"score": 1.0, "margin_low_bytes": 30 << 30, "margin_binding_bytes": 1 << 28}  # a full chiplet
    even = {"score": 1.0, "margin_low_bytes": 10 << 30, "margin_binding_bytes": 2 << 30}
    assert sorted([(cfg, roomy_card), (cfg, even)], key=_rank_key)[0][1] is even


# --- D10: a narrow table says what it left out, and keeps the objective's column ----------------------------------


def _human(doc: dict, width: int) -> str:
    import io

    from rich.console import Console

    from qwenvl_rbln.views.tune import print_human

    out = io.StringIO()
    print_human(Console(file=out, width=width, no_color=True), doc)
    return " ".join(out.getvalue().split())


def test_a_narrow_table_names_the_columns_it_left_out_and_keeps_the_objective(small):
    doc, _ = run_tune(Needs(model=None, context=32768, min_batch=4, devices=2, objective="latency"), small)
    text = _human(doc, 80)
    assert "latency ms" in text and "left out at 80 columns: partition, ViT, margin GiB" in text
    assert "left out at" not in _human(doc, 200)


# --- D8: smaller images are offered when they are what fits --------------------------------------------------------

SIZES = (
    {"width": 1920, "height": 1080, "count": 40},
    {"width": 640, "height": 480, "count": 100},
    {"width": 3840, "height": 2160, "count": 3},
    {"width": 320, "height": 240, "images": 8},
    {"width": 1280, "height": 720, "frames": 9000, "fps": 30},
)


def test_the_30b_at_full_context_is_offered_the_shipped_presets_smaller_images(tmp_path):
    wl = _workload(tmp_path / "sizes.jsonl", *SIZES)
    doc, error = run_tune(Needs(model="Qwen/Qwen3-VL-30B-A3B-Instruct", context=262144), wl)
    assert error is not None and error.exit_code == 4
    smaller = [r for r in doc["nearest"] if r.get("images_max_pixels")]
    # rebel100-30b-a3b: buckets [1024, 4096], images at ~1 MP, batch 3 at 262144 on one card
    row = next(r for r in smaller if r["images_max_pixels"] <= 4096 * 256)
    assert (row["batch_size"], row["max_seq_len"], row["npus"], row["counts"]) == (3, 262144, 1, True)
    assert row["vit_buckets"][-1] <= 4096 and "resized" in row["gives_up"][0] and "~1.0 MP" in row["gives_up"][0]
    assert "visual.max_seq_len=[" in error.one_line() and "--set batch_size=3" in error.one_line()


def test_advice_never_names_a_change_that_cannot_help(tmp_path):
    wl = _workload(tmp_path / "sizes.jsonl", *SIZES)
    doc, error = run_tune(Needs(model=None, context=32768, device_memory="10GiB"), wl)
    assert error is not None and doc["nearest"]
    assert all(r.get("images_max_pixels") for r in doc["nearest"])  # only smaller images help at 10 GiB
    assert "lower --context" not in error.one_line() and "--devices 2" not in error.one_line()
    doc, error = run_tune(Needs(model=None, context=32768, device_memory="4GiB"), wl)
    assert error is not None and not doc["nearest"]
    line = error.one_line()
    assert "lower --context" not in line and "--devices 2" not in line and "nor smaller images" in line
    assert "fullest chiplet needs" in line  # the planner's own reason


# --- D19: the tune picture is readable -----------------------------------------------------------------------------


def _figure(monkeypatch, shape: dict):
    """Build the tune figure in memory (no file): its axes, for texts and limits."""
    from matplotlib.figure import Figure

    from qwenvl_rbln.views.plots import tune as plot

    built = []
    monkeypatch.setattr(plot, "draw", lambda path, build: built.append(build(Figure)))
    data = plot.draw_tune(shape, Path("unused.png"))
    return data, built[0].axes[0]


def _cand(label, thr, ttft, lat, chosen=False, rejected="slower", meets=True):
    return {"label": label, "throughput": thr, "ttft_s": ttft, "latency_s": lat, "verdict": "fits",
            "chosen": chosen, "rejected": None if chosen else rejected, "meets_needs": meets}  # fmt: skip


SHAPE = {
    "throughput_unit": "tokens/s",
    "candidates": [
        _cand("best", 660.0, 0.010, 0.30, chosen=True),
        _cand("partition 4096", 660.0, 0.010, 0.30, rejected="no faster"),
        _cand("graphs [20]", 660.0, 0.010, 0.30, rejected="no faster"),
        _cand("batch 19", 649.0, 0.010, 0.29, rejected="below the need", meets=False),
        _cand("ViT on device 1", 670.0, 0.012, 0.31),
        _cand("batch 8", 400.0, 0.010, 0.20),
    ],
}


def test_tune_plot_labels_stand_beside_the_plot_one_leader_line_per_point(monkeypatch):
    _, ax = _figure(monkeypatch, SHAPE)
    notes = [t for t in ax.texts if t.get_text()]
    lines = [t for t in notes if t.arrow_patch is not None]
    same = next(t for t in notes if t.get_text().startswith("at the same estimate as the chosen one"))
    assert same.arrow_patch is None and "partition 4096: no faster" in same.get_text()  # no line under the star
    assert len(lines) == 4 == len({(t.xy[0], t.xy[1]) for t in lines})  # the chosen one and 3 other points
    assert all(t.xyann[0] > 1.0 for t in notes)  # beside the axes, so no line crosses a label
    tops = [t.xyann[1] for t in notes]
    assert tops == sorted(tops, reverse=True) and len(set(tops)) == len(tops)
    assert ax.get_ylim()[0] == 0 and ax.get_xlim()[0] == 0  # a 649..670 spread is not drawn full height


def test_tune_plot_with_objective_latency_plots_latency(monkeypatch):
    data, ax = _figure(monkeypatch, {**SHAPE, "objective": "latency"})
    assert "latency per request" in ax.get_ylabel() and data["chosen"]["y"] == 0.30
    star = next(t for t in ax.texts if t.get_text().startswith("chosen: best"))
    assert star.xy == (0.010, 0.30) and "latency 0.300 s per request" in star.get_text()


def test_tune_plot_legend_never_says_fits_for_a_point_that_gives_up_a_need(monkeypatch, tmp_path):
    from qwenvl_rbln.views.plots.tune import from_tune_report

    wl = _workload(tmp_path / "sizes.jsonl", *SIZES)
    doc, error = run_tune(Needs(model="Qwen/Qwen3-VL-30B-A3B-Instruct", context=262144), wl)
    assert error is not None
    _, ax = _figure(monkeypatch, from_tune_report(doc))
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fits in memory, gives up a need (hollow)"]
    assert ax.get_ylim()[0] == 0
    _, ax = _figure(monkeypatch, SHAPE)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["fits in memory, gives up a need (hollow)", "fits, meets the needs", "chosen"]
