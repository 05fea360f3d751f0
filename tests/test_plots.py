"""`--plot FILE`: valid pictures whose numbers are the report's own, byte-identical on a rerun, and never a change
to stdout, ``--json`` or the exit code; without matplotlib one line and exit 3."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET

import pytest

from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import allocation_table, install, make_auto, make_rebel, run_main, write_artifact

pytest.importorskip("matplotlib")

WORKLOAD = [
    {"width": 1280, "height": 720, "frames": 900, "fps": 30},
    {"width": 320, "height": 240, "images": 8, "count": 5},
    {"width": 1920, "height": 1080, "count": 12},
    {"width": 800, "height": 600, "count": 30},
]
SVG = "{http://www.w3.org/2000/svg}"


def _texts(svg_path) -> list[str]:
    """Every text element of an SVG written with svg.fonttype none: what a reader sees, as strings."""
    root = ET.parse(svg_path).getroot()
    return ["".join(t.itertext()).strip() for t in root.iter(f"{SVG}text")]


def _png_ok(path) -> tuple[int, int]:
    from PIL import Image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert 10_000 < len(data) < 2_000_000
    with Image.open(path) as im:
        im.verify()
        return im.size


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "sizes.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in WORKLOAD))
    return path


def _bucket_plan(workload, capsys, *extra):
    argv = ["bucket-plan", "--preset", "rebel100-1npu-vit-buckets", "--workload", str(workload), *extra]
    return run_main(argv, capsys)


def test_bucket_plan_plot_numbers_are_the_reports(workload, tmp_path, capsys):
    from qwenvl_rbln.views.plots.bucket_plan import bucket_plan_data, draw_bucket_plan

    code, out, _ = _bucket_plan(workload, capsys, "--optimize", "2", "--json")
    assert code == 0
    report = json.loads(out)
    data = bucket_plan_data(report)
    preset, optimised = data["lists"]
    rows = {r["bucket"]: r for r in report["summary"]["buckets"]}
    for r in preset["rows"]:
        assert r["calls"] == rows[r["bucket"]]["calls"]
        if r["calls"]:
            assert r["padding_pct"] == pytest.approx(rows[r["bucket"]]["mean_padding_pct"], abs=0.01)
    assert sum(r["packed_calls"] for r in preset["rows"]) == report["summary"]["packed"]["vit_calls"]
    assert optimised["buckets"] == report["optimized"]["buckets"]
    assert report["optimized"]["cost"] == "packed" and data["packing"]
    assert sum(r["packed_calls"] for r in optimised["rows"]) == report["optimized"]["vit_calls_packed"]
    for lst in data["lists"]:  # a packed call executes its whole bucket: padding = executed - useful
        for r in lst["rows"]:
            assert r["packed_padding_patches"] == r["packed_calls"] * r["bucket"] - r["useful_patches"] >= 0
    assert sum(s["segments"] for s in data["segments"]) == report["summary"]["vit_calls"]

    svg = tmp_path / "plan.svg"
    assert draw_bucket_plan(report, svg) == data
    texts = _texts(svg)
    for r in preset["rows"]:
        if r["calls"]:
            assert f"{r['packed_padding_pct']:.1f}%" in texts  # the padding drawn, as the report packs
            assert str(r["calls"]) in texts
    assert any(f"executed/useful {report['summary']['executed_over_useful']:.2f}x" in t for t in texts)
    again = tmp_path / "again.svg"
    draw_bucket_plan(report, again)
    assert svg.read_bytes() == again.read_bytes()  # fixed style, salt and metadata: the same file twice


def test_plot_never_changes_stdout_json_or_exit_code(workload, tmp_path, capsys):
    for extra in ([], ["--json"]):
        code, out, err = _bucket_plan(workload, capsys, *extra)
        png = tmp_path / f"plan{len(extra)}.png"
        code_p, out_p, err_p = _bucket_plan(workload, capsys, *extra, "--plot", str(png))
        assert (code_p, out_p) == (code, out)
        assert err_p.splitlines()[-1] == f"plot: {png}" and err_p.startswith(err)
        _png_ok(png)
    # a dry run that does not fit: the same exit 4 and the same JSON, with its picture
    argv = ["compile", "--preset", "rebel100-1npu-batch4", "--set", "max_seq_len=262144", "--dry-run", "--json"]
    code, out, _ = run_main(argv, capsys)
    png = tmp_path / "memory.png"
    code_p, out_p, _ = run_main([*argv, "--plot", str(png)], capsys)
    assert code == code_p == 4 and out == out_p
    _png_ok(png)
    again = tmp_path / "again.png"
    run_main([*argv, "--plot", str(again)], capsys)
    assert png.read_bytes() == again.read_bytes()  # PNG too: the same bytes on a rerun
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left beside it


def test_memory_plot_of_a_dry_run(tmp_path, capsys):
    from qwenvl_rbln.views.plots.memory import draw_memory

    argv = ["compile", "--preset", "rebel100-1npu-batch4", "--set", "max_seq_len=262144", "--dry-run", "--json"]
    _, out, _ = run_main(argv, capsys)
    memory = json.loads(out)["memory"]
    data = draw_memory(memory, tmp_path / "m.svg", title="batch4")
    (dev,) = data["devices"]
    (report_dev,) = memory["devices"]
    assert sum(p["bytes"] for p in dev["parts"]) == report_dev["total_bytes"]
    assert sum(p["high"] for p in dev["parts"]) == report_dev["total_high_bytes"]
    assert {p["category"] for p in dev["parts"]} >= {"weights", "KV cache", "workspaces"}
    assert dev["verdict"] == "does_not_fit" and dev["usable"] == report_dev["usable_bytes"]
    chip = report_dev["chiplets"]
    bars = dev["chiplets"]["bars"]
    assert [b["bytes"] for b in bars] == chip["loads_bytes"] and len(bars) == chip["count"]  # every chiplet drawn
    fullest = max(bars, key=lambda b: b["bytes"])
    assert (fullest["bytes"], fullest["high"]) == (chip["fullest_bytes"], chip["fullest_high_bytes"])
    assert [s["cli"] for s in data["suggestions"]] == [s["cli"] for s in memory["suggestions"]]
    ghost = {s["label"]: s for s in data["suggestions"]}["visual_device"]
    assert [d["device"] for d in ghost["devices"]] == [0, 1]  # the ViT's own NPU is drawn as its own group
    texts = _texts(tmp_path / "m.svg")
    assert f"{report_dev['total_bytes'] / (1 << 30):.1f}" in texts
    assert any(t.startswith("usable 140 GiB") for t in texts)
    assert any("does not fit" in t for t in texts)


def test_load_check_plot_from_the_exact_read_out(tmp_path, monkeypatch, capsys):
    plan = build_plan("rebel100-1npu")
    root = write_artifact(tmp_path / "art", plan, alloc=allocation_table(plan))
    install(monkeypatch, make_auto(plan), rebel=make_rebel())
    code, out, _ = run_main(["load-check", str(root), "--no-runtime", "--json"], capsys)
    svg = tmp_path / "lc.svg"
    code_p, out_p, err_p = run_main(["load-check", str(root), "--no-runtime", "--json", "--plot", str(svg)], capsys)
    assert (code, _no_clock(out)) == (code_p, _no_clock(out_p)) and err_p.splitlines()[-1] == f"plot: {svg}"
    memory = json.loads(out)["memory"]
    assert memory["source"] == "exact"
    from qwenvl_rbln.views.plots.memory import memory_data

    data = memory_data(memory)
    (dev,) = data["devices"]
    assert sum(p["bytes"] for p in dev["parts"]) == memory["devices"][0]["total_bytes"]
    assert {p["category"] for p in dev["parts"]} == {"weights", "KV cache", "workspaces"}  # by allocation key
    assert [b["bytes"] for b in dev["chiplets"]["bars"]] == memory["devices"][0]["per_chiplet_bytes"]
    assert ET.parse(svg).getroot().tag == f"{SVG}svg"


def test_without_matplotlib_one_line_and_exit_3(workload, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    code, out, err = _bucket_plan(workload, capsys, "--plot", str(tmp_path / "p.png"))
    assert code == 3 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert 'pip install "qwenvl-rbln[plot]"' in err and "matplotlib" in err
    assert not (tmp_path / "p.png").exists()
    code, out, err = _bucket_plan(workload, capsys)  # without --plot nothing changes
    assert code == 0 and "plot" not in err


def test_bad_plot_path_refused_before_any_work(tmp_path, capsys):
    code, out, err = run_main(["bucket-plan", "--size", "640x480", "--plot", str(tmp_path / "p.jpg")], capsys)
    assert code == 2 and out == "" and "must end in .png or .svg" in err
    code, _, err = run_main(["bucket-plan", "--size", "640x480", "--plot", str(tmp_path / "no" / "p.png")], capsys)
    assert code == 2 and "does not exist" in err


TUNE = {
    "throughput_unit": "tokens/s",
    "candidates": [
        {"label": "b1", "throughput": 210.0, "ttft_s": 0.21, "verdict": "fits", "chosen": False, "rejected": "slow"},
        {"label": "b2", "throughput": 395.0, "ttft_s": 0.26, "verdict": "fits", "chosen": True, "rejected": None},
        {"label": "b4", "throughput": 700.0, "ttft_s": 0.61, "verdict": "fits", "chosen": False, "rejected": "TTFT"},
        {
            "label": "b8",
            "throughput": 990.0,
            "ttft_s": 1.4,
            "verdict": "does_not_fit",
            "chosen": False,
            "rejected": "does not fit",
        },
    ],
}


def test_tune_plot_marks_the_chosen_and_the_reasons(tmp_path):
    from qwenvl_rbln.errors import InputError
    from qwenvl_rbln.views.plots.tune import NEIGHBOURS, draw_tune, tune_data

    data = draw_tune(TUNE, tmp_path / "tune.svg")
    assert data["chosen"]["label"] == "b2"
    assert data["annotated"][:2] == ["b1", "b4"]  # nearest rejected neighbours first
    assert len(data["annotated"]) <= NEIGHBOURS
    texts = _texts(tmp_path / "tune.svg")
    assert "chosen: b2" in texts and "395.0 tokens/s, TTFT 0.260 s" in texts
    assert "b1: slow" in texts and "b8: does not fit" in texts
    draw_tune(TUNE, tmp_path / "tune.png")
    _png_ok(tmp_path / "tune.png")
    with pytest.raises(InputError, match="candidate 0 lacks"):
        tune_data({"candidates": [{"label": "x"}]})
    two = {"candidates": [{**c, "chosen": True} for c in TUNE["candidates"]]}
    with pytest.raises(InputError, match=re.escape("4 candidates are marked chosen")):
        tune_data(two)


def test_drawing_imports_matplotlib_and_nothing_heavy(tmp_path):
    from tests.test_cli_basic import _imported_after

    png = tmp_path / "p.png"
    assert _imported_after(["bucket-plan", "--size", "640x480", "--plot", str(png)]) == ["matplotlib"]
    assert png.stat().st_size > 10_000


def test_emulated_read_out_with_the_planners_estimate_beside(tmp_path):
    from qwenvl_rbln.views.plots.memory import draw_memory

    gib = 1 << 30
    estimate = {
        "npu": "RBLN-CR13",
        "verdict": "fits",
        "devices": [
            {
                "device": 0,
                "verdict": "fits",
                "usable_bytes": 140 * gib,
                "total_bytes": 3 * gib,
                "items": [{"name": "lm.weights", "bytes": 3 * gib, "low_bytes": 3 * gib, "high_bytes": 3 * gib}],
            }
        ],
    }
    memory = {
        "source": "emulated",
        "fits": True,
        "devices": [
            {
                "device": 0,
                "graphs": ["prefill", "visual/compiled_model"],
                "total_bytes": 2 * gib,
                "per_chiplet_bytes": [gib, gib],
                "usable_bytes": 140 * gib,
                "usable_per_chiplet_bytes": 35 * gib,
                "fits": True,
            }
        ],
        "graphs": {"prefill": {"device": [0, 1], "by_key": {"Weight": gib}}},  # spans devices: not split by key
        "estimate": estimate,
    }
    data = draw_memory(memory, tmp_path / "e.svg")
    (dev,) = data["devices"]
    assert [(p["category"], p["bytes"]) for p in dev["parts"]] == [("allocated", 2 * gib)]
    assert data["estimate"]["devices"][0]["total"] == 3 * gib
    texts = _texts(tmp_path / "e.svg")
    assert "planner" in " ".join(texts) and any(
        "(emulated: tensor sizes on qvl's CPU emulator, not NPU figures): fits" in t for t in texts
    )


def _no_clock(out: str) -> str:
    """stdout without wall times (tune's search, load-check's runtime load), the one thing two runs may differ in."""
    return re.sub(r'"(search_s|seconds)": [0-9.]+|in [0-9.]+ s', "", out)


@pytest.mark.parametrize("as_json", [True, False])
def test_tune_plot_draws_tunes_own_candidates_and_changes_nothing(workload, tmp_path, capsys, as_json):
    from qwenvl_rbln.views.plots.tune import from_tune_report, tune_data

    argv = ["tune", "--workload", str(workload), "--context", "32768", "--min-batch", "2", "--devices", "2"]
    argv += ["--json"] if as_json else []
    code, out, err = run_main(argv, capsys)
    svg = tmp_path / "tune.svg"
    code_p, out_p, err_p = run_main([*argv, "--plot", str(svg)], capsys)
    assert code == code_p == 0 and _no_clock(out_p) == _no_clock(out)
    assert err_p.splitlines()[-1] == f"plot: {svg}" and err_p.startswith(err)
    if not as_json:
        return
    doc = json.loads(out)
    data = tune_data(from_tune_report(doc))
    best = doc["best"]["estimate"]
    ranked = best["lighter_load"]["output_tokens_per_s"]  # no trace: throughput ranks (and plots) at a lighter load
    assert data["chosen"]["label"].startswith(f"#1 batch {doc['best']['batch_size']}")
    assert (data["chosen"]["throughput"], data["chosen"]["ttft_s"]) == (ranked, best["ttft_s"])
    costed = [r for r in doc["candidates"] + doc["neighbours"] if r["estimate"]]
    assert len(data["candidates"]) == len(costed) > len(doc["candidates"])
    for row, src in zip(data["candidates"], costed, strict=True):
        est = src["estimate"]
        assert (row["throughput"], row["ttft_s"]) == (est["lighter_load"]["output_tokens_per_s"], est["ttft_s"])
    whys = {n["change"]: n["why"] for n in doc["neighbours"]}
    assert all(whys[r["label"]].startswith(r["rejected"]) for r in data["candidates"] if r["label"] in whys)
    texts = _texts(svg)
    unit = f"output tokens/s, roofline bound, not measured, at {doc['cost_model']['load']['lighter_load']} requests"
    assert f"{ranked:.1f} {unit} in flight, TTFT {best['ttft_s']:.3f} s" in texts
    assert any(t.startswith(f"chosen: {data['chosen']['label']}") for t in texts)
    rejected = {r["label"]: r["rejected"] for r in data["candidates"]}
    assert data["annotated"] and all(f"{label}: {rejected[label]}" in texts for label in data["annotated"])


def test_tune_plot_on_exit_4_draws_the_nearest(workload, tmp_path, capsys):
    from qwenvl_rbln.views.plots.tune import from_tune_report, tune_data

    argv = ["tune", "--workload", str(workload), "--context", "262144", "--min-batch", "64", "--json"]
    code, out, _ = run_main(argv, capsys)
    png = tmp_path / "nearest.png"
    code_p, out_p, err_p = run_main([*argv, "--plot", str(png)], capsys)
    assert code == code_p == 4 and _no_clock(out_p) == _no_clock(out)
    assert f"plot: {png}" in err_p and err_p.splitlines()[-1].startswith("qvl: error: no configuration meets")
    _png_ok(png)
    doc = json.loads(out)
    data = tune_data(from_tune_report(doc))
    assert data["chosen"] is None and data["candidates"]
    assert [(r["throughput"], r["rejected"]) for r in data["candidates"]] == [
        (n["estimate"]["output_tokens_per_s"], "gives up " + "; ".join(n["gives_up"])) for n in doc["nearest"]
    ]
    from qwenvl_rbln.views.plots.tune import draw_tune

    svg = tmp_path / "nearest.svg"
    draw_tune(from_tune_report(doc), svg)
    texts = _texts(svg)
    assert any(t.startswith("tune: nothing meets the needs") for t in texts)
    assert "chosen" not in texts and not any(t.startswith("chosen:") for t in texts)  # nothing was chosen


def test_tune_plot_of_a_model_that_fits_nowhere_writes_nothing(workload, tmp_path, capsys):
    argv = ["tune", "--model", "Qwen/Qwen3-VL-235B-A22B-Instruct", "--workload", str(workload), "--context", "32768"]
    code, out, _ = run_main([*argv, "--json"], capsys)
    png = tmp_path / "none.png"
    code_p, out_p, err_p = run_main([*argv, "--json", "--plot", str(png)], capsys)
    assert code == code_p == 4 and _no_clock(out_p) == _no_clock(out) and not json.loads(out)["nearest"]
    assert "--plot: no configuration fits" in err_p and not png.exists()
