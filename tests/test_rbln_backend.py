"""backends/rbln/ (optimum.py, progress.py, device_memory.py): exact calls, stages, allocations, error mapping.

The tiny preset (cpu-tiny-rbln) runs optimum-rbln 0.12's real compile and load on qvl's CPU emulator of rebel
(emulated: no NPU compile ran), with its entry points recorded (tests/emulated_rbln.py). The 2B presets and the
failures only a real NPU stack produces run against the injected fakes of tests/fakes_rbln.py, which record calls
and write the layout optimum-rbln 0.12 writes; each such test says why it needs them.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from qwenvl_rbln.backends import Progress
from qwenvl_rbln.backends.rbln import device_memory as rbln_memory
from qwenvl_rbln.backends.rbln import optimum as backend
from qwenvl_rbln.errors import BackendError, DependencyMissing, DoesNotFit
from qwenvl_rbln.planning.catalogue.devices import npu_spec
from qwenvl_rbln.planning.plan import build_plan
from tests.emulated_rbln import emulator_on, optimum_rbln_installed, record_rbln
from tests.fakes_rbln import (
    GiB,
    MiB,
    allocation_table,
    install,
    make_auto,
    make_rebel,
    rbln_presets,
    temp_entries,
    write_artifact,
)

TINY = "cpu-tiny-rbln"
# fakes: the 2B presets cannot run on the emulator (the 2B weights are not here, and a 262144-token context and a
# 16384-patch ViT bucket are far too large to trace on a CPU); the tiny preset runs for real in the tests below
NPU_PRESETS = [p for p in rbln_presets() if p != TINY]


def _staging(tmp_path):
    staging = tmp_path / ".out.qvl-tmp-1-abcd"
    staging.mkdir()
    return staging


@pytest.fixture(scope="module")
def tiny_compile(tiny_model, tmp_path_factory):
    """One emulated ``compile_model`` of cpu-tiny-rbln with optimum-rbln's entry points and the stages recorded."""
    if not optimum_rbln_installed():
        pytest.skip("optimum-rbln is not installed")
    plan = build_plan(TINY, model=str(tiny_model))
    before = json.loads(json.dumps(plan.rbln_config))
    tmp = tmp_path_factory.mktemp("compile")
    staging = _staging(tmp)
    lines: list[str] = []
    with emulator_on(), pytest.MonkeyPatch.context() as mp:
        calls = record_rbln(mp)
        from optimum.rbln.modeling_base import RBLNBaseModel

        hooked = RBLNBaseModel.__dict__["compile"]  # record_rbln's wrapper of the real classmethod
        progress = Progress(lines.append, heartbeat_s=0)
        info = backend.compile_model(plan, staging, progress)
        progress.stop()
        restored = RBLNBaseModel.__dict__["compile"] is hooked
    return SimpleNamespace(
        plan=plan,
        before=before,
        tmp=tmp,
        staging=staging,
        calls=calls,
        info=info,
        progress=progress,
        lines=lines,
        restored=restored,
    )


def _assert_compiled_with_exactly_the_plan(
    plan: Any, before: dict, auto: Any, staging: Path, tmp_path: Path, info: dict
) -> None:
    """One from_pretrained(export=True) with exactly the plan's rbln_config (the plan keeps its own dict, whatever
    the callee does to the one it got), exported into a sibling scratch dir, saved once into staging."""
    assert len(auto.calls) == 1
    call = auto.calls[0]
    assert call["model_id"] == plan.model_id and call["export"] is True
    assert call["rbln_config"] == plan.rbln_config  # exactly the plan's dict
    assert plan.rbln_config == before
    assert set(call["kwargs"]) == {"model_save_dir"}
    scratch = call["kwargs"]["model_save_dir"]
    assert scratch == str(staging) + ".export"  # a sibling on the same filesystem, never save_pretrained's target
    assert auto.saves == [str(staging)]
    assert (staging / "prefill.rbln").exists() and (staging / "visual" / "compiled_model.rbln").exists()
    assert not (tmp_path / (staging.name + ".export")).exists() and temp_entries(tmp_path) == [staging.name]
    assert info["class"] == "RBLNAutoModelForImageTextToText"


def test_compile_passes_exactly_the_plans_rbln_config_emulated(tiny_compile):
    t = tiny_compile
    _assert_compiled_with_exactly_the_plan(t.plan, t.before, t.calls, t.staging, t.tmp, t.info)


@pytest.mark.parametrize("preset", NPU_PRESETS)
def test_compile_passes_exactly_the_plans_rbln_config(tmp_path, monkeypatch, preset):
    plan = build_plan(preset)
    before = json.loads(json.dumps(plan.rbln_config))
    auto = make_auto(plan)
    install(monkeypatch, auto)
    staging = _staging(tmp_path)
    info = backend.compile_model(plan, staging, Progress(), model_cls=None)
    _assert_compiled_with_exactly_the_plan(plan, before, auto, staging, tmp_path, info)


def test_load_passes_exactly_the_plans_load_rbln_config_emulated(tiny_rbln, rbln_calls):
    plan = build_plan(TINY)
    p = plan.placement
    backend.load_model(tiny_rbln, p["device"], p["visual_device"])
    backend.load_model(tiny_rbln, p["device"], p["visual_device"], create_runtimes=False)
    auto = rbln_calls
    assert [c["export"] for c in auto.calls] == [False, False]
    assert auto.calls[0]["rbln_config"] == plan.load_rbln_config
    assert auto.calls[1]["rbln_config"] == {**plan.load_rbln_config, "create_runtimes": False}
    assert auto.calls[0]["model_id"] == str(tiny_rbln) and auto.calls[0]["kwargs"] == {}


@pytest.mark.parametrize("preset", NPU_PRESETS)
def test_load_passes_exactly_the_plans_load_rbln_config(tmp_path, monkeypatch, preset):
    plan = build_plan(preset)
    auto = make_auto(plan)
    install(monkeypatch, auto, rebel=make_rebel())
    root = write_artifact(tmp_path / "art", plan)
    p = plan.placement
    backend.load_model(root, p["device"], p["visual_device"], model_cls=auto)
    backend.load_model(root, p["device"], p["visual_device"], create_runtimes=False, model_cls=auto)
    assert [c["export"] for c in auto.calls] == [False, False]
    assert auto.calls[0]["rbln_config"] == plan.load_rbln_config
    assert auto.calls[1]["rbln_config"] == {**plan.load_rbln_config, "create_runtimes": False}
    assert auto.calls[0]["model_id"] == str(root) and auto.calls[0]["kwargs"] == {}


def test_stage_progress_comes_from_the_compile_hook_and_is_restored(tiny_compile):
    plan, progress, lines = tiny_compile.plan, tiny_compile.progress, tiny_compile.lines
    stages = [s["stage"] for s in progress.stages]
    decoders = [f"decoder graph {name}" for name in plan.resolved.graph_names if name.startswith("decoder_batch_")]
    assert decoders == ["decoder graph decoder_batch_2", "decoder graph decoder_batch_1"]
    assert stages == ["loading model", "ViT buckets", "prefill graph", *decoders, "KV cache sizing", "saving"]
    assert all(line.startswith("[") and "s] " in line for line in lines)  # elapsed time on every line
    buckets = ", ".join(str(b) for b in plan.resolved.vit_buckets)
    assert any(f"buckets {buckets} patches" in line for line in lines)
    assert tiny_compile.restored
    assert tiny_compile.calls.compiled == ["compiled_model", *plan.resolved.graph_names]


def test_no_kv_sizing_stage_with_explicit_blocks(tmp_path, emulated, tiny_model):
    blocks = build_plan(TINY).resolved.num_full_blocks  # what automatic sizing gives this plan
    # one small ViT bucket keeps this compile short; the KV blocks are what the test is about
    plan = build_plan(
        TINY, [f"rbln_config.kvcache_num_blocks={blocks}", "visual.max_seq_len=[256]"], model=str(tiny_model)
    )
    progress = Progress(heartbeat_s=0)
    backend.compile_model(plan, _staging(tmp_path), progress)
    progress.stop()
    stages = [s["stage"] for s in progress.stages]
    assert "prefill graph" in stages and "KV cache sizing" not in stages


def test_heartbeat_reports_elapsed_time():
    import time

    lines: list[str] = []
    with Progress(lines.append, heartbeat_s=0.05) as progress:
        progress.stage("prefill graph")
        time.sleep(0.3)
    assert any("still in prefill graph" in line for line in lines)
    assert progress.timings()["prefill graph"] >= 0.25


def test_missing_optimum_rbln_is_one_line_with_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "optimum.rbln", None)
    monkeypatch.setitem(sys.modules, "rebel", None)
    assert backend.missing_dependencies() == ["optimum-rbln", "rebel-compiler"]
    with pytest.raises(DependencyMissing) as info:
        backend.check_dependencies()
    line = info.value.one_line()
    assert info.value.exit_code == 3 and "\n" not in line
    assert "optimum-rbln==0.12.0" in line and "rebel-compiler" in line and "Rebellions' package index" in line


def test_only_rebel_missing(monkeypatch):
    # fakes: a host with optimum-rbln but no rebel (the emulator would be a rebel)
    install(monkeypatch, make_auto(build_plan("rebel100-1npu")))
    monkeypatch.setitem(sys.modules, "rebel", None)
    assert backend.missing_dependencies() == ["rebel-compiler"]
    with pytest.raises(DependencyMissing, match="rebel-compiler is not installed"):
        backend.model_class()


def test_compile_errors_map_to_exit_codes(tmp_path, monkeypatch):
    # fakes: optimum-rbln's KV-sizing refusal needs a real NPU's memory figures, and "Unknown npu name" is the real
    # compiler's; the emulator produces neither
    plan = build_plan("rebel100-1npu")
    kv = (
        "Insufficient memory for the required KV cache: only 3 blocks can be allocated, but at least 33 blocks are "
        "required. Consider reducing `max_seq_len` or `batch_size` (currently 1) to lower the memory requirement."
    )
    install(monkeypatch, make_auto(plan, export_error=kv))
    staging = _staging(tmp_path)
    with pytest.raises(DoesNotFit, match="only 3 blocks") as info:
        backend.compile_model(plan, staging, Progress())
    assert info.value.exit_code == 4
    # the planner fits this plan, so no computed --set exists: a plain hint, and never "move the ViT" (optimum-rbln
    # sizes the KV pool for the LM alone)
    assert "ViT" not in info.value.hint and "32768" not in info.value.hint
    big = build_plan("rebel100-1npu-batch4", ["max_seq_len=262144"])
    install(monkeypatch, make_auto(big, export_error=kv))
    with pytest.raises(DoesNotFit) as info:
        backend.compile_model(big, staging, Progress())
    assert info.value.hint.startswith("try --set max_seq_len=163840 or --set batch_size=2")
    install(monkeypatch, make_auto(plan, export_error="Unknown npu name: RBLN-XX99"))
    with pytest.raises(BackendError, match="Unknown npu name") as info:
        backend.compile_model(plan, staging, Progress())
    assert info.value.exit_code == 5
    assert not (tmp_path / (staging.name + ".export")).exists()


def test_exact_allocations_count_the_shared_kv_cache_once(tiny_rbln, emulated):
    """The emulated graphs' own allocations: every LM graph holds the same KV cache, counted once per device."""
    from qwenvl_rbln.artifacts.layout import graph_files
    from qwenvl_rbln.backends.emulator import rebel_api

    plan = build_plan(TINY)
    cfg = json.loads((tiny_rbln / "rbln_config.json").read_text())
    graphs = graph_files(cfg)
    mem = rbln_memory.read_allocations(tiny_rbln, graphs, {"device": 0, "visual_device": 1}, npu_spec("RBLN-CR13"))
    assert mem["source"] == "exact"
    dev0, dev1 = mem["devices"]
    lm = plan.resolved.graph_names
    assert dev0["graphs"] == lm == ["prefill", "decoder_batch_2", "decoder_batch_1"]
    # the KV cache every LM graph holds: layers x (K, V) x blocks x KV heads x block x head_dim x fp32
    t = plan.geometry.text
    kv = 2 * t.num_hidden_layers * cfg["kvcache_num_blocks"] * t.num_key_value_heads * cfg["kvcache_block_size"]
    kv *= t.head_dim * 4
    alloc = {
        name: rebel_api.RBLNCompiledModel(str(tiny_rbln / info["file"])).get_alloc_per_chiplet_by_key()
        for name, info in graphs.items()
    }
    size = {name: {key: sum(map(sum, nodes)) for key, nodes in a.items()} for name, a in alloc.items()}
    assert all(size[name]["DramTensor"] == kv for name in lm)
    lm_expected = kv + sum(v for name in lm for key, v in size[name].items() if key != "DramTensor")
    assert dev0["total_bytes"] == lm_expected
    assert mem["graphs"]["prefill"]["kv_shared"] is False
    assert all(mem["graphs"][name]["kv_shared"] is True for name in lm[1:])
    vit = sum(size["visual/compiled_model"].values())
    assert dev1["graphs"] == ["visual/compiled_model"] and dev1["total_bytes"] == vit
    assert dev0["fits"] and dev1["fits"] and mem["fits"]
    shared = rbln_memory.read_allocations(tiny_rbln, graphs, {"device": 0, "visual_device": 0}, npu_spec("RBLN-CR13"))
    assert len(shared["devices"]) == 1 and shared["fits"] is True
    assert shared["devices"][0]["total_bytes"] == lm_expected + vit


def test_exact_allocations_over_the_card_do_not_fit(tmp_path, monkeypatch):
    # fakes: 2B-sized allocations (the emulator's tiny graphs never come near a card's 140 GiB)
    plan = build_plan("rebel100-1npu-batch4")
    install(monkeypatch, None, rebel=make_rebel(), with_optimum=False)
    root = write_artifact(tmp_path / "art", plan)
    from qwenvl_rbln.artifacts.layout import graph_files

    graphs = graph_files(json.loads((root / "rbln_config.json").read_text()))
    mem = rbln_memory.read_allocations(root, graphs, {"device": 0, "visual_device": 1}, npu_spec("RBLN-CR13"))
    assert mem["source"] == "exact"
    dev0, dev1 = mem["devices"]
    assert dev0["graphs"] == ["prefill", "decoder_batch_4", "decoder_batch_2", "decoder_batch_1"]
    lm_expected = int(3.2 * GiB) + 256 * MiB + 28 * GiB + 64 * MiB * (4 + 2 + 1)
    assert dev0["total_bytes"] == pytest.approx(lm_expected, abs=64)
    assert mem["graphs"]["decoder_batch_4"]["kv_shared"] is True
    assert dev1["graphs"] == ["visual/compiled_model"] and dev1["total_bytes"] == pytest.approx(26.75 * GiB, abs=64)
    assert dev0["fits"] and dev1["fits"] and mem["fits"]
    shared = rbln_memory.read_allocations(root, graphs, {"device": 0, "visual_device": 0}, npu_spec("RBLN-CR13"))
    assert len(shared["devices"]) == 1 and shared["fits"] is True  # ~60 GiB on one card
    # batch 4 with the full 262144 context: 112 GiB of KV + ViT on one card is over 140 GiB
    big = write_artifact(tmp_path / "big", plan, alloc=allocation_table(plan, kv_bytes=112 * GiB))
    over = rbln_memory.read_allocations(big, graphs, {"device": 0, "visual_device": 0}, npu_spec("RBLN-CR13"))
    assert over["fits"] is False and over["devices"][0]["total_bytes"] > 140 * GiB
    assert max(over["devices"][0]["per_chiplet_bytes"]) > npu_spec("RBLN-CR13").usable_per_chiplet


def test_no_exact_readout_without_rebel(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "rebel", None)
    assert rbln_memory.read_allocations(tmp_path, {}, {"device": 0, "visual_device": 0}, None) is None


def test_lack_of_device_memory_becomes_does_not_fit_with_the_raw_message(tmp_path, monkeypatch):
    # fakes: "Lack of device memory" comes from a real NPU's runtime only (the emulator never runs out)
    plan = build_plan("rebel100-1npu")
    auto = make_auto(plan)
    install(
        monkeypatch,
        auto,
        rebel=make_rebel(runtime_error="Failed to allocate: SYS_EBUSY: Lack of device memory. (code: -16)"),
    )
    root = write_artifact(tmp_path / "art", plan)
    with pytest.raises(DoesNotFit) as info:
        backend.load_model(root, 0, 0)
    assert "SYS_EBUSY: Lack of device memory" in info.value.raw
    assert info.value.exit_code == 4


def test_a_missing_graph_file_is_a_backend_error_naming_it(tiny_rbln, emulated, tmp_path):
    root = Path(shutil.copytree(tiny_rbln, tmp_path / "art"))
    (root / "prefill.rbln").unlink()
    with pytest.raises(BackendError, match="prefill.rbln"):  # optimum-rbln's own FileNotFoundError, mapped
        backend.load_model(root, 0, 0)


def test_diagnosis_names_graphs_devices_numbers_and_fixes():
    graphs = {
        "prefill": {"file": "prefill.rbln", "submodule": "lm"},
        "decoder_batch_1": {"file": "decoder_batch_1.rbln", "submodule": "lm"},
        "visual/compiled_model": {"file": "visual/compiled_model.rbln", "submodule": "visual"},
    }
    memory = {
        "source": "estimate",
        "devices": [{"device": 0, "total_bytes": 150 * GiB, "usable_bytes": 140 * GiB, "fits": False}],
    }
    planner = {
        "suggestions": [{"kind": "max_seq_len", "text": "cut the context", "set": ["rbln_config.max_seq_len=32768"]}]
    }
    diag = rbln_memory.lack_of_memory_diagnosis(
        "SYS_EBUSY: Lack of device memory", memory, {"device": 0, "visual_device": 0}, graphs, planner
    )
    assert diag["shared_devices"] == [0]
    assert diag["devices"][0]["graphs"] == ["prefill", "decoder_batch_1", "visual/compiled_model"]
    assert diag["devices"][0]["used_bytes"] == 150 * GiB
    assert "150.00 GiB of 140.00 GiB" in diag["summary"]
    assert any("--visual-device 1" in f for f in diag["fixes"])
    assert "cut the context" in diag["fixes"]
    assert diag["set"] == ["--set rbln_config.max_seq_len=32768"]


def test_placement_suggestions_become_load_flags_not_recompiles():
    flags, sets = rbln_memory.split_load_time(
        ["--set placement.visual_device=1", "--set max_seq_len=32768", "--set placement.device=[0] --set batch_size=2"]
    )
    assert flags == ["--visual-device 1"]
    assert sets == ["--set max_seq_len=32768", "--set placement.device=[0] --set batch_size=2"]
    assert rbln_memory.fix_hint(flags, sets) == (
        "load with --visual-device 1 (the ViT on its own NPU), or recompile with --set max_seq_len=32768"
    )
