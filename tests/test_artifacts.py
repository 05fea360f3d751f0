"""qwenvl_rbln.artifacts: hashing, manifest, atomic directories, locks, cache keys and store, layout checks."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import filelock
import pytest

from qwenvl_rbln.artifacts.cache import cache_key, cache_lookup, cache_store
from qwenvl_rbln.artifacts.layout import (
    check_layout,
    compile_target,
    describe_layout_problem,
    graph_files,
    placement_from_artifact,
    read_artifact_config,
    resolved_from_rbln_config,
)
from qwenvl_rbln.artifacts.locks import lock_owner, lock_path, output_lock
from qwenvl_rbln.artifacts.manifest import (
    CHUNK,
    MANIFEST_NAME,
    NOT_INSTALLED,
    RBLN_CONFIG_NAME,
    collect_versions,
    hash_tree,
    model_fingerprint,
    read_manifest,
    sha256_file,
    write_manifest,
)
from qwenvl_rbln.artifacts.staging import atomic_output_dir, check_target
from qwenvl_rbln.errors import BusyError, InputError
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import TINY_CONFIG, rbln_config_json, rbln_presets, temp_entries, write_artifact, write_hf_model

# ------------------------------------------------------------------------------------------------ hashing


def test_hash_tree_is_content_and_path_sensitive(tmp_path):
    a = write_hf_model(tmp_path / "a")
    b = write_hf_model(tmp_path / "b")
    ha, hb = hash_tree(a), hash_tree(b)
    assert ha["sha256"] == hb["sha256"] and ha["file_count"] == 6
    (b / "model.safetensors").write_bytes(b"different")
    assert hash_tree(b)["sha256"] != ha["sha256"]
    (a / "model.safetensors").rename(a / "weights.bin")
    assert hash_tree(a)["sha256"] != ha["sha256"]


def test_hash_ignores_hidden_and_streams_large_files(tmp_path):
    d = write_hf_model(tmp_path / "m")
    before = hash_tree(d)["sha256"]
    (d / ".cache").mkdir()
    (d / ".cache" / "x").write_text("hub metadata")
    (d / ".gitattributes").write_text("*")
    assert hash_tree(d)["sha256"] == before
    big = d / "big.bin"
    big.write_bytes(os.urandom(CHUNK * 2 + 17))
    import hashlib

    assert sha256_file(big) == hashlib.sha256(big.read_bytes()).hexdigest()


def test_model_fingerprint_local_hub_and_missing(tmp_path):
    d = write_hf_model(tmp_path / "m")
    fp = model_fingerprint(str(d))
    assert fp["sha256"] and fp["local_path"] == str(d) and fp["file_count"] == 6
    hub = model_fingerprint("Qwen/Qwen3-VL-2B-Instruct")
    assert hub["sha256"] is None and hub["note"] == "hub id, not hashed"
    with pytest.raises(InputError, match="does not exist"):
        model_fingerprint(str(tmp_path / "nope"))


def test_collect_versions_reads_metadata_only():
    import subprocess
    import sys

    v = collect_versions()
    assert set(v) == {"qvl", "optimum-rbln", "rebel-compiler", "transformers", "torch"}
    assert v["optimum-rbln"] == NOT_INSTALLED or v["optimum-rbln"].startswith("0.")
    code = (
        "import sys; from qwenvl_rbln.artifacts.manifest import collect_versions; collect_versions(); "
        "print(sorted(set(sys.modules) & {'torch', 'transformers', 'optimum'}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "[]", proc.stderr


# ------------------------------------------------------------------------------------------- atomic dir


def test_atomic_output_dir_commits_only_on_success(tmp_path):
    target = tmp_path / "out"
    with atomic_output_dir(target) as staging:
        assert staging.parent == tmp_path and staging.name.startswith(".out.qvl-tmp-")
        (staging / "a.txt").write_text("new")
        assert not target.exists()
    assert (target / "a.txt").read_text() == "new"
    assert temp_entries(tmp_path) == []


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_atomic_output_dir_failure_leaves_old_untouched(tmp_path, exc):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    write_manifest(target, {"format": 1})  # an artifact (its manifest lists old.txt): --force may replace it
    with pytest.raises(type(exc)), atomic_output_dir(target, force=True) as staging:
        (staging / "half.txt").write_text("half")
        (tmp_path / f"{staging.name}.tmp").mkdir()  # a helper's own temp sibling (optimum-rbln save_pretrained)
        raise exc
    assert sorted(p.name for p in target.iterdir()) == ["old.txt", MANIFEST_NAME]
    assert temp_entries(tmp_path) == []


def test_existing_target_needs_force_and_force_replaces(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    write_manifest(target, {"format": 1})  # a manifest listing every file makes it an artifact
    with pytest.raises(InputError, match="already exists") as info, atomic_output_dir(target):
        pass
    assert info.value.exit_code == 2 and "--force" in info.value.one_line() and (target / "old.txt").exists()
    with atomic_output_dir(target, force=True) as staging:
        (staging / "new.txt").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]
    assert temp_entries(tmp_path) == []
    # an empty directory is not an artifact: no --force needed
    empty = tmp_path / "empty"
    empty.mkdir()
    with atomic_output_dir(empty) as staging:
        (staging / "x").write_text("x")
    assert (empty / "x").exists()
    (tmp_path / "file").write_text("f")
    with pytest.raises(InputError, match="not a directory"), atomic_output_dir(tmp_path / "file", force=True):
        pass


def test_stale_temp_dirs_of_dead_processes_are_cleaned(tmp_path):
    target = tmp_path / "out"
    dead = tmp_path / ".out.qvl-tmp-99999999-deadbeef"
    dead_export = tmp_path / ".out.qvl-tmp-99999999-deadbeef.export"
    alive = tmp_path / f".out.qvl-tmp-{os.getpid()}-cafe0000"
    other = tmp_path / ".other.qvl-tmp-99999999-deadbeef"
    for d in (dead, dead_export, alive, other):
        d.mkdir()
    with atomic_output_dir(target) as staging:
        (staging / "x").write_text("x")
    assert not dead.exists() and not dead_export.exists()
    assert alive.exists() and other.exists()  # a live writer's and another target's are left alone


# ------------------------------------------------------------------------------------------------- lock


def _hold_lock(target: str, ready, release) -> None:
    with output_lock(Path(target)):
        ready.set()
        release.wait(120)


def test_lock_second_writer_gets_busy_error_naming_the_pid(tmp_path):
    target = tmp_path / "out"
    ctx = mp.get_context("spawn" if os.name != "posix" else "fork")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_lock, args=(str(target), ready, release))
    proc.start()
    try:
        assert ready.wait(120)
        with pytest.raises(BusyError) as info, output_lock(target):
            pass
        assert info.value.exit_code == 6
        assert f"pid {proc.pid}" in info.value.message and str(target) in info.value.message
    finally:
        release.set()
        proc.join(120)
    with output_lock(target):  # released when the holder exits
        pass


def test_lock_held_in_same_process_is_busy(tmp_path):
    target = tmp_path / "out"
    with output_lock(target):
        with pytest.raises(BusyError, match=f"pid {os.getpid()}"), output_lock(target):
            pass
        assert lock_owner(target)["pid"] == os.getpid()
    assert lock_owner(target) is None


def test_loser_waits_for_the_owner_record_of_a_holder_that_just_took_the_lock(tmp_path):
    target = tmp_path / "out"
    lp = lock_path(target)
    lp.parent.mkdir(parents=True, exist_ok=True)
    holder = filelock.FileLock(str(lp), timeout=0)
    holder.acquire()
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": "now"}
    late = threading.Timer(0.3, lambda: lp.with_name(lp.name + ".owner").write_text(json.dumps(record)))
    late.start()
    try:
        with pytest.raises(BusyError) as info, output_lock(target):
            pass
        assert f"pid {os.getpid()}" in info.value.message, info.value.message
    finally:
        late.join(timeout=60)
        holder.release()


def test_a_dead_holders_stale_owner_record_is_not_named(tmp_path):
    target = tmp_path / "out"
    lp = lock_path(target)
    lp.parent.mkdir(parents=True, exist_ok=True)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, timeout=120
    )
    stale = {"pid": int(dead.stdout), "host": socket.gethostname(), "started": "long ago"}
    lp.with_name(lp.name + ".owner").write_text(json.dumps(stale))
    with output_lock(target):  # the lock is free: the stale record does not make it busy
        assert lock_owner(target)["pid"] == os.getpid()


def test_lock_files_live_under_qvl_home_not_beside_the_output(tmp_path):
    target = tmp_path / "out"
    with output_lock(target):
        assert not any("lock" in p.name for p in tmp_path.iterdir())
        assert lock_path(target).is_relative_to(Path(os.environ["QVL_HOME"]))
    assert lock_path(target) != lock_path(tmp_path / "other" / "out")


# ------------------------------------------------------------------------------------------------ cache


def _tiny_plan(tmp_path, **sets):
    model = write_hf_model(tmp_path / "model", TINY_CONFIG)
    return build_plan("cpu-tiny", [f"{k}={v}" for k, v in sets.items()], model=str(model))


def test_cache_key_ignores_runtime_keys_and_tracks_the_rest(tmp_path):
    plan = _tiny_plan(tmp_path)
    fp = model_fingerprint(plan.model_id)
    versions = collect_versions()
    key, why = cache_key(plan, fp, versions)
    assert key and why is None
    assert cache_key(plan, fp, versions)[0] == key
    runtime = build_plan(
        "cpu-tiny",
        [
            "rbln_config.create_runtimes=true",
            "placement.visual_device=1",
            "placement.device=0",
        ],
        model=plan.model_id,
    )
    assert cache_key(runtime, fp, versions)[0] == key
    other = build_plan("cpu-tiny", ["rbln_config.max_seq_len=2048"], model=plan.model_id)
    assert cache_key(other, fp, versions)[0] != key
    assert cache_key(plan, fp, {**versions, "transformers": "9.9.9"})[0] != key
    assert cache_key(plan, {**fp, "sha256": "0" * 64}, versions)[0] != key
    npu = build_plan("cpu-tiny", ["npu=RBLN-CR03"], model=plan.model_id)
    assert cache_key(npu, fp, versions)[0] != key
    hub_key, reason = cache_key(plan, {"id": "Qwen/x", "sha256": None}, versions)
    assert hub_key is None and "hub id" in reason


def test_cache_store_lookup_and_corruption(tmp_path):
    src = write_hf_model(tmp_path / "art")
    write_manifest(src, {"format": 1})
    cache = tmp_path / "cache"
    entry = cache_store(cache, "k1", src)
    assert (entry / "config.json").exists() and (entry / MANIFEST_NAME).exists()
    found, why = cache_lookup(cache, "k1")
    assert found == entry and why == "verified"
    assert cache_lookup(cache, "k2") == (None, "no entry")
    (entry / "model.safetensors").write_bytes(b"truncated")
    found, why = cache_lookup(cache, "k1")
    assert found is None and "model.safetensors" in why and not entry.exists()
    assert temp_entries(cache) == []


def test_a_cache_entry_with_an_extra_file_fails_verification_and_is_removed(tmp_path):
    """Mutation S07 (the manifest check ignoring extra files): a file the entry's manifest does not list would be
    copied into the next artifact, so the entry is refused and removed."""
    src = write_hf_model(tmp_path / "art")
    write_manifest(src, {"format": 1})
    cache = tmp_path / "cache"
    entry = cache_store(cache, "k1", src)
    assert cache_lookup(cache, "k1") == (entry, "verified")
    (entry / "stray.bin").write_bytes(b"not listed")
    found, why = cache_lookup(cache, "k1")
    assert found is None and why == "entry failed verification (stray.bin); removed", why
    assert not entry.exists() and temp_entries(cache) == []
    assert cache_lookup(cache, "k1") == (None, "no entry")


# ----------------------------------------------------------------------------------------------- layout


@pytest.mark.parametrize("preset", rbln_presets())
def test_resolved_from_rbln_config_matches_the_plan(preset):
    plan = build_plan(preset)
    resolved = resolved_from_rbln_config(rbln_config_json(plan, kv_blocks=0))
    assert resolved == plan.resolved.__class__(**{**plan.resolved.__dict__, "memory_budget": None})
    target = compile_target(rbln_config_json(plan))
    assert target["npu"] == "RBLN-CR13" and target["num_devices"] == 1 and target["visual_num_devices"] == 1


def test_a_quantized_masked_artifact_is_read_back_as_planned_not_as_bf16():
    sets = ['quantization={"weights":"int8","kv_caches":"fp8"}', "use_attention_mask=true"]
    plan = build_plan("rebel100-1npu", sets)
    cfg = rbln_config_json(plan, kv_blocks=0)
    cfg["quantization"] = {"format": "rbln", "weights": "int8", "activations": "fp16", "kv_caches": "fp8"}
    cfg["use_attention_mask"] = True  # as RBLNQuantizationConfig._prepare_for_serialization saves them
    resolved = resolved_from_rbln_config(cfg)
    assert resolved == plan.resolved.__class__(**{**plan.resolved.__dict__, "memory_budget": None})
    assert resolved.quantization["kv_caches"] == "fp8" and resolved.use_attention_mask
    with pytest.raises(InputError, match="quantization="):
        resolved_from_rbln_config({**cfg, "quantization": "int8"})


def test_layout_ok_for_a_real_layout(tmp_path):
    plan = build_plan("rebel100-1npu-batch4")
    root = write_artifact(tmp_path / "art", plan)
    kind, cfg = read_artifact_config(root)
    layout = check_layout(root, kind, cfg, None)
    assert kind == "rbln" and layout["ok"], layout
    assert {"prefill.rbln", "decoder_batch_4.rbln", "decoder_batch_2.rbln", "decoder_batch_1.rbln"} <= set(
        layout["expected"]
    )
    assert "visual/compiled_model.rbln" in layout["expected"]
    assert list(layout["graphs"]) == [
        "prefill",
        "decoder_batch_4",
        "decoder_batch_2",
        "decoder_batch_1",
        "visual/compiled_model",
    ]
    assert any("no qvl-manifest.json" in n for n in layout["notes"])


def test_layout_missing_unexpected_mismatch_and_modified(tmp_path):
    plan = build_plan("rebel100-1npu-batch4")
    root = write_artifact(tmp_path / "art", plan)
    write_manifest(root, {"format": 1})
    (root / "decoder_batch_2.rbln").unlink()
    (root / "decoder_batch_8.rbln").write_text("{}")
    (root / "visual" / "torch_artifacts.pth").write_bytes(b"x")  # truncated after compile
    kind, cfg = read_artifact_config(root)
    layout = check_layout(root, kind, cfg, read_manifest(root))
    assert not layout["ok"]
    assert layout["missing"] == ["decoder_batch_2.rbln"]
    assert layout["unexpected"] == ["decoder_batch_8.rbln"]
    assert layout["modified"] == ["visual/torch_artifacts.pth"]
    assert "decoder_batch_8.rbln" in layout["manifest"]["extra"]
    msg = describe_layout_problem(layout)
    assert "decoder_batch_2.rbln" in msg and "visual/torch_artifacts.pth" in msg
    cfg["decoder_batch_sizes"] = [4, 1]
    (root / "rbln_config.json").write_text(json.dumps(cfg))
    layout = check_layout(root, "rbln", cfg, None)
    assert any("do not match decoder_batch_sizes" in p for p in layout["problems"])


def test_read_artifact_config_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_artifact_config(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a compiled artifact"):
        read_artifact_config(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rbln_config.json").write_text("{not json")
    with pytest.raises(InputError, match="rbln_config.json: not valid JSON"):
        read_artifact_config(bad)
    (bad / "rbln_config.json").write_text('{"_meta": {}}')
    with pytest.raises(InputError, match="old-format"):
        read_artifact_config(bad)


def test_an_emulated_artifact_is_told_by_its_manifest_or_by_a_marked_graph(tmp_path):
    from qwenvl_rbln.artifacts.emulated import (
        FORMAT,
        emulated_graph_files,
        is_emulated_artifact,
        manifest_marks_emulated,
    )

    root = write_artifact(tmp_path / "art", build_plan("rebel100-1npu"))
    graphs = [info["file"] for info in graph_files(json.loads((root / RBLN_CONFIG_NAME).read_text())).values()]
    assert not is_emulated_artifact(root, None, graphs)  # a real compile's graphs, no manifest
    assert not is_emulated_artifact(root, {"files": {}}, graphs) and not manifest_marks_emulated({"emulated": "yes"})
    assert is_emulated_artifact(root, {"files": {}, "emulated": True}, graphs)  # the manifest's record alone
    header = json.dumps({"__metadata__": {"format": FORMAT, "emulated": "true"}}).encode()
    (root / "prefill.rbln").write_bytes(len(header).to_bytes(8, "little") + header)
    assert emulated_graph_files(root, [*graphs, "gone.rbln"]) == ["prefill.rbln"]
    assert is_emulated_artifact(root, None, graphs)  # the graph-file marker alone


def test_placement_from_artifact(tmp_path):
    plan = build_plan("rebel100-2npu-batch4")
    cfg = rbln_config_json(plan)
    assert placement_from_artifact(cfg, {"placement": plan.placement}) == {
        "device": 0,
        "visual_device": 1,
        "source": MANIFEST_NAME,
    }
    default = placement_from_artifact(cfg, None)
    assert (default["device"], default["visual_device"]) == (0, 0)
    cfg["_compile_cfgs"][0]["num_devices"] = 2
    for c in cfg["_compile_cfgs"]:
        c["num_devices"] = 2
    assert placement_from_artifact(cfg, None)["device"] == [0, 1]


def _fake_manifest(d):
    (d / "precious.txt").write_text("keep")
    (d / MANIFEST_NAME).write_text("{}")


def _manifest_then_user_file(d):
    write_manifest(d, {"format": 1})
    (d / "notes.txt").write_text("mine")  # written after the compile: not in the manifest


def _optimum_artifact_plus_user_file(d):
    (d / RBLN_CONFIG_NAME).write_text(json.dumps({"cls_name": "RBLNQwen3VLForConditionalGeneration"}))
    (d / "prefill.rbln").write_bytes(b"g")
    (d / ".hidden-notes").write_text("mine")


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        (_fake_manifest, "not a compiled artifact"),
        (_manifest_then_user_file, "does not list (notes.txt)"),
        (_optimum_artifact_plus_user_file, "other files (.hidden-notes)"),
    ],
)
def test_force_replaces_only_a_real_artifact(tmp_path, setup, needle):
    """A manifest-named file alone, or files the compile did not write, make --force refuse (audit: `{}` as
    qvl-manifest.json beside precious.txt once let --force delete precious.txt)."""
    target = tmp_path / "out"
    target.mkdir()
    setup(target)
    before = sorted(p.name for p in target.iterdir())
    with pytest.raises(InputError) as info:
        check_target(target, force=True)
    assert needle in info.value.one_line() and "nothing was touched" in info.value.one_line()
    assert sorted(p.name for p in target.iterdir()) == before


def test_force_replaces_an_optimum_rbln_artifact_without_a_qvl_manifest_and_refuses_a_symlink(tmp_path):
    art = tmp_path / "art"
    (art / "visual").mkdir(parents=True)
    (art / RBLN_CONFIG_NAME).write_text(json.dumps({"cls_name": "RBLNQwen3VLForConditionalGeneration"}))
    for name in ("prefill.rbln", "visual/compiled_model.rbln", "torch_artifacts.pth", "merges.txt", "config.json"):
        (art / name).write_bytes(b"x")
    check_target(art, force=True)  # no error: it may be replaced
    link = tmp_path / "link"
    link.symlink_to(art)
    with pytest.raises(InputError, match="symlink"):
        check_target(link, force=True)
