"""`qvl compile` for real (compile_job.run_compile): safety, cache, manifest.

The tiny preset (cpu-tiny-rbln) compiles with optimum-rbln 0.12's real code on qvl's CPU emulator of rebel
(``--emulate``; emulated: no NPU compile ran), its ``from_pretrained`` calls recorded (tests/emulated_rbln.py).
The 2B presets' hub id and the failures only a real NPU stack or a failing disk produce use the injected fakes of
tests/fakes_rbln.py; each such test says why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from qwenvl_rbln.artifacts.layout import check_layout, compile_target, read_artifact_config, resolved_from_rbln_config
from qwenvl_rbln.artifacts.locks import lock_path
from qwenvl_rbln.artifacts.manifest import (
    MANIFEST_NAME,
    TORCH_CONFIG_NAME,
    model_fingerprint,
    read_manifest,
    verify_manifest,
    write_manifest,
)
from qwenvl_rbln.errors import DoesNotFit
from qwenvl_rbln.jobs.compile_job import run_compile
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import TINY_CONFIG, install, make_auto, run_main, temp_entries, write_hf_model
from tests.helpers_cli import REPO, Result

TINY = "cpu-tiny-rbln"


@pytest.fixture
def model_dir(tmp_path):
    return write_hf_model(tmp_path / "Qwen3-VL-2B-Instruct")


def _compile_argv(preset, model, out, cache, *extra):
    return ["compile", "--preset", preset, "--model", str(model), "-o", str(out), "--cache-dir", str(cache), *extra]


# two ViT buckets (the 4096 one would double each emulated compile here, and every compile in these tests is real)
TINY_SETS = ["visual.max_seq_len=[256,1024]"]


def _tiny_argv(model, out, cache, *extra):
    """`qvl compile --preset cpu-tiny-rbln --emulate` with TINY_SETS."""
    sets = [a for s in TINY_SETS for a in ("--set", s)]
    return [*_compile_argv(TINY, model, out, cache, "--emulate", *sets), *extra]


HIDE_OPTIMUM_RBLN = "import sys; sys.modules['optimum.rbln'] = None; sys.modules['rebel'] = None; "


def test_missing_optimum_rbln_exit_3_one_line_nothing_created(tmp_path):
    """optimum-rbln is installed in the dev venv (the emulator runs it): its absence is simulated."""
    out = tmp_path / "sub" / "out"
    code = HIDE_OPTIMUM_RBLN + "from qwenvl_rbln.entry import main; sys.argv[0] = 'qvl'; main()"
    argv = [sys.executable, "-c", code, "compile", "--preset", "rebel100-1npu", "-o", str(out)]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    r = Result(proc.returncode, proc.stdout, proc.stderr)
    assert r.exit_code == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qvl: error: optimum-rbln")
    assert "pip install optimum-rbln==0.12.0" in lines[0] and "rebel-compiler" in lines[0]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "sub").exists()


def test_cache_miss_then_hit_and_the_manifest(tmp_path, rbln_calls, capsys, tiny_model):
    plan = build_plan(TINY, TINY_SETS, model=str(tiny_model))
    auto = rbln_calls
    out, cache = tmp_path / "out", tmp_path / "cache"
    code, stdout, stderr = run_main(_tiny_argv(tiny_model, out, cache, "--json"), capsys)
    assert code == 0, stderr
    result = json.loads(stdout)["result"]
    assert result["cache"] == "miss" and result["output_dir"] == str(out)
    assert len(auto.calls) == 1 and auto.calls[0]["rbln_config"] == plan.rbln_config
    assert "ViT buckets" in stderr and "prefill graph" in stderr and "saving" in stderr
    m = json.loads((out / MANIFEST_NAME).read_text())
    assert m["preset"]["name"] == TINY and m["preset"]["sha256"] == plan.preset_hash
    assert m["model"]["sha256"] == model_fingerprint(str(tiny_model))["sha256"]
    assert m["rbln_config"] == plan.rbln_config and m["npu"] == "RBLN-CR13"
    assert set(m["versions"]) == {"qvl", "optimum-rbln", "rebel-compiler", "transformers", "torch"}
    assert m["emulated"] is True and "emulated" in m["versions"]["rebel-compiler"]
    assert m["timings"]["total"] > 0 and "prefill graph" in m["timings"]
    assert "prefill.rbln" in m["files"] and "visual/compiled_model.rbln" in m["files"]
    # what optimum-rbln resolved (automatic KV blocks: the full count here) next to what the plan asked for (0)
    assert m["rbln_config"].get("kvcache_num_blocks", 0) == 0
    assert m["compiled"]["source"] == "rbln_config.json"
    assert m["compiled"]["kvcache_num_blocks"] == plan.resolved.num_full_blocks
    assert sorted(m["compiled"]["visual.max_seq_len"]) == plan.rbln_config["visual"]["max_seq_len"]
    assert verify_manifest(out, m)["ok"]
    assert (cache / result["cache_key"] / "prefill.rbln").exists()
    assert temp_entries(tmp_path) == []

    code, stdout, stderr = run_main(_tiny_argv(tiny_model, out, cache, "--force"), capsys)
    assert code == 0, stderr
    assert len(auto.calls) == 1  # the hit did not call from_pretrained
    assert "cache hit" in stderr
    m2 = json.loads((out / MANIFEST_NAME).read_text())
    assert m2["cache"]["status"] == "hit" and m2["files"] == m["files"]
    assert verify_manifest(out, m2)["ok"]

    # a runtime-only change (placement/device) is still a hit; a compile key change is a miss
    code, _, stderr = run_main(
        _tiny_argv(tiny_model, out, cache, "--force", "--set", "placement.visual_device=1"),
        capsys,
    )
    assert code == 0 and "cache hit" in stderr and len(auto.calls) == 1
    code, _, stderr = run_main(_tiny_argv(tiny_model, out, cache, "--force", "--no-cache"), capsys)
    assert code == 0 and len(auto.calls) == 2 and "cache off: --no-cache" in stderr


def test_hub_id_turns_the_cache_off_and_says_why(tmp_path, monkeypatch, capsys):
    # fakes: the 2B preset's hub id, not downloadable here (and far too large for the emulator)
    plan = build_plan("rebel100-1npu")
    auto = make_auto(plan)
    install(monkeypatch, auto)
    code, stdout, stderr = run_main(
        ["compile", "--preset", "rebel100-1npu", "-o", str(tmp_path / "o"), "--json"], capsys
    )
    assert code == 0, stderr
    result = json.loads(stdout)["result"]
    assert result["cache"] == "off" and "hub id" in result["cache_note"]
    assert auto.calls[0]["model_id"] == "Qwen/Qwen3-VL-2B-Instruct"  # passed through; qvl itself never downloads
    assert json.loads((tmp_path / "o" / MANIFEST_NAME).read_text())["model"]["note"] == "hub id, not hashed"


def test_existing_target_without_force_exit_2_untouched(tmp_path, rbln_calls, capsys, tiny_model):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, stderr = run_main(_tiny_argv(tiny_model, out, tmp_path / "c"), capsys)
    assert code == 2
    assert stderr.count("\n") == 1 and "--force" in stderr and "Traceback" not in stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and rbln_calls.calls == []


def test_a_dry_run_into_an_occupied_output_prints_its_plan_and_warns(tmp_path, capsys):
    """D3: a dry run compiles nothing, so an existing output directory no longer stops it (it exited 2 with 'pass
    --force to replace it'); it prints the plan and verdict, exits per the verdict, and warns once what a real
    compile would need. The real compile still refuses (test_existing_target_without_force_exit_2_untouched)."""
    art = tmp_path / "art"
    art.mkdir()
    write_manifest(art, {"format": 1})  # a qvl artifact: --force may replace it
    code, out, err = run_main(["compile", "--preset", "rebel100-1npu", "-o", str(art), "--dry-run"], capsys)
    assert code == 0, err
    assert "memory: fits" in out and "dry run: nothing was compiled" in out and "Traceback" not in err
    (warning,) = err.strip().splitlines()
    assert str(art) in warning and "a real compile would refuse it; pass --force to replace it, or -o DIR" in warning
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my files")
    argv = ["compile", "--preset", "rebel100-1npu", "-o", str(mine), "--dry-run", "--json"]
    code, out, err = run_main(argv, capsys)
    doc = json.loads(out)
    assert code == 0 and doc["dry_run"] is True and doc["memory"]["verdict"] == "fits", err
    (warning,) = doc["warnings"]
    assert "even with --force" in warning and "notes.txt" in warning and "-o DIR" in warning
    code, out, err = run_main([*argv[:-1], "--set", "batch_size=8", "--set", "decoder_batch_sizes=[8]"], capsys)
    assert code == 4 and "memory: does not fit" in out and "a real compile would refuse it" in err, err
    assert (mine / "notes.txt").read_text() == "my files" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize(("behavior", "exit_code"), [({"save_error": "disk full"}, 5), ({"save_interrupt": True}, 130)])
def test_failure_or_interrupt_mid_write_leaves_old_artifact(
    tmp_path, monkeypatch, capsys, model_dir, behavior, exit_code
):
    # fakes: a disk error or Ctrl-C half-way through optimum-rbln's save_pretrained copy is injected there
    plan = build_plan("rebel100-1npu", model=str(model_dir))
    install(monkeypatch, make_auto(plan, **behavior))
    out = tmp_path / "out"
    out.mkdir()
    (out / "prefill.rbln").write_text("old artifact")
    write_manifest(out, {"format": 1})
    code, _, stderr = run_main(_compile_argv("rebel100-1npu", model_dir, out, tmp_path / "c", "--force"), capsys)
    assert code == exit_code, stderr
    assert sorted(p.name for p in out.iterdir()) == ["prefill.rbln", MANIFEST_NAME]
    assert (out / "prefill.rbln").read_text() == "old artifact"
    assert temp_entries(tmp_path) == []
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
    assert stderr.strip().splitlines()[-1].startswith("qvl: ")


def test_planner_refusal_and_force(tmp_path, rbln_calls, capsys, tiny_model):
    plan = build_plan(TINY, TINY_SETS, model=str(tiny_model))
    plan.output_dir = str(tmp_path / "out")
    auto = rbln_calls
    memory = {
        "fits": False,
        "devices": [{"device": 0, "total_bytes": 150 << 30, "usable_bytes": 140 << 30, "fits": False}],
        "suggestions": [{"kind": "max_seq_len", "text": "x", "set": ["max_seq_len=32768"]}],
    }
    with pytest.raises(DoesNotFit) as info:
        run_compile(plan, memory, cache_dir=tmp_path / "c", heartbeat_s=0)
    assert "--set max_seq_len=32768" in info.value.one_line() and "--force" in info.value.one_line()
    assert not (tmp_path / "out").exists() and auto.calls == []
    result = run_compile(plan, memory, force=True, cache_dir=tmp_path / "c", heartbeat_s=0)
    assert result["cache"] == "miss" and len(auto.calls) == 1
    assert "compiling anyway" in capsys.readouterr().err
    # end to end: the real planner refuses batch 4 x 262144 with the ViT on the same card
    code, _, stderr = run_main(
        [
            "compile",
            "--preset",
            "rebel100-2npu-batch4",
            "--set",
            "placement.visual_device=0",
            "-o",
            str(tmp_path / "o2"),
        ],
        capsys,
    )
    assert code == 4 and "--set" in stderr and stderr.count("\n") == 1 and not (tmp_path / "o2").exists()


def test_torch_backend_compile_writes_the_same_manifest_and_config(tmp_path, capsys):
    model = write_hf_model(tmp_path / "tiny", TINY_CONFIG)
    out, cache = tmp_path / "out", tmp_path / "cache"
    code, stdout, stderr = run_main(_compile_argv("cpu-tiny", model, out, cache, "--json"), capsys)
    assert code == 0, stderr
    result = json.loads(stdout)["result"]
    assert result["backend"] == "torch" and result["cache"] == "miss"
    cfg = json.loads((out / TORCH_CONFIG_NAME).read_text())
    assert cfg["decoder_batch_sizes"] == [2, 1] and cfg["visual"]["max_seq_len"] == [4096, 1024, 256]
    assert [c["compiled_model_name"] for c in cfg["_compile_cfgs"]] == ["prefill", "decoder_batch_2", "decoder_batch_1"]
    assert compile_target(cfg)["npu"] == "RBLN-CR13"
    kind, read = read_artifact_config(out)
    assert kind == "torch" and check_layout(out, kind, read, read_manifest(out))["ok"]
    plan = build_plan("cpu-tiny", model=str(model))
    assert resolved_from_rbln_config(cfg) == plan.resolved
    code, _, stderr = run_main(_compile_argv("cpu-tiny", model, out, cache, "--force"), capsys)
    assert code == 0 and "cache hit" in stderr


def test_qvl_tiny_is_created_through_ensure_tiny_model(tmp_path, monkeypatch, capsys):
    from qwenvl_rbln.backends.tiny import model as tiny_model

    model = write_hf_model(tmp_path / "tiny", TINY_CONFIG)
    calls = []
    monkeypatch.setattr(tiny_model, "ensure_tiny_model", lambda path=None, **kw: calls.append(path) or model)
    code, _, stderr = run_main(["compile", "--preset", "cpu-tiny", "-o", str(tmp_path / "o"), "--no-cache"], capsys)
    assert code == 0, stderr
    assert calls == [None]
    assert (tmp_path / "o" / "model.safetensors").read_bytes() == (model / "model.safetensors").read_bytes()


# -------------------------------------------------------------------------------------- two processes

_SCRIPT = textwrap.dedent(
    """
    import sys
    import time
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from qwenvl_rbln.backends.emulator import rebel_api

    real_compile = rebel_api.compile_from_torch

    def held(*args, **kwargs):  # optimum-rbln's first graph compile waits here (killed by the test)
        Path({inside!r}).touch()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            time.sleep(0.05)
        return real_compile(*args, **kwargs)

    rebel_api.compile_from_torch = held
    sys.argv = ["qvl", "compile", "--preset", "cpu-tiny-rbln", "--emulate", "--model", {model!r}, "-o", {out!r},
                "--cache-dir", {cache!r}]
    from qwenvl_rbln import cli
    cli.main()
    """
)


def _spawn(tmp_path, model, out, inside):
    script = _SCRIPT.format(
        repo=str(REPO), model=str(model), out=str(out), cache=str(tmp_path / "cache"), inside=str(inside)
    )
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_concurrent_compiles_busy_then_sigterm_cleans_up(tmp_path, tiny_model, emulated, capsys):
    """A second compile of the same output while the first is inside optimum-rbln's real (emulated) compile."""
    out = tmp_path / "out"
    inside = tmp_path / "inside-compile"
    first = _spawn(tmp_path, tiny_model, out, inside)  # holds inside optimum-rbln's first graph compile
    try:
        owner = lock_path(out).with_name(lock_path(out).name + ".owner")
        deadline = time.monotonic() + 180  # a fresh interpreter imports torch, transformers and optimum-rbln
        while time.monotonic() < deadline and not inside.exists() and first.poll() is None:
            time.sleep(0.05)
        assert inside.exists(), first.stderr.read() if first.poll() is not None else "never reached the compile"
        assert owner.exists() and any(".export" in p.name for p in tmp_path.iterdir())
        argv = ["compile", "--preset", TINY, "--emulate", "--model", str(tiny_model), "-o", str(out)]
        code, _, err2 = run_main([*argv, "--cache-dir", str(tmp_path / "cache")], capsys)
        assert code == 6, err2
        assert f"pid {first.pid}" in err2 and str(out) in err2 and err2.count("qvl: error") == 1
        first.send_signal(signal.SIGTERM)
        _, err1 = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=60)
    assert first.returncode == 130, err1
    assert "nothing half-written" in err1
    assert not out.exists() and temp_entries(tmp_path) == []


def test_a_hub_id_in_the_local_hf_cache_is_hashed_and_cached(tmp_path, monkeypatch, capsys):
    """The shipped rbln presets name a hub id: when its snapshot is in the Hugging Face cache, qvl compiles from
    that directory, hashes it into the manifest and uses the compile cache (found offline, never downloaded)."""
    # fakes: a shipped 2B preset (its geometry is far too large for the emulator; the 2B weights are not here)
    from huggingface_hub import constants

    hub = tmp_path / "hf-cache"
    repo = hub / "models--Qwen--Qwen3-VL-2B-Instruct"
    snapshot = write_hf_model(repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    auto = make_auto(build_plan("rebel100-1npu"))
    install(monkeypatch, auto)
    argv = ["compile", "--preset", "rebel100-1npu", "-o", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]
    code, stdout, stderr = run_main([*argv, "--json"], capsys)
    assert code == 0, stderr
    assert json.loads(stdout)["result"]["cache"] == "miss"
    assert auto.calls[0]["model_id"] == str(snapshot)
    model = json.loads((tmp_path / "o" / MANIFEST_NAME).read_text())["model"]
    assert model["id"] == "Qwen/Qwen3-VL-2B-Instruct" and len(model["sha256"]) == 64
    assert model["snapshot"] == {"repo_id": "Qwen/Qwen3-VL-2B-Instruct", "revision": "0123abcd"}  # which snapshot
    code, stdout, stderr = run_main([*argv, "--force", "--json"], capsys)
    assert code == 0 and json.loads(stdout)["result"]["cache"] == "hit" and len(auto.calls) == 1
