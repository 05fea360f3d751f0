"""Memory pictures (audit D20): two cards' chiplet labels stay apart, the title names the --set overrides, and the
emulator's megabytes are drawn in a unit that shows them, labelled as emulated. Asserted on the figure's texts,
ticks and limits, never on pixels."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from tests.fakes_rbln import run_main

pytest.importorskip("matplotlib")
SVG = "{http://www.w3.org/2000/svg}"


def _texts(svg_path) -> list[str]:
    return ["".join(t.itertext()).strip() for t in ET.parse(svg_path).getroot().iter(f"{SVG}text")]


def _figure(memory, **kw):
    """The drawn figure (laid out by a canvas draw) and its data, under qvl's plot style."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from qwenvl_rbln.views.plots.figure import styled
    from qwenvl_rbln.views.plots.memory import memory_data, memory_figure

    data = memory_data(memory, **kw)
    with styled() as figure_cls:
        fig = memory_figure(data, figure_cls)
        FigureCanvasAgg(fig).draw()
        return fig, data, fig.canvas.get_renderer()


def test_two_cards_chiplet_labels_do_not_overlap(capsys):
    code, out, _ = run_main(["compile", "--preset", "rebel100-2npu-batch4", "--dry-run", "--json"], capsys)
    memory = json.loads(out)["memory"]
    assert [d["device"] for d in memory["devices"]] == [0, 1]
    fig, _, renderer = _figure(memory)
    chips = fig.axes[1]
    labels = [t for t in chips.get_xticklabels() if t.get_text()]
    assert [t.get_text() for t in labels] == ["c0", "c1", "c2", "c3"] * 2
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:], strict=False)), [(b.x0, b.x1) for b in boxes]
    assert {"dev 0", "dev 1"} <= {t.get_text() for t in chips.texts}


def test_the_title_names_the_set_overrides_the_picture_is_of(tmp_path, capsys):
    svg = tmp_path / "memory.svg"
    argv = ["compile", "--preset", "rebel100-1npu-batch4", "--set", "max_seq_len=262144", "--dry-run"]
    code, _, _ = run_main([*argv, "--plot", str(svg)], capsys)
    assert code == 4
    title = "rebel100-1npu-batch4 --set max_seq_len=262144 - memory on RBLN-CR13 (estimate): does not fit"
    assert title in _texts(svg)


def test_emulated_load_check_picture_is_readable_and_says_emulated(tiny_rbln, emulated, tmp_path, capsys):
    svg = tmp_path / "lc.svg"
    code, out, err = run_main(
        ["load-check", str(tiny_rbln), "--emulate", "--no-runtime", "--json", "--plot", str(svg)], capsys
    )
    assert code == 0, err
    memory = json.loads(out)["memory"]
    assert memory["source"] == "emulated"
    texts = " ".join(_texts(svg))
    assert "(emulated: tensor sizes on qvl's CPU emulator, not NPU figures)" in texts
    assert "far above these bars (not drawn)" in texts  # the 140 GiB card is named, not drawn over MiB bars
    fig, data, _ = _figure(memory, title=tiny_rbln.name)
    devices = fig.axes[0]
    estimate = memory["estimate"]["devices"]  # the planner's bar beside the emulated one
    tallest = max([d["total_bytes"] for d in memory["devices"]] + [d["total_high_bytes"] for d in estimate])
    unit = {"MiB": 1 << 20, "KiB": 1 << 10}[devices.get_ylabel()]
    assert tallest / unit >= 1 and devices.get_ylim()[1] < 3 * tallest / unit  # the bars fill the axis
