"""The CLI contract, round 2 (issue 25): what a report says is what the command does.

Each test pins one defect with the command that showed it; most run in-process through ``cli.main``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes_rbln import run_main


# ----------------------------------------------------------------- 2. bucket-plan --json failures carry `error`
@pytest.mark.parametrize(
    "args, code",
    [
        (["/nonexistent/cat.jpg"], 2),  # a missing file
        (["--batch-trace", "TRACE"], 2),  # a trace value above the batch size
        (["--preset", "rebel100-1npu-batch4", "--set", "max_seq_len=262144", "--size", "640x480"], 4),  # no fit
    ],
)
def test_bucket_plan_json_failures_carry_the_error_object(args, code, capsys, tmp_path: Path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("[1, 2, 9]\n")
    args = [str(trace) if a == "TRACE" else a for a in args]
    got, out, err = run_main(["bucket-plan", *args, "--json"], capsys)
    assert got == code, err
    doc = json.loads(out)
    assert doc["error"]["exit_code"] == code and doc["error"]["message"] and doc["error"]["hint"]
    assert "summary" in doc  # the report stays beside the error
