"""`qvl load-check` on artifact directories built in the real optimum-rbln 0.12 layout."""

from __future__ import annotations

import json
import sys

import pytest

from qwenvl_rbln.artifacts.manifest import RBLN_CONFIG_NAME, write_manifest
from qwenvl_rbln.planning.plan import build_plan
from tests.emulated_rbln import compile_emulated
from tests.fakes_rbln import (
    TINY_CONFIG,
    GiB,
    allocation_table,
    install,
    make_auto,
    make_rebel,
    run_main,
    write_artifact,
    write_hf_model,
)

LACK = "Failed to allocate device memory: SYS_EBUSY: Lack of device memory. (code: -16)"


def _artifact(tmp_path, preset="rebel100-1npu", *, manifest=True, placement=None, alloc=None):
    plan = build_plan(preset)
    root = write_artifact(tmp_path / "art", plan, alloc=alloc)
    if manifest:
        data = {"format": 1, "npu": plan.npu, "placement": placement or plan.placement, "rbln_config": plan.rbln_config}
        write_manifest(root, data)
    return plan, root


def _json(argv, capsys):
    code, out, err = run_main([*argv, "--json"], capsys)
    return code, json.loads(out), err


@pytest.fixture
def no_npu_stack(monkeypatch):
    """This host: neither optimum-rbln nor rebel importable."""
    monkeypatch.setitem(sys.modules, "optimum.rbln", None)
    monkeypatch.setitem(sys.modules, "rebel", None)


def test_ok_without_optimum_and_no_runtime(tmp_path, capsys, no_npu_stack):
    _, root = _artifact(tmp_path)
    code, data, err = _json(["load-check", str(root), "--no-runtime"], capsys)
    assert code == 0, err
    assert set(data) >= {"layout", "placement", "memory", "runtime"}
    assert data["layout"]["ok"] is True and data["layout"]["missing"] == [] and data["layout"]["unexpected"] == []
    assert data["target"]["npu"] == "RBLN-CR13" and data["target"]["num_devices"] == 1
    assert data["memory"]["source"] == "estimate" and data["memory"]["fits"] is True
    assert data["runtime"]["attempted"] is False and "not installed" in data["runtime"]["reason"]
    assert data["runtime"]["rbln_config"] == {"visual": {"device": 0}, "device": 0, "create_runtimes": False}
    code, out, _ = run_main(["load-check", str(root), "--no-runtime"], capsys)
    assert code == 0 and "load-check: ok" in out


def test_runtime_without_optimum_exit_3_after_the_report(tmp_path, capsys, no_npu_stack):
    _, root = _artifact(tmp_path)
    code, data, err = _json(["load-check", str(root)], capsys)
    assert code == 3 and data["layout"]["ok"] and data["runtime"]["ok"] is False
    assert err.strip().splitlines()[-1].startswith("qvl: error: optimum-rbln and rebel-compiler")


def test_missing_and_unexpected_graphs_exit_2_with_the_full_report(tmp_path, capsys, no_npu_stack):
    _, root = _artifact(tmp_path, "rebel100-1npu-batch4", manifest=False)
    (root / "decoder_batch_2.rbln").unlink()
    (root / "decoder_batch_8.rbln").write_text("{}")
    code, data, err = _json(["load-check", str(root), "--no-runtime"], capsys)
    assert code == 2
    assert data["layout"]["missing"] == ["decoder_batch_2.rbln"]
    assert data["layout"]["unexpected"] == ["decoder_batch_8.rbln"]
    assert data["runtime"]["attempted"] is False and data["exit_code"] == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("qvl: error:") and "decoder_batch_2.rbln" in last and "decoder_batch_8.rbln" in last


def test_manifest_hash_mismatch_is_reported_by_name(tmp_path, capsys, no_npu_stack):
    _, root = _artifact(tmp_path)
    with open(root / "prefill.rbln", "r+b") as f:
        f.truncate(5)
    code, data, err = _json(["load-check", str(root), "--no-runtime"], capsys)
    assert code == 2
    assert data["layout"]["modified"] == ["prefill.rbln"] and data["layout"]["manifest"]["ok"] is False
    assert "prefill.rbln" in err and "sha256" in err
    code, out, _ = run_main(["load-check", str(root), "--no-runtime"], capsys)
    assert "changed after compile" in out and "prefill.rbln" in out


def test_placement_compared_with_the_compiled_one(tmp_path, capsys, no_npu_stack):
    _, root = _artifact(tmp_path, "rebel100-2npu-batch4")
    code, data, _ = _json(["load-check", str(root), "--no-runtime"], capsys)
    assert data["placement"]["requested"] == {"device": 0, "visual_device": 1} and data["placement"]["matches"]
    assert code == 0
    code, data, err = _json(["load-check", str(root), "--no-runtime", "--visual-device", "0"], capsys)
    assert not data["placement"]["matches"] and data["placement"]["shared_devices"] == [0]
    assert any("differs from the one planned at compile" in n for n in data["placement"]["notes"])
    assert data["memory"]["fits"] is False and code == 4  # batch 4 x 262144 + ViT on one card
    assert "--set" in err.strip().splitlines()[-1]
    code, data, err = _json(["load-check", str(root), "--no-runtime", "--device", "0,1"], capsys)
    assert code == 2 and data["placement"]["ok"] is False
    assert "num_devices=1" in data["placement"]["problems"][0]
    code, _, err = run_main(["load-check", str(root), "--device", "x"], capsys)
    assert code == 2 and "--device 'x' is not an NPU id" in err


def test_runtime_created_with_the_requested_placement(tiny_rbln, rbln_calls, tmp_path, capsys):
    """optimum-rbln's real load on the emulator: the ViT's runtime on NPU 1, the LM graphs' on NPU 0."""
    sets = ["placement.visual_device=1"]
    root = compile_emulated(tmp_path / "art", sets)  # a cache hit of tiny_rbln: placement is a runtime key
    plan = build_plan("cpu-tiny-rbln", sets)
    code, data, err = _json(["load-check", str(root), "--emulate"], capsys)
    assert code == 0, err
    assert rbln_calls.calls[-1]["export"] is False
    assert rbln_calls.calls[-1]["rbln_config"] == plan.load_rbln_config == {"visual": {"device": 1}, "device": 0}
    assert data["runtime"]["ok"] is True and data["runtime"]["create_runtimes"] is True
    assert data["memory"]["source"] == "emulated"  # the emulated graphs' own sizes ("exact" from a real rebel)
    assert [d["device"] for d in data["memory"]["devices"]] == [0, 1]
    devices = {path.split("/")[-1]: dev for path, dev in rbln_calls.runtimes}
    assert devices["compiled_model.rbln"] == 1 and devices["prefill.rbln"] == 0
    assert {devices[f"{name}.rbln"] for name in plan.resolved.graph_names} == {0}
    loads = len(rbln_calls.calls)
    code, data, _ = _json(["load-check", str(root), "--emulate", "--no-runtime"], capsys)
    assert code == 0 and not data["runtime"]["attempted"]  # emulated --no-runtime loads nothing (issue 25)
    assert len(rbln_calls.calls) == loads


def test_lack_of_device_memory_diagnosis(tmp_path, monkeypatch, capsys):
    # fakes: "Lack of device memory" comes from a real NPU's runtime only (the emulator never runs out)
    plan = build_plan("rebel100-2npu-batch4")
    _, root = _artifact(tmp_path, "rebel100-2npu-batch4", alloc=allocation_table(plan, kv_bytes=112 * GiB))
    install(monkeypatch, make_auto(plan), rebel=make_rebel(runtime_error=LACK))
    code, data, err = _json(["load-check", str(root), "--visual-device", "0"], capsys)
    assert code == 4
    rt = data["runtime"]
    assert rt["ok"] is False and "SYS_EBUSY: Lack of device memory" in rt["error"]
    diag = rt["diagnosis"]
    assert diag["shared_devices"] == [0]
    dev0 = diag["devices"][0]
    assert dev0["graphs"] == [
        "prefill",
        "decoder_batch_4",
        "decoder_batch_2",
        "decoder_batch_1",
        "visual/compiled_model",
    ]
    assert dev0["used_bytes"] > 140 * GiB and dev0["usable_bytes"] == 140 * GiB  # exact numbers from the graphs
    assert any("--visual-device 1" in f for f in diag["fixes"])
    assert diag["set"] and all(s.startswith("--set ") for s in diag["set"])  # the planner's concrete fixes
    last = err.strip().splitlines()[-1]
    assert last.startswith("qvl: error: runtime creation failed, Lack of device memory (device 0: prefill")
    # the whole placement (the LM keeps device 0) and a recompile of this artifact (-o), as commands (audit N1)
    assert f"fix: load with `qvl load-check {root} --device 0 --visual-device 1`" in last
    assert "recompile this artifact with `qvl compile --preset PRESET --set " in last  # no preset in its manifest
    assert last.endswith(f" -o {root} --force`")
    assert "--device 0 --visual-device 1" in diag["load_flags"]
    assert diag["recompile"] and all(c.endswith(f" -o {root} --force") for c in diag["recompile"])
    code, out, _ = run_main(["load-check", str(root), "--visual-device", "0"], capsys)
    assert code == 4 and "fixes" in out and "device 0: prefill" in out
    assert f"-o{root}--force" in "".join(out.split())  # the printed recompiles rebuild this artifact


def test_lack_of_device_memory_fixes_keep_the_requested_lm_device(tmp_path, monkeypatch, capsys):
    # audit N1: with the LM and the ViT on device 2, a lone `--visual-device N` puts the LM back on device 0
    plan = build_plan("rebel100-2npu-batch4")
    _, root = _artifact(tmp_path, "rebel100-2npu-batch4", alloc=allocation_table(plan, kv_bytes=112 * GiB))
    install(monkeypatch, make_auto(plan), rebel=make_rebel(runtime_error=LACK))
    code, data, err = _json(["load-check", str(root), "--device", "2", "--visual-device", "2"], capsys)
    diag = data["runtime"]["diagnosis"]
    assert code == 4 and diag["shared_devices"] == [2]
    assert diag["load_flags"] and all(f.startswith("--device 2 --visual-device ") for f in diag["load_flags"])
    assert "--visual-device 2" not in " ".join(diag["load_flags"])
    assert any("`qvl load-check DIR --device 2 --visual-device 3`: 3 is an example" in f for f in diag["fixes"])
    last = err.strip().splitlines()[-1]
    assert f"fix: load with `qvl load-check {root} --device 2 --visual-device " in last


def test_backend_failure_exit_5(tiny_rbln, emulated, capsys, monkeypatch):
    monkeypatch.setenv("QVL_EMULATOR_DEVICES", "2")  # NPU 3 is not on this (emulated) host
    code, data, err = _json(["load-check", str(tiny_rbln), "--emulate", "--device", "3"], capsys)
    assert code == 5 and data["runtime"]["ok"] is False and "device 3 is not an emulated NPU" in err
    assert "QVL_EMULATOR_DEVICES" in data["error"]["hint"] and "rbln-smi" not in data["error"]["hint"]


def test_torch_artifact_layout_and_runtime_skip(tmp_path, capsys):
    model = write_hf_model(tmp_path / "tiny", TINY_CONFIG)
    out = tmp_path / "out"
    code, _, err = run_main(
        ["compile", "--preset", "cpu-tiny", "--model", str(model), "-o", str(out), "--no-cache"], capsys
    )
    assert code == 0, err
    code, data, err = _json(["load-check", str(out), "--no-runtime"], capsys)
    assert code == 0, err
    assert data["kind"] == "torch" and data["layout"]["ok"] and data["runtime"]["reason"] == "--no-runtime"
    assert data["target"]["npu"] == "RBLN-CR13"
    (out / "model.safetensors").unlink()
    code, data, err = _json(["load-check", str(out), "--no-runtime"], capsys)
    assert code == 2 and "model.safetensors" in " ".join(data["layout"]["missing"])


def test_torch_runtime_loads_the_real_tiny_model(tmp_path, capsys):
    pytest.importorskip("transformers")
    from qwenvl_rbln.backends.tiny.model import ensure_tiny_model

    ensure_tiny_model()  # shared per test session (QVL_HOME from conftest)
    out = tmp_path / "out"
    code, _, err = run_main(["compile", "--preset", "cpu-tiny", "-o", str(out), "--no-cache"], capsys)
    assert code == 0, err
    code, data, err = _json(["load-check", str(out)], capsys)
    assert code == 0, err
    assert data["runtime"]["ok"] is True and data["runtime"]["class"] == "Qwen3VLForConditionalGeneration"


def test_not_an_artifact_and_default_dir_from_preset(tmp_path, capsys, monkeypatch):
    (tmp_path / "empty").mkdir()
    code, out, err = run_main(["load-check", str(tmp_path / "empty")], capsys)
    assert code == 2 and err.count("\n") == 1 and "not a compiled artifact" in err and out == ""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(["load-check", "--preset", "rebel100-1npu"], capsys)
    assert code == 2 and "qvl-out/rebel100-1npu" in err


def test_calibrate_records_exact_workspaces_that_later_estimates_use(tmp_path, monkeypatch, capsys):
    # fakes: only a real rebel's allocation figures are recorded; the emulator's sizes never are (test_emulator.py)
    from qwenvl_rbln.memory import calibration
    from qwenvl_rbln.memory.planner import estimate_plan

    monkeypatch.setenv("QVL_HOME", str(tmp_path / "home"))
    plan, root = _artifact(tmp_path, "rebel100-2npu-batch4")
    install(monkeypatch, make_auto(plan), rebel=make_rebel())
    before = estimate_plan(plan).to_dict()
    code, data, err = _json(["load-check", str(root), "--no-runtime", "--calibrate"], capsys)
    assert code == 0, err
    cal = data["memory"]["calibration"]
    assert cal["recorded"] is True
    keys = calibration.graph_keys(plan.resolved)
    assert set(cal["entries"]) == {keys["prefill"], keys["visual"], *(keys[f"decoder_batch_{b}"] for b in (1, 2, 4))}
    stored = calibration.load_calibration()
    assert stored["entries"]  # written to $QVL_HOME/calibration.json
    after = estimate_plan(plan).to_dict()
    items = {i["name"]: i for d in after["devices"] for i in d["items"]}
    assert items["visual.workspace"].get("calibrated")
    vis_before = {i["name"]: i for d in before["devices"] for i in d["items"]}["visual.workspace"]["bytes"]
    assert items["visual.workspace"]["bytes"] == cal["entries"][keys["visual"]]["workspace_bytes"] != vis_before


def test_calibrate_without_rebel_says_why(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QVL_HOME", str(tmp_path / "home"))
    _, root = _artifact(tmp_path, "rebel100-1npu")
    monkeypatch.setitem(sys.modules, "rebel", None)
    code, data, _ = _json(["load-check", str(root), "--no-runtime", "--calibrate"], capsys)
    assert data["memory"]["calibration"]["recorded"] is False
    assert "rebel" in data["memory"]["calibration"]["reason"]


def _edit_rbln_config(root, edit):
    path = root / RBLN_CONFIG_NAME
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda c: c.update(max_seq_len="abc"), "max_seq_len='abc'"),
        (lambda c: [g.update(npu="RBLN-ZZ9") for g in c["_compile_cfgs"]], "unknown NPU 'RBLN-ZZ9'"),
        (lambda c: [g.update(npu="RBLN-XX1") for g in c["visual"]["_compile_cfgs"]], "visual graphs"),
    ],
    ids=["bad-value", "unknown-npu", "unknown-visual-npu"],
)
def test_an_artifact_config_optimum_rbln_would_refuse_is_exit_2_not_ok(tmp_path, capsys, no_npu_stack, edit, needle):
    """Such values once left `load-check: ok` with exit 0 and a dim footnote under memory."""
    _, root = _artifact(tmp_path, manifest=False)
    _edit_rbln_config(root, edit)
    code, data, err = _json(["load-check", str(root), "--no-runtime"], capsys)
    assert code == 2 and data["ok"] is False and data["layout"]["ok"] is False
    assert any(needle in p for p in data["layout"]["problems"]), data["layout"]["problems"]
    last = err.strip().splitlines()[-1]
    assert last.startswith("qvl: error:") and needle in last


def test_bad_device_memory_and_a_file_instead_of_a_directory_are_one_line_errors(tmp_path, capsys, no_npu_stack):
    _, root = _artifact(tmp_path)
    cases = (("12XB", "is not a size"), ("0", "has no unit"), ("0.5", "has no unit"), ("0GiB", "must be positive"))
    for value, says in cases:
        code, out, err = run_main(["load-check", str(root), "--no-runtime", "--device-memory", value], capsys)
        assert code == 2 and out == "" and err.strip().startswith(f"qvl: error: --device-memory={value!r} {says}")
        assert "recompile" not in err  # a flag typo, not a damaged artifact
    code, _, err = run_main(["load-check", str(root / RBLN_CONFIG_NAME)], capsys)
    assert code == 2 and "is a file, not a directory" in err


def test_device_memory_above_the_artifacts_own_card_is_refused(tmp_path, capsys, no_npu_stack):
    _, root = _artifact(tmp_path, manifest=False)
    _edit_rbln_config(root, lambda c: [g.update(npu="RBLN-CA25") for g in c["_compile_cfgs"]])
    _edit_rbln_config(root, lambda c: [g.update(npu="RBLN-CA25") for g in c["visual"]["_compile_cfgs"]])
    code, out, err = run_main(["load-check", str(root), "--no-runtime", "--device-memory", "20GiB"], capsys)
    assert code == 2 and out == "", (code, err)
    line = err.strip().splitlines()[-1]
    assert line.startswith("qvl: error: --device-memory='20GiB' is more than") and "ATOM" in line, line


def test_calibrate_without_rebel_says_so_in_the_human_report(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QVL_HOME", str(tmp_path / "home"))
    _, root = _artifact(tmp_path)
    monkeypatch.setitem(sys.modules, "rebel", None)
    code, out, _ = run_main(["load-check", str(root), "--no-runtime", "--calibrate"], capsys)
    assert code == 0 and "calibration: nothing recorded" in " ".join(out.split())


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda c: c.update(batch_size=0), "batch_size=0 is not a positive integer"),
        (lambda c: [g.update(npu=["RBLN-CR13"]) for g in c["_compile_cfgs"]], "not an SKU string"),
        (lambda c: c.update(max_seq_len="1e9"), "max_seq_len='1e9' is missing or not an integer"),
    ],
)
def test_more_configs_optimum_rbln_would_refuse(tmp_path, capsys, no_npu_stack, edit, needle):
    """Second audit: batch_size 0 was read as 1 and a list as the NPU was skipped; both passed as ok."""
    _, root = _artifact(tmp_path, manifest=False)
    _edit_rbln_config(root, edit)
    code, data, err = _json(["load-check", str(root), "--no-runtime"], capsys)
    assert code == 2 and data["layout"]["ok"] is False
    assert needle in err.strip().splitlines()[-1]


def test_the_fallback_fix_never_says_move_the_vit_when_it_already_has_its_own_npu(tmp_path, capsys, no_npu_stack):
    _, root = _artifact(tmp_path, "rebel100-2npu-batch4")
    code, _, err = run_main(["load-check", str(root), "--no-runtime", "--device-memory", "8GiB"], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 4 and "does not fit" in last
    assert "visual-device" not in last and "smaller max_seq_len" in last


def test_a_real_runtime_load_is_recorded_and_deploy_sizes_its_probe_from_it(tmp_path, monkeypatch, capsys):
    # fakes: a real rebel's runtime creation (only a host with an NPU measures a load; the emulator's never counts)
    from qwenvl_rbln.artifacts.load_times import load_times_path, measured_load
    from qwenvl_rbln.deploy.build import build
    from qwenvl_rbln.deploy.options import DeployOptions

    monkeypatch.setenv("QVL_HOME", str(tmp_path / "home"))
    plan, root = _artifact(tmp_path, "rebel100-1npu")
    install(monkeypatch, make_auto(plan), rebel=make_rebel())
    code, data, err = _json(["load-check", str(root), "--no-runtime"], capsys)
    assert code == 0, err
    assert measured_load(root) is None and not load_times_path().exists()  # no runtime, no measured load
    code, data, err = _json(["load-check", str(root)], capsys)
    assert code == 0, err
    assert data["runtime"]["create_runtimes"] is True and data["runtime"]["recorded"] == str(load_times_path())
    entry = measured_load(root)
    assert entry["seconds"] == data["runtime"]["seconds"] and entry["npu"] == plan.npu
    entry_file = json.loads(load_times_path().read_text())
    entry_file["entries"][next(iter(entry_file["entries"]))]["seconds"] = 150.0  # a load as slow as a real 32B's
    load_times_path().write_text(json.dumps(entry_file))
    result = build(DeployOptions(directory=root, out=tmp_path / "out", artifact="hostpath:/models/a", image="r/v:1"))
    assert result["spec"].budget["budget_s"] == 480 and result["spec"].budget["measured_s"] == 150.0
    assert "recorded" in result["spec"].budget["measured_from"]  # named in the manifest's comment
    (root / "prefill.rbln").write_bytes(b"recompiled")  # a recompile: new graphs and their manifest
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": plan.placement, "rbln_config": plan.rbln_config})
    assert measured_load(root) is None  # the old measurement is not theirs


def test_a_load_faster_than_the_clocks_rounding_is_recorded_as_a_load_time(tmp_path, monkeypatch, capsys):
    """A runtime creation under 0.5 ms (a fake's; never a real NPU's) was recorded as 0.0 s, which the load-time
    reader then refused as a damaged file: the recorded seconds are always above 0."""
    from qwenvl_rbln.artifacts.load_times import measured_load

    monkeypatch.setenv("QVL_HOME", str(tmp_path / "home"))
    plan, root = _artifact(tmp_path, "rebel100-1npu")
    install(monkeypatch, make_auto(plan), rebel=make_rebel())
    monkeypatch.setattr("time.monotonic", lambda: 100.0)  # the runtimes are created in no time at all
    code, data, err = _json(["load-check", str(root)], capsys)
    assert code == 0, err
    assert data["runtime"]["seconds"] > 0 and measured_load(root)["seconds"] > 0
