"""Options shared by several commands, so each is spelled and documented once."""

from __future__ import annotations

from pathlib import Path

import typer

PresetOpt = typer.Option(
    "rebel100-1npu", "--preset", "-p", help="Preset name (see `qvl presets list`) or path to a YAML file."
)
SetOpt = typer.Option(
    None,
    "--set",
    "-s",
    metavar="KEY=VALUE",
    help="Override a key: dotted.key=value (JSON values), e.g. --set 'visual.max_seq_len=[1024,16384]' (quote "
    "brackets for the shell). Repeatable.",
)
ModelOpt = typer.Option(None, "--model", "-m", help="Hub id or local model directory (overrides the preset).")
JsonOpt = typer.Option(False, "--json", help="Machine-readable JSON on stdout; diagnostics go to stderr.")


def print_warnings(warnings: list[str]) -> None:
    from qwenvl_rbln.views import render

    for w in warnings:
        render.warn(w)


# ``\\[`` keeps ``[plot]`` literal: --help renders rich markup, where ``[plot]`` alone is a tag and vanishes
PlotOpt = typer.Option(
    None,
    "--plot",
    metavar="FILE",
    help="Also draw the report as a picture, FILE ending in .png or .svg (needs matplotlib: "
    'pip install "qwenvl-rbln\\[plot]").',
)


def check_plot(path: Path | None) -> Path | None:
    """--plot's file, refused before any work when it cannot be written or matplotlib is missing (exit 3)."""
    if path is None:
        return None
    from qwenvl_rbln.views.plots.figure import check_plot_path

    return check_plot_path(path)


def plotted(path: Path) -> None:
    """The one stderr line that names a picture (stdout, --json included, never changes)."""
    from qwenvl_rbln.views import render

    render.info(f"plot: {path}")
