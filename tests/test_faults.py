"""Fault injection for `qvl compile` and `qvl load-check`: kills, interrupts, full disks, unwritable
directories, racing compiles and artifacts edited after the fact.

In every case the rule is the same: an existing good artifact survives byte for byte (its sha256 tree is taken
before and compared after), nothing half-written is left where a loader would find it, and the message is
one line that says what happened. Both backends are exercised: the injected fake optimum-rbln
(``tests/fakes_rbln.py``) and the torch reference backend (``cpu-tiny`` on a small Hugging Face directory).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwenvl_rbln.artifacts import cache as artifact_cache
from qwenvl_rbln.artifacts import layout as artifact_layout
from qwenvl_rbln.artifacts import manifest as artifact_manifest
from qwenvl_rbln.artifacts import staging as artifact_staging
from qwenvl_rbln.artifacts.manifest import (
    MANIFEST_NAME,
    RBLN_CONFIG_NAME,
    TORCH_CONFIG_NAME,
    manifest_for_plan,
    read_manifest,
    sha256_file,
    verify_manifest,
    write_manifest,
)
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import TINY_CONFIG, install, make_auto, run_main, temp_entries, write_hf_model
from tests.helpers_cli import REPO, run_qvl


def assert_interrupted(line: str) -> None:
    assert line.startswith("qvl: ") and "interrupted" in line and "nothing half-written" in line, line


# ------------------------------------------------------------------------------------------------ helpers


def tree(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (hidden ones too): the artifact's exact bytes."""
    out = {}
    for path in sorted(Path(root).rglob("*")):
        if path.is_file():
            out[path.relative_to(root).as_posix()] = sha256_file(path)
    return out


def compile_argv(preset: str, model: Path, out: Path, cache: Path, *extra: str) -> list[str]:
    return ["compile", "--preset", preset, "--model", str(model), "-o", str(out), "--cache-dir", str(cache), *extra]


def one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("qvl: ")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    return lines[0]


@pytest.fixture
def rbln_model(tmp_path):
    return write_hf_model(tmp_path / "Qwen3-VL-2B-Instruct")


@pytest.fixture
def tiny_model(tmp_path):
    return write_hf_model(tmp_path / "tiny", TINY_CONFIG)


@pytest.fixture
def rbln_good(tmp_path, monkeypatch, capsys, rbln_model):
    """A good artifact compiled through the fake optimum-rbln: (out, its tree, the plan)."""
    plan = build_plan("rebel100-1npu", model=str(rbln_model))
    install(monkeypatch, make_auto(plan))
    out = tmp_path / "out"
    code, _, err = run_main(compile_argv("rebel100-1npu", rbln_model, out, tmp_path / "cache", "--no-cache"), capsys)
    assert code == 0, err
    return out, tree(out), plan


@pytest.fixture
def torch_good(tmp_path, capsys, tiny_model):
    out = tmp_path / "out"
    code, _, err = run_main(compile_argv("cpu-tiny", tiny_model, out, tmp_path / "cache", "--no-cache"), capsys)
    assert code == 0, err
    return out, tree(out)


# ------------------------------------------------------------------------- SIGKILL: nothing can clean up

_KILL_SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from qwenvl_rbln.artifacts import manifest as artifact_manifest
    from qwenvl_rbln.planning.plan import build_plan
    from tests import fakes_rbln

    phase, ready = {phase!r}, Path({ready!r})

    def stall(where):
        ready.write_text(where)
        time.sleep(120)  # SIGKILL arrives here

    if phase == "save":  # the fake sleeps inside save_pretrained, half-way through its copy
        plan = build_plan("rebel100-1npu", model={model!r})
        auto = fakes_rbln.make_auto(plan)
        real_save = auto.save_pretrained
        def save(self, d):
            Path(d + ".tmp").mkdir(parents=True, exist_ok=True)
            (Path(d + ".tmp") / "prefill.rbln").write_text("half")
            stall("save")
        auto.save_pretrained = save
        fakes_rbln.install_plain(auto)
    elif phase == "manifest":  # the manifest's temp file is written, the rename never happens
        plan = build_plan("rebel100-1npu", model={model!r})
        fakes_rbln.install_plain(fakes_rbln.make_auto(plan))
        real_write = artifact_manifest.write_json_atomic
        def write_json(path, data):
            if Path(path).name != artifact_manifest.MANIFEST_NAME:
                return real_write(path, data)
            Path(path).with_name("." + Path(path).name + ".qvl-tmp-half").write_text("{{\\"files\\": ")
            stall("manifest")
        artifact_manifest.write_json_atomic = write_json
    elif phase == "copy":  # torch backend: the model copy stops after one file
        import shutil
        from qwenvl_rbln.backends import torch_ref_compile
        real_copy = shutil.copy2
        calls = []
        def copy2(src, dst, *a, **k):
            calls.append(src)
            if len(calls) == 2:
                Path(dst).write_bytes(b"half")
                stall("copy")
            return real_copy(src, dst, *a, **k)
        torch_ref_compile.shutil.copy2 = copy2
    sys.argv = ["qvl", "compile", "--preset", {preset!r}, "--model", {model!r}, "-o", {out!r}, "--force",
                "--cache-dir", {cache!r}]
    from qwenvl_rbln import cli
    cli.main()
    """
)


def _compile_paused_at(tmp_path: Path, phase: str, model: Path, preset: str, out: Path) -> subprocess.Popen:
    """A compile subprocess (``_KILL_SCRIPT``) that has reached ``phase`` and waits there to be signalled."""
    ready = tmp_path / "ready"
    script = _KILL_SCRIPT.format(
        repo=str(REPO),
        phase=phase,
        ready=str(ready),
        model=str(model),
        preset=preset,
        out=str(out),
        cache=str(tmp_path / "cache"),
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    deadline = time.monotonic() + 300
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if not ready.exists():
        if proc.poll() is None:
            proc.kill()
        pytest.fail(f"never reached the pause (exit {proc.poll()}): {proc.communicate(timeout=60)}")
    return proc


@pytest.mark.parametrize(("phase", "backend"), [("save", "rbln"), ("manifest", "rbln"), ("copy", "torch")])
def test_sigkill_mid_write_keeps_the_old_artifact_and_the_next_run_cleans_up(
    tmp_path, monkeypatch, capsys, phase, backend, request
):
    out, before, _ = (
        (*request.getfixturevalue("torch_good"), None) if backend == "torch" else request.getfixturevalue("rbln_good")
    )
    model = tmp_path / ("tiny" if backend == "torch" else "Qwen3-VL-2B-Instruct")
    preset = "cpu-tiny" if backend == "torch" else "rebel100-1npu"
    proc = _compile_paused_at(tmp_path, phase, model, preset, out)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL

    # the good artifact is untouched, byte for byte, and still passes load-check
    assert tree(out) == before
    leftovers = temp_entries(tmp_path)
    assert leftovers, "the kill should have left a staging directory behind"
    assert all(name.startswith(".out.qvl-") for name in leftovers), leftovers
    code, _, err = run_main(["load-check", str(out), "--no-runtime"], capsys)
    assert code == 0, err

    # the next compile is not blocked by the dead process's lock and removes its leftovers
    if backend == "rbln":
        install(monkeypatch, make_auto(build_plan("rebel100-1npu", model=str(model))))
    code, _, err = run_main(compile_argv(preset, model, out, tmp_path / "cache", "--force", "--no-cache"), capsys)
    assert code == 0, err
    assert temp_entries(tmp_path) == []
    assert verify_manifest(out, read_manifest(out))["ok"]


# ------------------------------------------------------------------- KeyboardInterrupt (Ctrl-C) and SIGTERM


def _interrupt_manifest(monkeypatch):
    real = artifact_manifest.write_json_atomic

    def write_json(path, data):
        if Path(path).name == MANIFEST_NAME:
            Path(path).write_text('{"files": {', encoding="utf-8")  # half a manifest in the staging dir
            raise KeyboardInterrupt
        return real(path, data)

    monkeypatch.setattr(artifact_manifest, "write_json_atomic", write_json)


def _interrupt_torch_copy(monkeypatch):
    from qwenvl_rbln.backends import torch_ref_compile

    real, calls = shutil.copy2, []

    def copy2(src, dst, *a, **k):
        calls.append(src)
        if len(calls) == 3:
            Path(dst).write_bytes(b"half")
            raise KeyboardInterrupt
        return real(src, dst, *a, **k)

    monkeypatch.setattr(torch_ref_compile.shutil, "copy2", copy2)


def _interrupt_the_final_rename(monkeypatch):
    """Ctrl-C between moving the old artifact aside and renaming the new one in: the old one is put back."""
    real = os.rename

    def rename(src, dst):
        if ".qvl-tmp-" in str(src) and ".qvl-" not in Path(dst).name:
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(artifact_staging.os, "rename", rename)


@pytest.mark.parametrize(
    ("inject", "backend"),
    [
        (_interrupt_manifest, "rbln"),
        (_interrupt_manifest, "torch"),
        (_interrupt_torch_copy, "torch"),
        (_interrupt_the_final_rename, "rbln"),
        (_interrupt_the_final_rename, "torch"),
    ],
)
def test_ctrl_c_mid_compile_or_mid_manifest_exit_130_nothing_half_written(
    tmp_path, monkeypatch, capsys, inject, backend, request
):
    good = request.getfixturevalue("torch_good" if backend == "torch" else "rbln_good")
    out, before = good[0], good[1]
    model = tmp_path / ("tiny" if backend == "torch" else "Qwen3-VL-2B-Instruct")
    preset = "cpu-tiny" if backend == "torch" else "rebel100-1npu"
    inject(monkeypatch)
    code, stdout, err = run_main(compile_argv(preset, model, out, tmp_path / "cache", "--force"), capsys)
    assert code == 130, err
    assert_interrupted(one_error_line(err))
    assert stdout == ""
    assert tree(out) == before
    assert temp_entries(tmp_path) == []
    assert not (tmp_path / "cache").exists() or not [
        p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")
    ]
    monkeypatch.undo()
    if backend == "rbln":
        install(monkeypatch, make_auto(build_plan(preset, model=str(model))))
    code, _, err = run_main(compile_argv(preset, model, out, tmp_path / "cache", "--force"), capsys)
    assert code == 0, err  # the lock was released


def test_sigterm_mid_torch_copy_exit_130_and_old_artifact_kept(tmp_path, torch_good):
    out, before = torch_good
    proc = _compile_paused_at(tmp_path, "copy", tmp_path / "tiny", "cpu-tiny", out)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert_interrupted(one_error_line(err))
    assert tree(out) == before and temp_entries(tmp_path) == []


def test_ctrl_c_in_read_only_commands_exit_130_one_line(tmp_path, monkeypatch, capsys, torch_good):
    from qwenvl_rbln.vision import media

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    out = torch_good[0]
    png = tmp_path / "a.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n")
    monkeypatch.setattr(media, "probe_image", interrupt)
    code, _, err = run_main(["bucket-plan", str(png)], capsys)
    assert code == 130 and "interrupted" in one_error_line(err)
    monkeypatch.setattr(artifact_layout, "verify_manifest", interrupt)
    code, _, err = run_main(["load-check", str(out), "--no-runtime"], capsys)
    assert code == 130 and "interrupted" in one_error_line(err)
    assert tree(out) == torch_good[1]


# ------------------------------------------------------------------------------------------ a full disk

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _full_disk_in_copy(monkeypatch):
    from qwenvl_rbln.backends import torch_ref_compile

    real, calls = shutil.copy2, []

    def copy2(src, dst, *a, **k):
        calls.append(src)
        if len(calls) == 2:  # as the real copy reports it: source in filename, destination in filename2
            Path(dst).write_bytes(b"half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src), None, str(dst))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(torch_ref_compile.shutil, "copy2", copy2)


def _full_disk_in_manifest(monkeypatch):
    real = artifact_manifest.write_json_atomic

    def write_json(path, data):
        if Path(path).name == MANIFEST_NAME:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, data)

    monkeypatch.setattr(artifact_manifest, "write_json_atomic", write_json)


@pytest.mark.parametrize(
    ("inject", "backend", "code"),
    [
        (_full_disk_in_copy, "torch", 5),
        (_full_disk_in_manifest, "torch", 5),
        (_full_disk_in_manifest, "rbln", 5),
        ("save_error", "rbln", 5),
    ],
)
def test_full_disk_one_line_error_and_old_artifact_unchanged(
    tmp_path, monkeypatch, capsys, inject, backend, code, request
):
    good = request.getfixturevalue("torch_good" if backend == "torch" else "rbln_good")
    out, before = good[0], good[1]
    model = tmp_path / ("tiny" if backend == "torch" else "Qwen3-VL-2B-Instruct")
    preset = "cpu-tiny" if backend == "torch" else "rebel100-1npu"
    if inject == "save_error":  # optimum-rbln's own save_pretrained hits the full disk
        install(monkeypatch, make_auto(good[2], save_error=f"[Errno 28] {os.strerror(errno.ENOSPC)}"))
    else:
        inject(monkeypatch)
    got, _, err = run_main(compile_argv(preset, model, out, tmp_path / "cache", "--force"), capsys)
    assert got == code, err
    line = one_error_line(err)
    assert "No space left on device" in line, line
    assert tree(out) == before and temp_entries(tmp_path) == []


def test_full_disk_in_the_cache_is_a_warning_not_a_failure(tmp_path, monkeypatch, capsys, tiny_model):
    real = shutil.copy2

    def copy2(src, dst, *a, **k):
        if "cache" in Path(dst).parts:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(artifact_cache.shutil, "copy2", copy2)
    out = tmp_path / "out"
    code, _, err = run_main(compile_argv("cpu-tiny", tiny_model, out, tmp_path / "cache"), capsys)
    assert code == 0, err
    assert "could not store the artifact in the compile cache" in err and "No space left on device" in err
    assert verify_manifest(out, read_manifest(out))["ok"]
    assert temp_entries(tmp_path) == [] and not [
        p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")
    ]


# ------------------------------------------------------------------------------ an unwritable output path


def _unwritable_parent(tmp_path: Path) -> Path:
    """A directory qvl cannot create entries in: chmod 0o555, or, as root (where chmod stops nothing), /sys."""
    if os.geteuid() != 0:
        parent = tmp_path / "ro"
        parent.mkdir()
        parent.chmod(0o555)
        return parent
    probe = Path("/sys") / f"qvl-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except PermissionError:
        return Path("/sys")
    except OSError:
        pass
    else:
        probe.rmdir()
    pytest.skip("running as root, where chmod 0o555 does not stop writes, and /sys is writable here")


def test_read_only_output_parent_is_a_clear_error(tmp_path, capsys, tiny_model):
    parent = _unwritable_parent(tmp_path)
    out = parent / "qvl-out-test"
    try:
        code, _, err = run_main(compile_argv("cpu-tiny", tiny_model, out, tmp_path / "cache"), capsys)
    finally:
        if parent.parent == tmp_path:
            parent.chmod(0o755)
    assert code == 2, err
    line = one_error_line(err)
    assert str(parent) in line and ("Permission denied" in line or "not permitted" in line), line
    assert "fix:" in line and "-o" in line
    assert not out.exists()


def test_read_only_parent_keeps_the_existing_artifact(tmp_path, capsys, torch_good):
    if os.geteuid() == 0:
        pytest.skip("running as root: chmod 0o555 does not stop root from renaming in the directory")
    out, before = torch_good
    tmp_path.chmod(0o555)
    try:
        code, _, err = run_main(compile_argv("cpu-tiny", tmp_path / "tiny", out, tmp_path / "cache", "--force"), capsys)
    finally:
        tmp_path.chmod(0o755)
    assert code == 2, err
    assert str(tmp_path) in one_error_line(err)
    assert tree(out) == before


def test_output_path_below_a_file_is_a_clear_error(tmp_path, capsys, tiny_model):
    """Works for root too: no permission bit can make a regular file hold a directory."""
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    for out in (blocker / "out", blocker / "sub" / "out"):
        code, _, err = run_main(compile_argv("cpu-tiny", tiny_model, out, tmp_path / "cache"), capsys)
        assert code == 2, err
        line = one_error_line(err)
        assert str(blocker) in line and "-o" in line, line
    assert blocker.read_text() == "not a directory"
    code, _, err = run_main(compile_argv("cpu-tiny", tiny_model, blocker, tmp_path / "cache"), capsys)
    assert code == 2 and "not a directory" in one_error_line(err)


def test_unreadable_model_file_is_named_as_a_read_not_a_write(tmp_path, monkeypatch, capsys, torch_good):
    """An OSError on the model side says 'cannot read' and names the model file, not the output directory."""
    from qwenvl_rbln.backends import torch_ref_compile

    out, before = torch_good
    real = shutil.copy2

    def copy2(src, dst, *a, **k):
        if Path(src).name == "model.safetensors":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(src))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(torch_ref_compile.shutil, "copy2", copy2)
    code, _, err = run_main(compile_argv("cpu-tiny", tmp_path / "tiny", out, tmp_path / "cache", "--force"), capsys)
    assert code == 2, err
    line = one_error_line(err)
    assert "cannot read" in line and str(tmp_path / "tiny" / "model.safetensors") in line, line
    assert tree(out) == before and temp_entries(tmp_path) == []


# ---------------------------------------------------------------------------- two compiles racing for one dir

_RACE_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {repo!r})
    from qwenvl_rbln.planning.plan import build_plan
    from tests import fakes_rbln
    plan = build_plan("rebel100-1npu", model={model!r})
    fakes_rbln.install_plain(fakes_rbln.make_auto(plan, wait_for_file={go!r}))
    sys.argv = ["qvl", "compile", "--preset", "rebel100-1npu", "--model", {model!r}, "-o", {out!r}, "--no-cache"]
    from qwenvl_rbln import cli
    cli.main()
    """
)


def test_two_compiles_racing_one_wins_the_other_exits_6_naming_the_holder(tmp_path, rbln_model, capsys):
    out = tmp_path / "out"
    go = tmp_path / "go"  # the winner's export waits for it: the loser always meets a held lock
    script = _RACE_SCRIPT.format(repo=str(REPO), model=str(rbln_model), out=str(out), go=str(go))
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    deadline = time.monotonic() + 120
    while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)  # wait for the condition (one of them has finished), not for a fixed time
    go.touch()
    results = [(p.pid, *p.communicate(timeout=120), p.returncode) for p in procs]
    codes = sorted(r[3] for r in results)
    assert codes == [0, 6], [(r[3], r[2][-500:]) for r in results]
    (winner,) = [r for r in results if r[3] == 0]
    (loser,) = [r for r in results if r[3] == 6]
    line = one_error_line(loser[2])
    assert f"pid {winner[0]}" in line and str(out) in line and "fix:" in line, line
    assert verify_manifest(out, read_manifest(out))["ok"]
    assert temp_entries(tmp_path) == []
    assert not [p.name for p in tmp_path.iterdir() if "lock" in p.name]  # the lock lives under $QVL_HOME
    code, _, err = run_main(["load-check", str(out), "--no-runtime"], capsys)
    assert code == 0, err


# ------------------------------------------------------------------------- artifacts edited after compile


def _edit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, same size: only the hash can tell
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 3)])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


@pytest.mark.parametrize("damage", [_edit, _truncate, _empty])
@pytest.mark.parametrize(
    ("backend", "victim"),
    [
        ("rbln", "prefill.rbln"),
        ("rbln", "visual/compiled_model.rbln"),
        ("rbln", "torch_artifacts.pth"),
        ("torch", "model.safetensors"),
        ("torch", "tokenizer.json"),
    ],
)
def test_files_changed_after_compile_are_named_by_load_check(damage, backend, victim, request):
    out = request.getfixturevalue("torch_good" if backend == "torch" else "rbln_good")[0]
    damage(out / victim)
    r = run_qvl("load-check", str(out), "--no-runtime", timeout=120)
    assert r.exit_code == 2, r.stdout + r.stderr
    line = one_error_line(r.stderr)
    assert victim in line and "changed after compile" in line, line
    assert "fix:" in line


def test_manifest_itself_truncated_or_deleted(rbln_good, capsys):
    out = rbln_good[0]
    manifest = out / MANIFEST_NAME
    text = manifest.read_text()
    manifest.write_text(text[: len(text) // 2])
    code, _, err = run_main(["load-check", str(out), "--no-runtime"], capsys)
    assert code == 2 and MANIFEST_NAME in one_error_line(err)
    manifest.unlink()  # an rbln artifact without a manifest still loads: load-check says edits are undetectable
    code, stdout, err = run_main(["load-check", str(out), "--no-runtime", "--json"], capsys)
    assert code == 0, err
    assert any("cannot be detected" in n for n in json.loads(stdout)["layout"]["notes"])


def test_a_file_added_after_compile_is_listed_not_fatal(torch_good, capsys):
    """Loaders ignore unknown files, so an added file is listed in the report, not an error."""
    out = torch_good[0]
    (out / "notes.txt").write_text("mine")
    code, stdout, err = run_main(["load-check", str(out), "--no-runtime", "--json"], capsys)
    assert code == 0, err
    assert json.loads(stdout)["layout"]["manifest"]["extra"] == ["notes.txt"]


def test_a_graph_added_after_compile_is_an_error(rbln_good, capsys):
    rbln_out = rbln_good[0]
    (rbln_out / "decoder_batch_8.rbln").write_text("{}")
    code, _, err = run_main(["load-check", str(rbln_out), "--no-runtime"], capsys)
    assert code == 2 and "unexpected decoder_batch_8.rbln" in one_error_line(err)


def test_symlink_loops_in_a_model_or_an_artifact_end_in_bounded_time(tmp_path, torch_good):
    """Two links to '.' make 2^40 paths for a walk that follows links; each real directory is walked once."""
    out = torch_good[0]
    model = tmp_path / "tiny"
    for d in (out, model):
        (d / "loop_a").symlink_to(".")
        (d / "loop_b").symlink_to(".")
    r = run_qvl("load-check", str(out), "--no-runtime", timeout=300)
    assert r.exit_code == 0, r.stderr
    r = run_qvl(
        "compile",
        "--preset",
        "cpu-tiny",
        "--model",
        str(model),
        "-o",
        str(tmp_path / "out2"),
        "--no-cache",
        timeout=300,
    )
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "out2" / "model.safetensors").is_file()


# ----------------------------------------------------------------- hostile JSON in the artifact's own files

_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False), st.text(max_size=10)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
_manifest_files = st.dictionaries(
    st.one_of(
        st.sampled_from(
            ["config.json", "model.safetensors", "../outside.bin", "/etc/hostname", "a/../../b", "", ".", "x" * 300]
        ),
        st.text(max_size=12),
    ),
    st.one_of(_json, st.fixed_dictionaries({"sha256": st.text(max_size=64), "size": _json})),
    max_size=4,
)


_SCALE = int(os.environ.get("QVL_PROPERTY_SCALE", "1"))
_RBLN_KEYS = [
    "batch_size",
    "max_seq_len",
    "kvcache_partition_len",
    "kvcache_block_size",
    "attn_impl",
    "decoder_batch_sizes",
    "phases",
    "_compile_cfgs",
    "visual",
    "cls_name",
    "prefill_chunk_size",
    "kvcache_num_blocks",
    "compiled_model_name",
    "npu",
    "num_devices",
    "max_seq_len",
    "files",
    "placement",
    "weight_map",
    "text_config",
    "vision_config",
    "model_type",
    "hidden_size",
    "num_attention_heads",
]
_edits = st.lists(
    st.tuples(
        st.lists(st.sampled_from(_RBLN_KEYS), min_size=1, max_size=3),
        st.one_of(_json, st.sampled_from(["../../etc/hostname", "/etc/hostname", "a/../../b"])),
    ),
    min_size=1,
    max_size=4,
)


def _apply(doc, edits):
    """Set each dotted path in a JSON document (creating mappings; into list items as their first element)."""
    for keys, value in edits:
        node = doc
        for key in keys[:-1]:
            child = node.get(key) if isinstance(node, dict) else None
            if isinstance(child, list) and child and isinstance(child[0], dict):
                child = child[0]
            if not isinstance(child, dict):
                child = {}
                if isinstance(node, dict):
                    node[key] = child
            node = child
        if isinstance(node, dict):
            node[keys[-1]] = value
    return doc


@settings(max_examples=80 * _SCALE, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(["torch", "rbln"]),
    name=st.sampled_from(
        [
            MANIFEST_NAME,
            TORCH_CONFIG_NAME,
            RBLN_CONFIG_NAME,
            "config.json",
            "model.safetensors.index.json",
        ]
    ),
    replace=st.one_of(st.none(), _json, st.builds(lambda f: {"format": 1, "files": f}, _manifest_files)),
    edits=_edits,
)
def test_load_check_on_hostile_artifact_json_is_a_report_or_a_clean_error(pristine, kind, name, replace, edits):
    """Whatever an artifact's own JSON files hold, load-check answers with its report and one clean error."""
    from qwenvl_rbln.errors import QvlError
    from qwenvl_rbln.jobs.load_check import run_load_check

    out = pristine[kind]
    path = out / name
    original = path.read_bytes() if path.exists() else None
    if replace is None and original is not None:
        try:
            content = _apply(json.loads(original), edits)
        except ValueError:
            content = None
    else:
        content = replace
    path.write_text(json.dumps(content), encoding="utf-8")
    try:
        report, error = run_load_check(out, no_runtime=True)
        json.dumps(report, default=str)
        if error is not None:
            assert isinstance(error, QvlError) and error.hint and "\n" not in error.one_line()
    except QvlError as exc:
        assert exc.hint and "\n" not in exc.one_line()
    finally:
        if original is None:
            path.unlink()
        else:
            path.write_bytes(original)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A torch artifact and an rbln one (the fake's real layout) for the test above; each example restores."""
    from qwenvl_rbln.jobs.compile_job import run_compile
    from qwenvl_rbln.memory.planner import estimate_plan
    from tests.fakes_rbln import write_artifact

    root = tmp_path_factory.mktemp("pristine")
    model = write_hf_model(root / "tiny", TINY_CONFIG)
    plan = build_plan("cpu-tiny", model=str(model), output_dir=str(root / "torch"))
    run_compile(plan, estimate_plan(plan), use_cache=False, heartbeat_s=0)
    rplan = build_plan("rebel100-1npu-batch4")
    write_artifact(root / "rbln", rplan)
    manifest = manifest_for_plan(rplan, model={"id": "x"}, versions={}, cache_key=None)
    write_manifest(root / "rbln", manifest)
    return {"torch": root / "torch", "rbln": root / "rbln"}


@pytest.mark.parametrize("where", ["user-files", "cwd", "home"])
def test_force_never_replaces_a_directory_that_is_not_an_artifact(where, tmp_path, monkeypatch, capsys, tiny_model):
    """`-o precious --force`, `-o . --force` and `-o ~ --force` once replaced the directory wholesale; --force
    replaces a compiled artifact and nothing else (not even an artifact that is the working dir or home)."""
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.txt").write_text("keep me")
    (precious / "sub").mkdir()
    if where != "user-files":  # looks like an artifact, but it is where the user stands / lives
        (precious / MANIFEST_NAME).write_text("{}")
    monkeypatch.chdir(precious if where == "cwd" else tmp_path)
    if where == "home":
        monkeypatch.setenv("HOME", str(precious))
    out = {"user-files": "precious", "cwd": ".", "home": "~"}[where]
    before = sorted(p.name for p in precious.iterdir())
    code, _, err = run_main(compile_argv("cpu-tiny", tiny_model, Path(out), tmp_path / "cache", "--force"), capsys)
    line = one_error_line(err)
    assert code == 2 and "refusing to replace" in line and "nothing was touched" in line
    assert sorted(p.name for p in precious.iterdir()) == before
    assert (precious / "thesis.txt").read_text() == "keep me"
    assert temp_entries(tmp_path) == [] and temp_entries(precious) == []
