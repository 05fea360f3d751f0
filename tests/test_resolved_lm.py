"""ResolvedLM has one constructor per source (a preset, a compiled rbln_config.json) and one derivation."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.lm.resolved import ResolvedLM
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import rbln_config_json

PACKAGE = Path(__file__).resolve().parents[1] / "qwenvl_rbln"


def test_resolved_lm_is_constructed_in_one_place():
    """Only lm.resolved's shared derivation calls ResolvedLM(...): no source may compute its fields itself."""
    callers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ResolvedLM":
                    callers.append(f"{path.relative_to(PACKAGE.parent)}:{fn.name}")
    assert sorted(set(callers)) == ["qwenvl_rbln/planning/lm/resolved.py:_derive"]


@pytest.mark.parametrize(
    ("preset", "sets"),
    [
        ("rebel100-1npu", []),
        (
            "rebel100-1npu",
            [
                "attn_impl=eager",
                "kvcache_partition_len=null",
                "max_seq_len=8192",
                "decoder_batch_sizes=[2,1]",
                "batch_size=2",
            ],
        ),
    ],
)
def test_an_artifact_without_the_defaulted_keys_resolves_as_its_preset(preset, sets):
    """Both constructors fill the same defaults (attn_impl, block size, prefill chunk, decoder graphs)."""
    plan = build_plan(preset, sets)
    cfg = rbln_config_json(plan, kv_blocks=0)
    for key in ("attn_impl", "kvcache_block_size", "prefill_chunk_size", "decoder_batch_sizes"):
        cfg.pop(key, None)
    if plan.resolved.attn_impl == "eager":
        cfg.pop("kvcache_partition_len", None)
    resolved = ResolvedLM.from_rbln_config(
        cfg, {"npu": plan.npu, "num_devices": 1, "visual_num_devices": 1}, source="x"
    )
    expected = replace(plan.resolved, memory_budget=None)
    if plan.resolved.decoder_batch_sizes != [plan.resolved.batch_size]:
        expected = replace(expected, decoder_batch_sizes=[plan.resolved.batch_size])  # optimum-rbln's default
    assert resolved == expected


def test_a_flash_artifact_without_a_partition_is_refused_naming_the_file():
    plan = build_plan("rebel100-1npu")
    cfg = {**rbln_config_json(plan), "attn_impl": "flash_attn", "kvcache_partition_len": None}
    with pytest.raises(InputError, match="^art/rbln_config.json: attn_impl=flash_attn without kvcache_partition_len"):
        ResolvedLM.from_rbln_config(
            cfg, {"npu": None, "num_devices": 1, "visual_num_devices": 1}, source="art/rbln_config.json"
        )


def test_an_artifact_compiled_with_position_ids_resolves_as_its_preset():
    """use_position_ids shapes the attention-mask input ([B, max_seq_len]); load-check must read it back."""
    plan = build_plan("rebel100-1npu", ["use_attention_mask=true", "use_position_ids=true"])
    cfg = rbln_config_json(plan)
    cfg.update(use_attention_mask=True, use_position_ids=True)
    resolved = ResolvedLM.from_rbln_config(
        cfg, {"npu": plan.npu, "num_devices": 1, "visual_num_devices": 1}, source="x"
    )
    assert plan.resolved.use_position_ids and resolved.use_position_ids
    assert resolved.use_attention_mask
