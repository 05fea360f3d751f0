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
