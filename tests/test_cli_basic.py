"""The CLI as a user meets it: help, version, dry-run JSON, exit codes, one-line errors, no heavy imports."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from tests.helpers_cli import REPO, run_qvl

HEAVY = ("torch", "transformers", "optimum", "torchvision", "matplotlib")


def _imported_after(argv: list[str]) -> list[str]:
    code = (
        "import sys\n"
        f"sys.argv = {['qvl', *argv]!r}\n"
        "from qwenvl_rbln import cli\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        f"print('MODS', sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("MODS")][-1]
    return eval(line[5:])  # noqa: S307 - our own printed list


@pytest.mark.parametrize("argv", [["--help"], ["compile", "--dry-run", "--json"], ["presets", "list"]])
def test_no_heavy_imports(argv):
    assert _imported_after(argv) == []


def test_import_package_is_light():
    proc = subprocess.run(
        [sys.executable, "-c", f"import sys, qwenvl_rbln; print(sorted(set(sys.modules) & set({HEAVY!r})))"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.stdout.strip() == "[]"


def test_version():
    r = run_qvl("--version")
    assert r.exit_code == 0
    assert r.stdout.startswith("qvl ")


def test_help_lists_every_command():
    r = run_qvl("--help")
    assert r.exit_code == 0
    for cmd in ("compile", "load-check", "infer", "bucket-plan", "presets"):
        assert cmd in r.stdout


def test_dry_run_json_has_the_contract_keys():
    r = run_qvl("compile", "--preset", "rebel100-1npu", "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    for key in ("preset", "model_id", "rbln_config", "load_rbln_config", "processor", "memory"):
        assert key in data
    assert data["processor"]["max_pixels"] == 16384 * 256


def test_dry_run_human_output():
    r = run_qvl("compile", "--preset", "rebel100-1npu-vit-buckets", "--dry-run")
    assert r.exit_code == 0, r.stderr
    assert "1024, 3136, 16384" in r.stdout
    assert "dry run" in r.stdout


def test_presets_list_and_show():
    r = run_qvl("presets", "list", "--json")
    names = [p["name"] for p in json.loads(r.stdout)["presets"]]
    assert {
        "rebel100-1npu",
        "rebel100-1npu-vit-buckets",
        "rebel100-1npu-batch4",
        "rebel100-2npu-batch4",
        "cpu-tiny",
    } <= set(names)
    assert all(p["description"] for p in json.loads(r.stdout)["presets"])
    r = run_qvl("presets", "show", "rebel100-2npu-batch4", "--json")
    data = json.loads(r.stdout)
    assert data["load_rbln_config"] == {"visual": {"device": 1}, "device": 0}


@pytest.mark.parametrize(
    "args, needle",
    [
        (["compile", "--preset", "nope", "--dry-run"], "unknown preset 'nope'"),
        (["compile", "--dry-run", "--set", "max_seq_len"], "malformed --set"),
        (["compile", "--dry-run", "--set", "max_seq_len=1000"], "max_seq_len=1000"),
        (["compile", "--dry-run", "--set", "visual.max_seq_len=[1022]"], "not a multiple of 4"),
        (["compile", "--dry-run", "-o", ""], "-o/--output is empty"),  # once read as '.', the working dir
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    r = run_qvl(*args)
    assert r.exit_code == 2
    assert needle in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("warning")]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_yaml_tag_via_cli(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("description: !!python/object:os.system {}\n")
    r = run_qvl("compile", "--preset", str(bad), "--dry-run")
    assert r.exit_code == 2
    assert "YAML tag not allowed" in r.stderr


def test_json_errors_are_one_json_document_on_stdout():
    r = run_qvl("compile", "--preset", "nope", "--dry-run", "--json")
    assert r.exit_code == 2
    error = json.loads(r.stdout)["error"]
    assert set(error) == {"message", "hint", "exit_code"} and error["exit_code"] == 2
    assert "unknown preset 'nope'" in error["message"] and r.stderr.startswith("qvl: error: unknown preset 'nope'")


def test_dry_run_is_a_gate_exit_4_when_it_does_not_fit():
    r = run_qvl("compile", "--preset", "rebel100-1npu-batch4", "--set", "max_seq_len=262144", "--dry-run", "--json")
    assert r.exit_code == 4
    data = json.loads(r.stdout)  # the full report still comes first
    assert data["memory"]["fits"] is False
    assert any("placement.visual_device=1" in " ".join(s["set"]) for s in data["memory"]["suggestions"])
    ok = run_qvl("compile", "--preset", "rebel100-2npu-batch4", "--dry-run", "--json")
    assert ok.exit_code == 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["bucket-plan", "--image", "x.jpg"], "No such option: --image"),
        (["nosuch-command"], "No such command"),
        (["bucket-plan", "--rows", "abc"], "--rows"),
        (["compile", "--preset"], "--preset"),
    ],
)
def test_usage_errors_are_one_line_exit_2_with_a_help_pointer(args, needle):
    result = run_qvl(*args)
    assert result.exit_code == 2, result
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert needle in lines[0] and "--help" in lines[0] and "internal error" not in lines[0]


@pytest.mark.parametrize("args", [[], ["presets"]])
def test_a_bare_group_prints_its_help_and_no_empty_error(args):
    result = run_qvl(*args)
    assert result.exit_code == 0 and "Usage:" in result.stdout and "Commands" in result.stdout
    assert result.stderr.strip() == ""


def test_ctrl_c_while_the_cli_is_still_importing_is_one_line_exit_130():
    code = (
        "import builtins, sys\n"
        "real = builtins.__import__\n"
        "def imp(name, *a, **k):\n"
        "    if name == 'typer':\n"
        "        raise KeyboardInterrupt\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = imp\n"
        "sys.argv = ['qvl', '--help']\n"
        "from qwenvl_rbln.entry import main\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "qvl: interrupted before it started; nothing was done\n"


@pytest.mark.parametrize("argv", [["compile", "--dry-run"], ["--help"]], ids=" ".join)
def test_ctrl_c_while_the_command_module_is_still_importing_is_one_line_exit_130(argv):
    """A run imports its command's module after the CLI itself (cli.app_for): a Ctrl-C there is still the start."""
    code = (
        "import sys\n"
        "class Stop:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'qwenvl_rbln.commands.compile_cmd':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Stop())\n"
        f"sys.argv = {['qvl', *argv]!r}\n"
        "from qwenvl_rbln.entry import main\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "qvl: interrupted before it started; nothing was done\n"


def test_a_ctrl_c_after_the_command_finished_cannot_change_its_exit_code():
    """The console script ignores SIGINT once the command has run and reported (a late Ctrl-C once made a
    completed compile exit 130 with no line)."""
    code = (
        "import signal, sys\n"
        "sys.argv = ['qvl', '--version']\n"
        "from qwenvl_rbln.entry import main\n"
        "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    print(exc.code, signal.getsignal(signal.SIGINT) == signal.SIG_IGN)\n"
    )
    # SIGINT at its default in the child whatever this process inherited: a shell's background job starts with it
    # ignored, and Python then never installs default_int_handler, so the first assertion would not be about qvl
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "0 True"
