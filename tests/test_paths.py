"""``~user`` in any user-given path: expanded when the user exists, one clean input error when not.

CI once found ``--set model=~0`` raising pathlib's RuntimeError ("Could not determine home directory") as a
traceback; every path a user gives now goes through ``paths.user_path``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qwenvl_rbln.errors import EXIT_BAD_INPUT, InputError
from qwenvl_rbln.paths import user_path
from tests.helpers_cli import REPO, run_qvl

NO_SUCH_USER = "~qvl-no-such-user-4711"


def test_own_home_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert user_path("~/models/x") == tmp_path / "models" / "x"
    assert user_path("plain/rel") == Path("plain/rel")


@pytest.mark.parametrize("value", ["~0", f"{NO_SUCH_USER}/model", NO_SUCH_USER])
def test_unknown_user_is_one_input_error_naming_the_value(value):
    with pytest.raises(InputError) as info:
        user_path(value, "model")
    line = info.value.one_line()
    assert value in line and "model" in line and "\n" not in line
    assert info.value.hint


def _assert_one_line_exit_2(result, needle: str) -> None:
    assert result.exit_code == EXIT_BAD_INPUT, result
    assert "Traceback" not in result.stderr + result.stdout
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["compile", "--dry-run", "--preset", "rebel100-1npu", "--set", f"model={NO_SUCH_USER}/m"],
        ["compile", "--dry-run", "--preset", "rebel100-1npu", "--model", "~0"],
        ["compile", "--dry-run", "--preset", f"{NO_SUCH_USER}/p.yaml"],
        ["bucket-plan", "--workload", f"{NO_SUCH_USER}/w.jsonl"],
        ["infer", "--image", f"{NO_SUCH_USER}/a.jpg"],
        ["load-check", f"{NO_SUCH_USER}/artifacts"],
    ],
    ids=["set-model", "model-flag", "preset-path", "workload", "infer-image", "artifact-dir"],
)
def test_cli_unknown_user_paths_exit_2_in_one_line(args):
    needle = "~0" if "~0" in args else NO_SUCH_USER
    _assert_one_line_exit_2(run_qvl(*args), needle)


def test_qvl_home_with_unknown_user_is_an_input_error():
    result = run_qvl("compile", "--dry-run", "--preset", "cpu-tiny", env={"QVL_HOME": f"{NO_SUCH_USER}/qvl"})
    _assert_one_line_exit_2(result, "QVL_HOME")


def test_every_expanduser_in_the_package_goes_through_user_path():
    pattern = re.compile(r"\.expanduser\(")
    assert pattern.search("Path(x).expanduser()")  # positive control for the scan
    offenders = [
        f"{path.relative_to(REPO)}:{n}"
        for path in sorted((REPO / "qwenvl_rbln").rglob("*.py"))
        if path.name != "paths.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
