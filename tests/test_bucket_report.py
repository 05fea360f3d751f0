"""The bucket-plan report as a library (``jobs.bucket_plan_job`` over ``vision.bucket_plan``: ``report``, ``items``,
``optimise``): plain data in and out, no terminal, and warnings heard in the order the CLI prints them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from qwenvl_rbln.errors import DoesNotFit, InputError
from qwenvl_rbln.jobs.bucket_plan_job import memory_gate, run_bucket_plan
from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.vision.bucket_plan.items import ItemPlanner

PACKAGE = Path(__file__).resolve().parents[1] / "qwenvl_rbln"
CORE = (
    "vision/bucket_plan/items.py",
    "vision/bucket_plan/report.py",
    "vision/bucket_plan/optimise.py",
    "jobs/bucket_plan_job.py",
)
NOT_IN_CORE = ("typer", "rich", "torch", "transformers", "optimum", "qwenvl_rbln.views", "qwenvl_rbln.backends")
IGNORED = "ignored keys source (only width, height, count, frames, fps, kind and images are read)"


def _args(workload: Path, **over) -> dict:
    args = dict(
        preset="cpu-tiny",
        sets=None,
        model=None,
        inputs=None,
        sizes=None,
        workload=workload,
        optimize=None,
        max_bucket=None,
        batch_trace=None,
        optimize_decoder=None,
    )
    return {**args, **over}


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text('{"width": 4000, "height": 3000, "count": 2, "source": "log"}\n')
    return path


@pytest.mark.parametrize("name", CORE)
def test_core_report_modules_import_no_terminal_cli_or_backend(name):
    tree = ast.parse((PACKAGE / name).read_text(encoding="utf-8"))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.split(".")[0] in NOT_IN_CORE or m.startswith(NOT_IN_CORE)]
    assert not [m for m in names if m.startswith("qwenvl_rbln.commands")]


def test_item_planner_keeps_no_module_functions_on_itself():
    planner = ItemPlanner(build_plan("cpu-tiny"))
    # cost: the plan's FLOPs; bucket_memory: the memory planner's answer, handed down by the job (None here)
    assert not [k for k, v in vars(planner).items() if callable(v) and k not in {"cost", "bucket_memory"}]


def test_without_notify_the_workload_warning_leads_the_returned_warnings(workload):
    _, warnings = run_bucket_plan(**_args(workload))
    assert warnings[0] == f"{workload}: {IGNORED}"


def test_notify_hears_the_workload_warning_before_a_later_error(workload):
    heard: list[str] = []
    with pytest.raises(InputError, match="--max-bucket 8"):
        run_bucket_plan(**_args(workload, optimize=2, max_bucket=8), notify=heard.append)
    assert heard == [f"{workload}: {IGNORED}"]


def test_memory_gate_is_the_dry_run_gate():
    bad = {"memory": {"verdict": "does_not_fit", "gate": "too big", "fix": "see it in `qvl compile --dry-run`"}}
    gate = memory_gate(bad, uncertain_ok=True)
    assert isinstance(gate, DoesNotFit) and gate.exit_code == 4
    assert gate.one_line() == (
        "bucket-plan: too big; fix: see it in `qvl compile --dry-run` or the JSON summary.memory"
    )
    unsure = {"memory": {**bad["memory"], "verdict": "uncertain"}}
    assert isinstance(memory_gate(unsure, uncertain_ok=False), DoesNotFit)
    assert memory_gate(unsure, uncertain_ok=True) is None
    assert memory_gate({"memory": {"verdict": "fits"}}, uncertain_ok=False) is None
