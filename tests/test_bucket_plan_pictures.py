"""`bucket-plan --plot` read as a person reads it (issue 29, D21): bucket labels that do not run into each other or
hide behind a bar, a list the report does not recommend marked so, legend entries only for what is drawn and
inside the figure, and whole-number ticks for counts. Checked on the laid-out figure (texts, extents, ticks),
not on pixels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fakes_rbln import run_main

pytest.importorskip("matplotlib")

PRESET = "rebel100-1npu-vit-buckets"  # buckets 1024, 3136, 16384
CLOSE = [{"width": 1024, "height": 896, "count": 100}, {"width": 1024, "height": 1024, "count": 100}]  # 3584, 4096
TINY_VIDEO = [{"width": 160, "height": 120, "frames": 60, "fps": 30}]  # 80-patch segments: [80] is refused


def _report(tmp_path: Path, capsys: Any, lines: list[dict], *extra: str) -> dict:
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    code, out, err = run_main(["bucket-plan", "--preset", PRESET, "--workload", str(path), *extra, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


def _figure(report: dict, monkeypatch: Any) -> tuple[Any, Any]:
    """The figure draw_bucket_plan builds, laid out as it is saved (same style, Agg), and its renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from qwenvl_rbln.views.plots import bucket_plan, figure

    built = []

    def keep(path: Path, build: Any) -> Path:
        with figure.styled() as figure_cls:
            fig = build(figure_cls)
            FigureCanvasAgg(fig).draw()
            built.append(fig)
        return path

    monkeypatch.setattr(bucket_plan, "draw", keep)
    bucket_plan.draw_bucket_plan(report, Path("unused.png"))
    (fig,) = built
    return fig, fig.canvas.get_renderer()


def _labels(ax: Any, names: set[str]) -> dict[str, Any]:
    return {t.get_text().strip(): t for t in ax.texts if t.get_text().strip() in names}


def test_close_optimised_bucket_labels_do_not_run_into_each_other(tmp_path, capsys, monkeypatch):
    report = _report(tmp_path, capsys, CLOSE, "--optimize", "2")
    assert report["optimized"]["buckets"] == [3584, 4096]
    fig, renderer = _figure(report, monkeypatch)
    top = fig.axes[0]
    labels = _labels(top, {"1024", "3136", "16384", "3584", "4096"})
    assert len(labels) == 5
    boxes = {name: text.get_window_extent(renderer) for name, text in labels.items()}
    names = sorted(boxes)
    overlapping = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :] if boxes[a].overlaps(boxes[b])]
    assert not overlapping


def test_a_bucket_label_stands_on_its_own_ground_above_the_bars(tmp_path, capsys, monkeypatch):
    """The 80-patch label sits on the bar of its own segments: drawn over it on white, not hidden behind it."""
    fig, _ = _figure(_report(tmp_path, capsys, TINY_VIDEO, "--optimize", "1"), monkeypatch)
    top = fig.axes[0]
    (label,) = _labels(top, {"80"}).values()
    assert label.get_bbox_patch() is not None and label.get_bbox_patch().get_facecolor()[:3] == (1.0, 1.0, 1.0)
    assert label.get_zorder() > max(p.get_zorder() for p in top.patches)


def test_a_list_the_report_does_not_recommend_is_marked_in_the_picture(tmp_path, capsys, monkeypatch):
    report = _report(tmp_path, capsys, TINY_VIDEO, "--optimize", "1")
    assert report["optimized"]["buckets"] == [80] and report["optimized"]["memory"]["verdict"] == "invalid"
    fig, renderer = _figure(report, monkeypatch)
    legend = [" ".join(t.get_text().split()) for t in fig.axes[0].get_legend().get_texts()]  # wrapped lines
    assert any("not recommended as is" in t and "refused by the planner" in t for t in legend)
    assert "not recommended as is" in fig.axes[1].get_xlabel()
    assert "not recommended as is" in " ".join(fig._suptitle.get_text().split())
    # the longer wording is wrapped: the legend and the title stay inside the figure
    inside = fig.bbox
    for artist in (fig.axes[0].get_legend(), fig._suptitle):
        box = artist.get_window_extent(renderer)
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and box.y1 <= inside.y1


def test_a_recommended_list_is_not_marked(tmp_path, capsys, monkeypatch):
    report = _report(tmp_path, capsys, CLOSE, "--optimize", "2")
    assert report["optimized"]["memory"]["verdict"] == "fits"
    fig, _ = _figure(report, monkeypatch)
    assert not [t for t in fig.axes[0].get_legend().get_texts() if "not recommended" in t.get_text()]


def test_the_padding_legend_entry_only_when_padding_is_shaded(tmp_path, capsys, monkeypatch):
    exact = [{"width": 512, "height": 512, "count": 3}]  # 1024 patches: fills bucket 1024, nothing to shade
    fig, _ = _figure(_report(tmp_path, capsys, exact), monkeypatch)
    texts = " ".join(t.get_text() for t in fig.axes[0].get_legend().get_texts())
    assert "padding" not in texts
    fig, _ = _figure(_report(tmp_path, capsys, CLOSE), monkeypatch)
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(t.startswith("least padding per call") for t in texts)


def test_counts_are_ticked_in_whole_numbers(tmp_path, capsys, monkeypatch):
    fig, _ = _figure(_report(tmp_path, capsys, TINY_VIDEO, "--optimize", "1"), monkeypatch)
    top, calls = fig.axes[0], fig.axes[2]
    for ax in (top, calls):
        ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
