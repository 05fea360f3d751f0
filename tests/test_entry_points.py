"""The three ways in from outside keep working after any move inside the package: the ``qvl`` console script,
``python -m qwenvl_rbln``, and the ``vllm.general_plugins`` entry point vLLM loads in every process it starts.
Each runs in a fresh process, through the installed metadata, as a user's shell or vLLM would reach it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from qwenvl_rbln import __version__
from tests.helpers_cli import REPO, run_qvl


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "120", **env}
    )


def test_the_console_script_runs_the_cli():
    script = Path(sys.executable).with_name("qvl")
    if not script.is_file():
        pytest.skip("qvl is not installed in this interpreter's environment (`make install` installs it)")
    proc = _run([str(script), "--version"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"qvl {__version__}"
    proc = _run([str(script), "presets", "list", "--json"])
    assert proc.returncode == 0 and '"rebel100-1npu"' in proc.stdout, proc.stderr


def test_python_dash_m_runs_the_cli():
    result = run_qvl("--version")  # python -m qwenvl_rbln, as helpers_cli runs every CLI test
    assert result.exit_code == 0 and result.stdout.strip() == f"qvl {__version__}", result.stderr
    result = run_qvl("nope")
    assert result.exit_code == 2 and "Traceback" not in result.stderr


def test_the_vllm_plugin_loads_through_its_entry_point_without_heavy_imports():
    """What vLLM does: every entry point of the group, loaded and called. Without QVL_VIT_PACKING it is a no-op,
    and loading it imports neither vllm, torch nor optimum (it runs in every vLLM process)."""
    code = textwrap.dedent(
        """
        import sys
        from importlib import metadata
        found = [ep for ep in metadata.entry_points(group="vllm.general_plugins") if ep.name == "qvl_vit_packing"]
        assert len(found) == 1, found
        register = found[0].load()
        assert register.__module__ == "qwenvl_rbln.vllm_plugin", register.__module__
        register()
        heavy = sorted(m for m in ("torch", "transformers", "optimum", "vllm") if m in sys.modules)
        print("heavy:", heavy)
        """
    )
    proc = _run([sys.executable, "-c", code], QVL_VIT_PACKING="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "heavy: []"
    assert proc.stderr == ""
