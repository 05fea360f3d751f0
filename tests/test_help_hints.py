"""``--help`` prints its install hints exactly as they must be typed: rich markup must not eat ``[plot]``."""

from __future__ import annotations

import re

import pytest

from tests.fakes_rbln import run_main


@pytest.mark.parametrize("command", ["compile", "bucket-plan", "tune", "load-check"])
def test_plot_help_names_the_plot_extra(command, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "400")  # one line per option: nothing wraps inside the hint
    code, out, err = run_main([command, "--help"], capsys)
    assert code == 0, err
    (line,) = [ln for ln in out.splitlines() if "--plot" in ln]
    assert 'pip install "qwenvl-rbln[plot]"' in re.sub(r"\s+", " ", line), line
