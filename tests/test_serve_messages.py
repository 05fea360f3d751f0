"""`qvl serve --dry-run`: each warning said once (audit 2026-12-04 L10), and the preflight's required-key check
refuses a key of 0 for each key (mutation S4), naming it as JSON spells the value."""

from __future__ import annotations

import os

import pytest

from qwenvl_rbln.artifacts.manifest import write_manifest
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.serving.command import serve_command
from qwenvl_rbln.serving.options import ServeOptions
from tests.fakes_rbln import rbln_config_json, run_main, write_artifact


@pytest.fixture(autouse=True)
def no_exec(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError(f"exec was attempted: {args[:2]}")

    monkeypatch.setattr(os, "execvpe", boom)


def _artifact(root, cfg=None):
    plan = build_plan("rebel100-1npu")
    write_artifact(root, plan, cfg=cfg)
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "m"}})
    return root


def test_the_no_auth_exposure_warning_is_printed_once(tmp_path, capsys, monkeypatch):
    """L10: stderr's `warning: --no-auth: ...` and the script's `# warn auth: --no-auth: ...` said it twice."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    art = _artifact(tmp_path / "art")
    code, out, err = run_main(["serve", str(art), "--dry-run", "--no-auth", "--host", "0.0.0.0"], capsys)
    assert code == 0, err
    assert (out + err).count("answers every machine that can reach this port, without a key") == 1
    assert "# warn auth: --no-auth:" in out


def test_a_warning_without_a_check_still_reaches_stderr(tmp_path, capsys, monkeypatch):
    """Only what a check already shows is left off stderr: the real run (no checks printed) keeps every warning."""
    from qwenvl_rbln.commands.serve_cmd import unshown

    checks = [{"check": "auth", "ok": False, "warning": True, "detail": "--no-auth: open"}]
    assert unshown(["--no-auth: open", "another"], checks) == ["another"]
    assert unshown(["--no-auth: open"], [{**checks[0], "ok": True}]) == ["--no-auth: open"]


@pytest.mark.parametrize("key", ["batch_size", "max_seq_len", "prefill_chunk_size", "kvcache_num_blocks"])
def test_a_required_key_of_zero_is_refused_naming_it(tmp_path, key):
    """Mutation S4 (`> 0` -> `>= 0`): only kvcache_num_blocks=0 was tested, and a later pool check refused it again,
    so a batch_size, max_seq_len or prefill_chunk_size of 0 (vllm-rbln asserts on them) went unseen."""
    plan = build_plan("rebel100-1npu")
    cfg = rbln_config_json(plan)
    cfg[key] = 0
    art = _artifact(tmp_path / "art", cfg)
    with pytest.raises(InputError, match=f"missing or not a positive integer: {key}=0 "):
        serve_command(ServeOptions(directory=art), {})


def test_a_null_key_is_spelled_as_json(tmp_path):
    """L10: the value was shown with Python's repr (`max_seq_len=None`)."""
    plan = build_plan("rebel100-1npu")
    cfg = rbln_config_json(plan)
    cfg["max_seq_len"] = None
    art = _artifact(tmp_path / "art", cfg)
    with pytest.raises(InputError, match="not a positive integer: max_seq_len=null ") as exc:
        serve_command(ServeOptions(directory=art), {})
    assert "None" not in exc.value.message
