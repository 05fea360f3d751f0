"""Words that must agree with their numbers (one graph call, one segment) and help text that is not broken in the
middle of a sentence: the small things a reader trips on (issue 29, D27)."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from qwenvl_rbln.cli import app
from qwenvl_rbln.commands.infer_cmd import vit_line
from qwenvl_rbln.views import render


def _vit(graph_calls: int, segments: int) -> dict:
    pack = {"bucket": 1024, "lengths": [320], "padding": 704}
    return {
        "visual_calls": [{"packs": [pack] * graph_calls}],
        "graph_calls": graph_calls,
        "unpacked_calls": segments,
        "packing": True,
    }


def test_infer_vit_line_puts_each_count_in_the_right_number():
    assert vit_line(_vit(1, 1)).startswith("  ViT: 1 graph call for 1 segment (packed): 1024 [320, pad 704]")
    assert vit_line(_vit(2, 1)).startswith("  ViT: 2 graph calls for 1 segment (packed)")
    assert vit_line(_vit(1, 3)).startswith("  ViT: 1 graph call for 3 segments (packed)")


def test_bucket_plan_packed_line_says_one_call_for_one_call():
    render.reset_consoles()
    r = CliRunner().invoke(app, ["bucket-plan", "--size", "640x480"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    render.reset_consoles()
    assert r.exit_code == 0, r.output
    assert "share calls): 1 -> 1 call, executed" in r.stdout


def test_bucket_plan_short_help_is_one_unbroken_sentence():
    """The command list shows the first paragraph of the help as written: a line break inside it splits a
    sentence ("the best buckets\\n for a workload") however wide the terminal is."""
    command = typer.main.get_command(app).commands["bucket-plan"]
    first = command.help.strip().split("\n\n")[0]
    assert "\n" not in first and first.endswith("."), first
    render.reset_consoles()
    r = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    render.reset_consoles()
    (line,) = [x for x in r.stdout.splitlines() if "bucket-plan " in x]
    assert first in line


def test_bucket_plan_decoder_counts_in_the_right_number(tmp_path, capsys):
    from tests.fakes_rbln import run_main

    one = tmp_path / "one.json"
    one.write_text("[1]")
    render.reset_consoles()
    r = CliRunner().invoke(app, ["bucket-plan", "--batch-trace", str(one)], env={"COLUMNS": "200", "NO_COLOR": "1"})
    render.reset_consoles()
    assert r.exit_code == 0, r.output
    assert "1 decode step, 1 real row, 0 padded rows" in r.stdout
    above = tmp_path / "above.json"
    above.write_text("[1, 9]")  # 9 is above the preset's largest decoder graph: one step cannot run
    code, _, err = run_main(["bucket-plan", "--batch-trace", str(above)], capsys)
    assert code == 2
    assert "qvl: error: 1 decode step is above the largest decoder graph" in err
