"""The KV block pool and --max-model-len (vllm-rbln issue #957; issue 36 item 5: the guard holds or goes).

vllm-rbln gives vLLM ``kvcache_num_blocks + 1`` blocks for a full pool and ``kvcache_num_blocks`` for a short one, and
vLLM keeps one as its null block: a short pool holds ``(kvcache_num_blocks - 1) x block`` tokens for one sequence.
optimum-rbln 0.12 refuses a flash pool below one sequence of max_seq_len (``num_min_blocks``) but compiles an eager
pool of 1 block at batch 2 (audit 2026-12-04b F3: it checks eager pools only from above); ``qvl compile`` refuses
every eager pool below one block per sequence. So every pool qvl's planner accepts holds max_seq_len, and the guard
that held ``max_model_len`` lower inside vLLM (``QVL_MAX_MODEL_LEN``), which when forced narrowed every block table
and failed every prefill (shared/engine/README.md), is gone: serve passes ``--max-model-len`` = max_seq_len and
refuses, before anything starts, a pool that could not hold it (serving/preflight.py: check_kv_pool).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

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


class _Refused(Exception):
    pass


class _Chk:
    """The planner's checker protocol (planning/lm/checks.py: Checker): a refusal raises."""

    def fail(self, key, message, hint):
        raise _Refused(message)

    def int_(self, key, value, *, minimum=None, allowed=""):
        return value


def planner_accepts(blocks: int, block: int, max_len: int, batch: int, attn: str) -> bool:
    """Whether `qvl compile`'s planner accepts kvcache_num_blocks=blocks (planning/lm/checks.py: kv_blocks)."""
    from qwenvl_rbln.planning.catalogue.devices import npu_spec
    from qwenvl_rbln.planning.lm.checks import kv_blocks

    try:
        kv_blocks(_Chk(), {"kvcache_num_blocks": blocks}, npu_spec("RBLN-CR13"), (max_len, block, batch, attn), [])
    except _Refused:
        return False
    return True


def serve_accepts(blocks: int, block: int, max_len: int, batch: int, attn: str) -> bool:
    cfg = {"kvcache_num_blocks": blocks, "kvcache_block_size": block, "max_seq_len": max_len, "batch_size": batch}
    try:
        check_kv_pool({**cfg, "attn_impl": attn}, Path("rbln_config.json"), [])
    except InputError:
        return False
    return True


def test_every_pool_the_planner_accepts_holds_max_seq_len():
    """One policy (F3): every kvcache_num_blocks `qvl compile` accepts, serve accepts. Flash: optimum-rbln's own
    minimum (num_min_blocks .. num_full_blocks). Eager, from 1 block (the pool optimum-rbln 0.12 compiles at batch 2
    and serve refuses): the planner refuses every pool below one block per sequence."""
    for batch in range(1, 9):
        for per_seq in range(2, 41):
            full, minimum = kv_block_counts(per_seq * 4096, 4096, batch, "flash_attn")
            for blocks in range(1, full + 1):
                if planner_accepts(blocks, 4096, per_seq * 4096, batch, "flash_attn"):
                    assert blocks >= minimum and serve_accepts(blocks, 4096, per_seq * 4096, batch, "flash_attn")
        for blocks in range(1, batch + 3):
            planned = planner_accepts(blocks, 8192, 8192, batch, "eager")
            assert planned == (blocks >= batch), (blocks, batch)
            if planned:
                assert serve_accepts(blocks, 8192, 8192, batch, "eager"), (blocks, batch)
    assert not serve_accepts(1, 8192, 8192, 2, "eager")  # the audit's artifact: 0 usable tokens


def test_an_eager_pool_below_one_block_per_sequence_is_refused_by_compile_and_blamed_on_no_one_wrongly(
    tmp_path, capsys
):
    """F3 + F10: `qvl compile --dry-run` refused nothing and printed '(= batch_size)' for 1 block at batch 2; serve's
    refusal said optimum-rbln 0.12 never writes such a pool, which it does for eager attention."""
    sets = ["--set", "attn_impl=eager", "--set", "kvcache_partition_len=null"]
    code, out, err = run_main(["compile", "--preset", "cpu-tiny-rbln", *sets, "--set", "kvcache_num_blocks=1",
                               "--dry-run"], capsys)  # fmt: skip
    assert code == 2 and "below one block per sequence" in err and "kvcache_num_blocks >= 2" in err, (out, err)
    code, out, err = run_main(["compile", "--preset", "cpu-tiny-rbln", *sets, "--set", "kvcache_num_blocks=3",
                               "--dry-run"], capsys)  # fmt: skip
    assert code == 0, err
    assert "3 blocks of max_seq_len" in out and "(= batch_size)" not in out and "(batch_size 2)" in out
    cfg = {"kvcache_num_blocks": 1, "kvcache_block_size": 4096, "max_seq_len": 4096, "batch_size": 2}
    with pytest.raises(InputError) as refused:
        check_kv_pool({**cfg, "attn_impl": "eager"}, tmp_path / "rbln_config.json", [])
    assert "never writes" not in refused.value.message
    assert "compiles such an eager pool without checking it" in refused.value.message


def test_a_max_seq_len_off_the_block_grid_needs_the_rounded_up_blocks_per_sequence(tmp_path):
    """Mutation PF03 (blocks per sequence rounded down): vllm-rbln calls a pool full at batch x ceil(max_model_len /
    block) blocks (model_base.py is_full_block_available); a pool one block short of that is not full, and its
    usable blocks (one less, the null block) do not hold max_seq_len."""
    cfg = {"kvcache_num_blocks": 3, "kvcache_block_size": 4096, "max_seq_len": 3 * 4096 + 100, "batch_size": 1}
    with pytest.raises(InputError, match="#957"):
        check_kv_pool(cfg, tmp_path / "rbln_config.json", [])
    checks: list[dict] = []
    check_kv_pool({**cfg, "kvcache_num_blocks": 4}, tmp_path / "rbln_config.json", checks)
    assert "a full pool" in checks[0]["detail"]


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
