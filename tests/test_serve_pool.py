"""The KV block pool and --max-model-len (vllm-rbln issue #957; issue 36 item 5: the guard holds or goes).

vllm-rbln gives vLLM ``kvcache_num_blocks + 1`` blocks for a full pool and ``kvcache_num_blocks`` for a short one, and
vLLM keeps one as its null block: a short pool holds ``(kvcache_num_blocks - 1) x block`` tokens for one sequence.
optimum-rbln 0.12 never writes a pool below one sequence of max_seq_len (``num_min_blocks``), so the guard that held
``max_model_len`` lower inside vLLM (``QVL_MAX_MODEL_LEN``) could never fire for an artifact 0.12 accepts, and when
forced it narrowed every block table and failed every prefill (shared/engine/README.md). It is gone: serve passes
``--max-model-len`` = max_seq_len and refuses, before anything starts, a pool that could not hold it
(serving/preflight.py: check_kv_pool).
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.lm.rules import kv_block_counts
from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.serving.preflight import check_kv_pool
from tests.fakes_rbln import rbln_config_json, run_main, write_artifact


@pytest.fixture
def no_exec(monkeypatch):
    monkeypatch.setattr("os.execvpe", lambda *a, **k: pytest.fail("exec attempted"))


def artifact(tmp_path, kv_blocks: int | None = None):
    plan = build_plan("rebel100-1npu")  # max_seq_len 262144, batch 1, blocks of 8192: 32 blocks fill the pool
    return write_artifact(tmp_path / "art", plan, cfg=rbln_config_json(plan, kv_blocks=kv_blocks))


def max_model_len(argv: list[str]) -> int:
    assert argv.count("--max-model-len") == 1
    return int(argv[argv.index("--max-model-len") + 1])


def test_a_full_pool_serves_the_compiled_max_seq_len(tmp_path, capsys, no_exec):
    code, out, err = run_main(["serve", str(artifact(tmp_path)), "--dry-run", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert max_model_len(data["argv"]) == 262144
    (check,) = [c for c in data["checks"] if c["check"] == "kv pool"]
    assert check["ok"] and "a full pool" in check["detail"]
    assert not [k for k in data["env"] if "MAX_MODEL_LEN" in k]  # no guard variable for the plugin any more


def test_a_pool_short_of_one_sequence_is_refused_before_anything_starts(tmp_path, capsys, no_exec):
    root = artifact(tmp_path, kv_blocks=20)
    for command in (["serve", str(root)], ["serve", str(root), "--dry-run"], ["bench-serve", str(root), "--dry-run"]):
        code, out, err = run_main(command, capsys)
        assert code == 2 and out == "" and "Traceback" not in err, err
        line = err.strip().splitlines()[-1]
        for words in (
            "kvcache_num_blocks=20",
            "null block",
            "19 x 8192 = 155648",
            "max_seq_len 262144",
            "#957",
            "num_min_blocks 32",
            "nothing was started",
            "kvcache_num_blocks >= 33",
        ):
            assert words in line, (words, line)


@pytest.mark.parametrize(
    ("blocks", "batch", "max_len", "holds"),
    [
        (32, 1, 262144, True),  # exactly full: vLLM gets 33 blocks, 32 usable
        (31, 1, 262144, False),  # one short: 30 usable blocks, below 32
        (100, 4, 262144, True),  # short for 4 full sequences, yet 99 blocks hold one
        (33, 4, 262144, True),  # 32 usable blocks: exactly one sequence
        (32, 4, 262144, False),
    ],
)
def test_pool_arithmetic(blocks, batch, max_len, holds, tmp_path):
    cfg = {"kvcache_num_blocks": blocks, "kvcache_block_size": 8192, "max_seq_len": max_len, "batch_size": batch}
    checks: list[dict] = []
    if holds:
        check_kv_pool(cfg, tmp_path / "rbln_config.json", checks)
        assert checks and checks[0]["ok"]
    else:
        with pytest.raises(InputError, match="#957"):
            check_kv_pool(cfg, tmp_path / "rbln_config.json", checks)


def test_every_pool_optimum_rbln_accepts_holds_max_seq_len(tmp_path):
    """Why the guard could go: for every flash-attention config optimum-rbln 0.12 compiles (max_seq_len a multiple
    of the block, at least 2 blocks) and every kvcache_num_blocks it accepts (num_min_blocks .. num_full_blocks),
    and for eager attention (one block of max_seq_len per sequence, any count from 2), vLLM's pool holds a sequence
    of max_seq_len, so --max-model-len never needs lowering."""
    cfg_path = tmp_path / "rbln_config.json"
    for batch in range(1, 9):
        for per_seq in range(2, 41):
            full, minimum = kv_block_counts(per_seq * 4096, 4096, batch, "flash_attn")
            for blocks in range(minimum, full + 1):
                cfg = {"kvcache_num_blocks": blocks, "kvcache_block_size": 4096, "max_seq_len": per_seq * 4096}
                check_kv_pool({**cfg, "batch_size": batch}, cfg_path, [])
        for blocks in range(2, batch + 1):
            cfg = {"kvcache_num_blocks": blocks, "kvcache_block_size": 8192, "max_seq_len": 8192, "batch_size": batch}
            check_kv_pool(cfg, cfg_path, [])


def test_the_plugin_no_longer_touches_vllm_rblns_max_model_len(monkeypatch, capsys):
    """The former guard wrapped vllm-rbln's sync_from_optimum to hold max_model_len lower; with the variable it read
    still set, the plugin now leaves that function alone and says nothing."""
    from qwenvl_rbln.serving import vllm_plugin

    dispatch = types.ModuleType("vllm_rbln.utils.optimum.converter.dispatch")

    def sync_from_optimum(vllm_config, compiled_rbln_config):
        vllm_config.model_config.max_model_len = compiled_rbln_config["max_seq_len"]

    dispatch.sync_from_optimum = sync_from_optimum
    monkeypatch.setitem(sys.modules, dispatch.__name__, dispatch)
    monkeypatch.setenv("QVL_MAX_MODEL_LEN", "155648")
    vllm_plugin.register()
    assert dispatch.sync_from_optimum is sync_from_optimum
    assert "warning" not in capsys.readouterr().err
