"""--max-model-len is what vllm-rbln's KV block pool can really hold (vllm-rbln issue #957).

vllm-rbln gives vLLM ``kvcache_num_blocks + 1`` blocks for a full pool and ``kvcache_num_blocks`` for a short one,
and vLLM keeps one as its null block: a short pool holds ``(kvcache_num_blocks - 1) x block`` tokens for one
sequence, and a longer prompt under --max-model-len hangs (serving/preflight.py: pool_max_model_len).
"""

from __future__ import annotations

import json

import pytest

from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import rbln_config_json, run_main, write_artifact


@pytest.fixture
def no_exec(monkeypatch):
    monkeypatch.setattr("os.execvpe", lambda *a, **k: pytest.fail("exec attempted"))


def artifact(tmp_path, kv_blocks: int | None = None):
    plan = build_plan("rebel100-1npu")  # max_seq_len 262144, batch 1, blocks of 8192: 32 blocks fill the pool
    return write_artifact(tmp_path / "art", plan, cfg=rbln_config_json(plan, kv_blocks=kv_blocks))


def serve_json(capsys, *args: str) -> tuple[dict, str]:
    code, out, err = run_main(["serve", *args, "--dry-run", "--json"], capsys)
    assert code == 0, err
    return json.loads(out), err


def max_model_len(argv: list[str]) -> int:
    assert argv.count("--max-model-len") == 1
    return int(argv[argv.index("--max-model-len") + 1])


def test_a_full_pool_serves_the_compiled_max_seq_len(tmp_path, capsys, no_exec):
    data, err = serve_json(capsys, str(artifact(tmp_path)))
    assert max_model_len(data["argv"]) == 262144
    (check,) = [c for c in data["checks"] if c["check"] == "max_model_len"]
    assert check["ok"] and "null block" not in check["detail"] and "max_model_len" not in err
    assert "QVL_MAX_MODEL_LEN" not in data["env"]


def test_a_short_pool_lowers_max_model_len_and_says_why(tmp_path, capsys, no_exec):
    data, err = serve_json(capsys, str(artifact(tmp_path, kv_blocks=20)))
    assert max_model_len(data["argv"]) == 19 * 8192  # 20 blocks handed over, one kept as the null block
    (check,) = [c for c in data["checks"] if c["check"] == "max_model_len"]
    assert not check["ok"] and check["warning"]
    for words in (
        "kvcache_num_blocks 20",
        "8192 tokens",
        "null block",
        "19 x 8192 = 155648",
        "262144",
        "#957",
        ">= 32",
    ):
        assert words in check["detail"], words
    assert "warning:" in err and "null block" in err
    assert data["env"]["QVL_MAX_MODEL_LEN"] == str(19 * 8192) and "held there inside vLLM" in check["detail"]
    # a pass-through --max-model-len must agree with the pool, not with max_seq_len
    code, _, err = run_main(
        ["serve", str(artifact(tmp_path, kv_blocks=20)), "--dry-run", "--", "--max-model-len", "262144"], capsys
    )
    assert code == 2 and "what the KV block pool holds is 155648" in err


@pytest.mark.parametrize(
    ("blocks", "batch", "max_len", "held"),
    [
        (32, 1, 262144, 262144),  # exactly full: vLLM gets 33 blocks, 32 usable
        (31, 1, 262144, 30 * 8192),  # one short: 31 handed over, 30 usable
        (100, 4, 262144, 262144),  # short for 4 full sequences, yet 99 blocks hold one
        (2, 1, 262144, 8192),
    ],
)
def test_pool_arithmetic(blocks, batch, max_len, held):
    from qwenvl_rbln.serving.preflight import pool_max_model_len

    cfg = {"kvcache_num_blocks": blocks, "kvcache_block_size": 8192, "max_seq_len": max_len, "batch_size": batch}
    assert pool_max_model_len(cfg)[0] == held


def test_a_pool_of_one_block_is_refused(tmp_path, capsys, no_exec):
    code, _, err = run_main(["serve", str(artifact(tmp_path, kv_blocks=1)), "--dry-run"], capsys)
    assert code == 2 and "kvcache_num_blocks=1" in err and "null block" in err


class _Config:
    """The two parts of vLLM's config the guard touches."""

    def __init__(self) -> None:
        self.model_config = type("ModelConfig", (), {"max_model_len": 155648})()


@pytest.fixture
def stand_in_vllm_rbln(monkeypatch):
    """vllm-rbln's dispatch module as v0.11 has it: sync_vllm_and_optimum calls the module-level sync_from_optimum,
    which resets max_model_len to the compiled max_seq_len."""
    import sys
    import types

    dispatch = types.ModuleType("vllm_rbln.utils.optimum.converter.dispatch")

    def sync_from_optimum(vllm_config, compiled_rbln_config):
        vllm_config.model_config.max_model_len = compiled_rbln_config["max_seq_len"]

    def sync_vllm_and_optimum(vllm_config):
        dispatch.sync_from_optimum(vllm_config, {"max_seq_len": 262144})

    dispatch.sync_from_optimum = sync_from_optimum
    dispatch.sync_vllm_and_optimum = sync_vllm_and_optimum
    monkeypatch.setitem(sys.modules, dispatch.__name__, dispatch)
    return dispatch


def test_the_plugin_holds_max_model_len_after_vllm_rbln_resets_it(monkeypatch, stand_in_vllm_rbln, capsys):
    """vllm-rbln resets --max-model-len to max_seq_len when it reads the artifact; with QVL_MAX_MODEL_LEN the plugin
    lowers it again right after, so vLLM refuses a prompt the short pool cannot hold (issue #957)."""
    from qwenvl_rbln.serving import vllm_plugin

    config = _Config()
    stand_in_vllm_rbln.sync_vllm_and_optimum(config)
    assert config.model_config.max_model_len == 262144  # what happens without the guard
    monkeypatch.setenv("QVL_MAX_MODEL_LEN", "155648")
    vllm_plugin.register()
    vllm_plugin.register()  # vLLM may load a plugin more than once per process: wrapped once
    assert stand_in_vllm_rbln.sync_from_optimum.__wrapped__.__name__ == "sync_from_optimum"
    assert not hasattr(stand_in_vllm_rbln.sync_from_optimum.__wrapped__, "__wrapped__")
    config = _Config()
    stand_in_vllm_rbln.sync_vllm_and_optimum(config)
    assert config.model_config.max_model_len == 155648
    assert "warning" not in capsys.readouterr().err


def test_the_guard_warns_and_never_raises_without_vllm_rbln_or_with_a_bad_value(monkeypatch, capsys):
    import sys

    from qwenvl_rbln.serving import vllm_plugin

    monkeypatch.setitem(sys.modules, "vllm_rbln", None)  # not importable
    monkeypatch.setenv("QVL_MAX_MODEL_LEN", "155648")
    vllm_plugin.register()
    err = capsys.readouterr().err
    assert err.count("qvl: warning:") == 1 and "above 155648 tokens" in err and "#957" in err
    monkeypatch.setenv("QVL_MAX_MODEL_LEN", "lots")
    vllm_plugin.register()
    assert "QVL_MAX_MODEL_LEN='lots' is not a positive integer" in capsys.readouterr().err
