"""One serve line per vllm-rbln generation (issue 36 item 3; audit 2026-12-04 finding 19).

vllm-rbln 0.11 takes the placement through ``--additional-config '{"rbln_config": ...}'`` and its devices through
``RBLN_DEVICES`` (it has no ``--rbln-optimum-overrides``: vLLM exits "unrecognized arguments"); 0.12 and later take
``--rbln-optimum-overrides`` and ``RBLN_VISIBLE_DEVICES``. qvl reads the installed one, else ``--vllm-rbln``, else the
default 0.11.1a1, and says which (serving/engine.py). The engine tests run the 0.11 line for real.
"""

from __future__ import annotations

import json

import pytest

from qwenvl_rbln.artifacts.manifest import write_manifest
from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.serving import engine
from tests.fakes_rbln import run_main, write_artifact


@pytest.fixture
def art(tmp_path):
    plan = build_plan("rebel100-2npu-batch4")  # LM on NPU 0, ViT on NPU 1
    root = write_artifact(tmp_path / "art", plan)
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "Qwen/X"}})
    return root


@pytest.fixture
def no_exec(monkeypatch):
    monkeypatch.setattr("os.execvpe", lambda *a, **k: pytest.fail("exec attempted"))


def installed(monkeypatch, version: str | None, line: bool | None = None) -> None:
    """A vllm-rbln ``version`` installed (None: none); ``line``: what its files say (None: unreadable, the version
    decides)."""
    monkeypatch.setattr(engine, "installed_version", lambda: version)
    monkeypatch.setattr(engine, "installed_line", lambda: line if version is not None else None)


@pytest.mark.parametrize(
    ("version", "generation", "flag", "env"),
    [
        ("0.11.1a1", "0.11", "--additional-config", "RBLN_DEVICES"),
        ("0.11.0", "0.11", "--additional-config", "RBLN_DEVICES"),
        ("0.12.0", "0.12", "--rbln-optimum-overrides", "RBLN_VISIBLE_DEVICES"),
        ("0.12.0+cpu", "0.12", "--rbln-optimum-overrides", "RBLN_VISIBLE_DEVICES"),
        ("0.13.1rc2", "0.12", "--rbln-optimum-overrides", "RBLN_VISIBLE_DEVICES"),
        # F7: the new spelling arrived within the 0.11.3 pre-releases, not at 0.12
        ("0.11.3a20", "0.12", "--rbln-optimum-overrides", "RBLN_VISIBLE_DEVICES"),
        ("0.11.3a20.dev1+g1234abc", "0.12", "--rbln-optimum-overrides", "RBLN_VISIBLE_DEVICES"),
        ("0.11.3a19", "0.11", "--additional-config", "RBLN_DEVICES"),
        ("0.11.2", "0.11", "--additional-config", "RBLN_DEVICES"),
        ("0.11.1.post1", "0.11", "--additional-config", "RBLN_DEVICES"),
    ],
)
def test_each_generation_has_its_flag_and_variable(version, generation, flag, env):
    line = engine.Engine(version, "--vllm-rbln")
    assert (line.generation, line.placement_flag, line.device_env) == (generation, flag, env)
    assert {line.device_env, line.other_device_env} == {"RBLN_DEVICES", "RBLN_VISIBLE_DEVICES"}
    overrides = {"device": 0, "visual": {"device": 1}}
    value = json.loads(line.placement_args(overrides)[1])
    assert value == (overrides if generation == "0.12" else {"rbln_config": overrides})


def test_the_version_comes_from_the_option_else_the_installed_one_else_the_default(monkeypatch):
    installed(monkeypatch, "0.12.1")
    assert engine.resolve("0.11.1a1") == engine.Engine("0.11.1a1", "--vllm-rbln")
    assert engine.resolve(None) == engine.Engine("0.12.1", "installed")
    assert engine.resolve(None, look_here=False) == engine.Engine(engine.DEFAULT, "default")  # qvl deploy
    installed(monkeypatch, None)
    assert engine.resolve(None) == engine.Engine(engine.DEFAULT, "default")
    assert "no vllm-rbln installed here: the default 0.11.1a1" in engine.resolve(None).describe()


def test_the_installed_version_is_read_from_its_metadata_without_importing_it():
    """make install puts vllm-rbln 0.11.1a1 beside vLLM 0.22.0 (the engine tests need it)."""
    import subprocess
    import sys

    found = engine.installed_version()
    assert found is None or engine.parse(found) >= (0, 11)
    # in a fresh interpreter: another test file in this worker may have imported vLLM itself
    probe = (
        "import sys; from qwenvl_rbln.serving import engine; engine.installed_version(); engine.installed_line(); "
        "print(sorted(m for m in ('vllm', 'vllm_rbln') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0.10.2", "0.11 and later"),
        ("banana", "not a vllm-rbln version"),
        ("0.12.0 beta", "not a vllm-rbln version"),  # mutation EN06: junk around a version was read loosely
        ("v0.12.0-x y", "not a vllm-rbln version"),
        ("0.12.0-x", "not a vllm-rbln version"),
        ("v0.12.0", "not a vllm-rbln version"),
        ("0.12.0junk", "not a vllm-rbln version"),
    ],
)
def test_an_unknown_or_too_old_vllm_rbln_is_one_line(value, said, art, capsys, no_exec):
    code, out, err = run_main(["serve", str(art), "--vllm-rbln", value, "--dry-run"], capsys)
    assert code == 2 and out == "" and said in err and "fix:" in err and "Traceback" not in err


def test_dry_run_prints_the_line_of_the_chosen_generation_and_names_it(art, capsys, monkeypatch, no_exec):
    installed(monkeypatch, "0.11.1a1")
    code, out, err = run_main(["serve", str(art), "--vllm-rbln", "0.12.0", "--dry-run", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert json.loads(data["argv"][data["argv"].index("--rbln-optimum-overrides") + 1]) == {
        "device": 0,
        "visual": {"device": 1},
    }
    assert data["env"]["RBLN_VISIBLE_DEVICES"] == "0,1" and "--additional-config" not in data["argv"]
    (check,) = [c for c in data["checks"] if c["check"] == "engine"]
    assert "vllm-rbln 0.12.0 (chosen with --vllm-rbln)" in check["detail"]


def test_a_line_for_another_generation_than_the_installed_one_never_starts(art, capsys, monkeypatch, no_exec):
    installed(monkeypatch, "0.11.1a1")
    code, out, err = run_main(["serve", str(art), "--vllm-rbln", "0.12.0"], capsys)
    assert code == 2 and "installed vllm-rbln 0.11.1a1 takes the 0.11 line" in err and "nothing was started" in err
    assert "--dry-run" in err  # the fix: print it for the other host instead


def test_vllms_usage_statistics_are_off_unless_the_user_set_them(art, capsys, monkeypatch, no_exec):
    """No default sends traffic off the machine: vLLM's usage report is off in serve's line (and so in deploy's pod),
    unless the user explicitly allowed it (a 0 in VLLM_NO_USAGE_STATS or DO_NOT_TRACK; tests/test_serve_usage_stats.py
    has every case, checked against vLLM's own reading)."""
    for name in ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
        monkeypatch.delenv(name, raising=False)
    code, out, err = run_main(["serve", str(art), "--dry-run", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["env"]["VLLM_NO_USAGE_STATS"] == "1"
    monkeypatch.setenv("DO_NOT_TRACK", "0")
    code, out, err = run_main(["serve", str(art), "--dry-run", "--json"], capsys)
    assert code == 0, err
    assert "VLLM_NO_USAGE_STATS" not in json.loads(out)["env"]


@pytest.mark.parametrize(("version", "other"), [("0.12.0", "RBLN_DEVICES"), ("0.11.1a1", "RBLN_VISIBLE_DEVICES")])
def test_the_dry_run_script_is_the_same_whatever_the_printing_shell_has(version, other, art, capsys, monkeypatch):
    """New-user audit 2026-12-04b N5: the dry run is a line for another host, yet it unset the other generation's
    device variable only when the printing shell had it set."""
    scripts = []
    for inherited in (None, "3"):
        for name in ("RBLN_DEVICES", "RBLN_VISIBLE_DEVICES"):
            monkeypatch.delenv(name, raising=False)
        if inherited is not None:
            monkeypatch.setenv(other, inherited)
        code, out, err = run_main(["serve", str(art), "--dry-run", "--vllm-rbln", version], capsys)
        assert code == 0, err
        assert f"unset {other}" in out, out
        code, js, err = run_main(["serve", str(art), "--dry-run", "--json", "--vllm-rbln", version], capsys)
        assert code == 0 and json.loads(js)["env"][other] is None, err
        scripts.append(out.replace(f"(replaces the inherited {inherited})", ""))
    assert scripts[0] == scripts[1]


def fake_vllm_rbln(root, version: str, source: str) -> None:
    """An installed vllm-rbln distribution (metadata, RECORD and one module) under ``root``."""
    pkg = root / "vllm_rbln"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(source)
    info = root / f"vllm_rbln-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-rbln\nVersion: {version}\n")
    (info / "RECORD").write_text("vllm_rbln/__init__.py,,\n")


NEW_SOURCE = (
    'class OptimumRBLNConfig:\n    optimum_overrides: dict\n\ndevice_control_env_var = "RBLN_VISIBLE_DEVICES"\n'
)


@pytest.mark.parametrize(
    ("version", "source", "line"),
    [
        ("0.11.3a25", NEW_SOURCE, "0.12"),  # a 0.11.x pre-release that takes the new spelling: its files say so
        ("0.12.4", 'device_control_env_var = "RBLN_DEVICES"\n', "0.11"),  # whatever its number says, it lacks both
        ("0.12.4", 'device_control_env_var = "RBLN_VISIBLE_DEVICES"\n', "0.11"),  # one of the two: old line (aliases)
    ],
)
def test_the_installed_vllm_rbln_is_judged_by_what_its_files_accept(version, source, line, tmp_path, monkeypatch):
    """Audit 2026-12-04b F7: decided by what the installed package accepts (read, not imported), the version
    boundary only when nothing is installed or its files cannot be read."""
    fake_vllm_rbln(tmp_path, version, source)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert engine.installed_version() == version
    chosen = engine.resolve(None)
    assert chosen.generation == line
    assert ("its files have" if line == "0.12" else "its files lack") in chosen.describe()


def test_the_vllm_rbln_installed_here_is_read_as_the_011_line():
    """vllm-rbln 0.11.1a1 (make install): its files have neither the flag's field nor the new variable."""
    if engine.installed_version() is None:
        pytest.skip("no vllm-rbln installed")
    assert engine.installed_line() is False and engine.resolve(None).generation == "0.11"
