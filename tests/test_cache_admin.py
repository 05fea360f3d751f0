"""The managed compile cache (issue 25 item 12): list, prune, rm, a size cap, files stored once, stale locks
removed, and an entry in use never pruned (a prune raced against a compile that hits the entry)."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest

from qwenvl_rbln.artifacts import cache as cache_mod
from qwenvl_rbln.artifacts import flock
from qwenvl_rbln.artifacts.cache import cache_store
from qwenvl_rbln.artifacts.cache_admin import enforce_max_size, entry_in_use, list_entries, prune
from qwenvl_rbln.artifacts.locks import lock_path, output_lock
from qwenvl_rbln.artifacts.manifest import write_manifest
from tests.fakes_rbln import run_main

KB = 1024


def _entry(cache: Path, tmp_path: Path, n: int, size: int, age_s: float) -> str:
    """A cache entry of ``size`` bytes, last used ``age_s`` ago."""
    src = tmp_path / f"src{n}"
    src.mkdir()
    (src / "prefill.rbln").write_bytes(bytes([n]) * size)
    write_manifest(src, {"format": 1, "preset": {"name": f"p{n}"}, "model": {"id": f"m{n}"}, "backend": "rbln"})
    key = f"{n:032x}"
    entry = cache_store(cache, key, src)
    when = time.time() - age_s
    os.utime(entry, (when, when))
    return key


def test_list_prune_and_rm_through_the_cli(tmp_path: Path, capsys):
    cache = tmp_path / "cache"
    keys = [_entry(cache, tmp_path, n, 10 * KB, age) for n, age in [(1, 40 * 86400), (2, 3 * 86400), (3, 60)]]
    code, out, err = run_main(["cache", "list", "--cache-dir", str(cache), "--json"], capsys)
    doc = json.loads(out)
    assert code == 0, err
    assert [e["key"] for e in doc["entries"]] == keys  # least recently used first
    assert [e["preset"] for e in doc["entries"]] == ["p1", "p2", "p3"] and doc["entries"][0]["model"] == "m1"
    assert doc["total_bytes"] == sum(e["size_bytes"] for e in doc["entries"]) > 30 * KB
    code, out, _ = run_main(["cache", "list", "--cache-dir", str(cache)], capsys)
    assert keys[0] in out and "p1" in out and "3 entries" in out

    code, out, _ = run_main(["cache", "prune", "--older-than", "30d", "--dry-run", "--cache-dir", str(cache)], capsys)
    assert code == 0 and "would remove 1 entries" in out and (cache / keys[0]).is_dir()
    code, out, _ = run_main(["cache", "prune", "--older-than", "30d", "--cache-dir", str(cache), "--json"], capsys)
    assert [e["key"] for e in json.loads(out)["removed"]] == [keys[0]] and not (cache / keys[0]).exists()
    code, out, _ = run_main(["cache", "prune", "--max-size", "15KiB", "--cache-dir", str(cache), "--json"], capsys)
    assert [e["key"] for e in json.loads(out)["removed"]] == [keys[1]]  # the least recently used goes first
    code, out, err = run_main(["cache", "rm", keys[2], "--cache-dir", str(cache)], capsys)
    assert code == 0 and not (cache / keys[2]).exists(), err
    code, _, err = run_main(["cache", "rm", keys[2], "--cache-dir", str(cache)], capsys)
    assert code == 2 and "qvl cache list" in err
    code, _, err = run_main(["cache", "prune", "--older-than", "soon", "--cache-dir", str(cache)], capsys)
    assert code == 2 and "--older-than='soon'" in err


def test_qvl_cache_max_size_prunes_least_recently_used_after_a_store(tmp_path: Path, monkeypatch):
    cache = tmp_path / "cache"
    old, mid, new = (_entry(cache, tmp_path, n, 10 * KB, age) for n, age in [(1, 300), (2, 200), (3, 100)])
    monkeypatch.setenv("QVL_CACHE_MAX_SIZE", "25KiB")
    lines = enforce_max_size(cache, keep={old})  # the entry just stored is kept even if it is the oldest
    assert {e["key"] for e in list_entries(cache)} == {old, new} and mid in lines[0]
    monkeypatch.setenv("QVL_CACHE_MAX_SIZE", "lots")
    assert "ignored" in enforce_max_size(cache, keep=set())[0]


def test_entries_are_hard_links_with_copies_as_the_fallback(tmp_path: Path, monkeypatch):
    cache = tmp_path / "cache"
    key = _entry(cache, tmp_path, 1, KB, 0)
    assert os.stat(cache / key / "prefill.rbln").st_ino == os.stat(tmp_path / "src1" / "prefill.rbln").st_ino
    assert os.stat(cache / key / "qvl-manifest.json").st_ino != os.stat(tmp_path / "src1" / "qvl-manifest.json").st_ino

    def no_links(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(cache_mod.os, "link", no_links)
    counts = cache_mod.copy_tree(cache / key, tmp_path / "copied")
    assert counts == {"linked": 0, "copied": 2}
    assert (tmp_path / "copied" / "prefill.rbln").read_bytes() == bytes([1]) * KB


def test_stale_lock_files_are_removed_and_held_ones_kept(tmp_path: Path):
    with output_lock(tmp_path / "busy"):
        with output_lock(tmp_path / "done"):
            pass
        stale = lock_path(tmp_path / "done")
        assert stale.exists()
        result = prune(tmp_path / "cache", older_than_s=1e9)
        assert stale.name in result["stale_locks_removed"] and not stale.exists()
        assert lock_path(tmp_path / "busy").exists()  # held by this compile: kept
    with output_lock(tmp_path / "done"):  # a lock whose file was removed is taken afresh
        pass


def test_a_dry_run_counts_the_stale_locks_the_real_prune_removes(tmp_path: Path, capsys):
    """D16: the dry run said "0 stale lock files removed" where the real run right after removed 5."""
    for n in range(5):  # interrupted compiles leave their lock files
        with output_lock(tmp_path / f"done{n}"):
            pass
    stale = {lock_path(tmp_path / f"done{n}").name for n in range(5)}
    argv = ["cache", "prune", "--older-than", "30d", "--cache-dir", str(tmp_path / "cache")]
    with output_lock(tmp_path / "busy"):
        code, out, err = run_main([*argv, "--dry-run", "--json"], capsys)
        would = set(json.loads(out)["stale_locks_removed"])
        assert code == 0 and stale <= would, err
        assert lock_path(tmp_path / "busy").name not in would  # held by a running compile: not stale
        assert all(lock_path(tmp_path / f"done{n}").exists() for n in range(5))  # a dry run removes nothing
        code, out, _ = run_main([*argv, "--dry-run"], capsys)
        assert f"would remove {len(would)} stale lock files" in out
        code, out, _ = run_main([*argv, "--json"], capsys)
        assert set(json.loads(out)["stale_locks_removed"]) == would
        assert not any(lock_path(tmp_path / f"done{n}").exists() for n in range(5))


def test_a_lock_file_removed_between_open_and_lock_is_not_shared(tmp_path: Path):
    """The safety remove_if_free relies on: a taker that locked a file since unlinked retries on the new one."""
    path = tmp_path / "x.lock"
    fd = flock.take(path)
    os.unlink(path)  # as remove_if_free does while holding it
    other = flock.take(path)  # a new file: not blocked by the old, unlinked one
    assert os.fstat(other).st_ino != os.fstat(fd).st_ino
    with pytest.raises(flock.LockBusy):
        flock.take(path)
    flock.release(fd)
    flock.release(other)


def test_prune_never_touches_an_entry_a_compile_is_using(tmp_path: Path, tiny_model, monkeypatch, capsys):
    """A compile that hits the entry is held inside its copy (an event, no sleep); a prune meanwhile skips the
    entry and says so; the compile then finishes from the intact entry; a later prune removes it."""
    from qwenvl_rbln.jobs import compile_job

    cache = tmp_path / "cache"

    def compile_into(name: str) -> tuple[int, str, str]:
        argv = ["compile", "--preset", "cpu-tiny", "--model", str(tiny_model), "-o", str(tmp_path / name)]
        return run_main([*argv, "--cache-dir", str(cache), "--json"], capsys)

    code, out, err = compile_into("first")
    assert code == 0 and json.loads(out)["result"]["cache"] == "miss", err
    key = json.loads(out)["result"]["cache_key"]

    copying, go = threading.Event(), threading.Event()
    real_copy = compile_job.copy_tree

    def held_copy(src, dst):
        copying.set()
        assert go.wait(300), "the test never released the compile"
        return real_copy(src, dst)

    monkeypatch.setattr(compile_job, "copy_tree", held_copy)
    plan_out: dict = {}

    def second() -> None:
        from qwenvl_rbln.memory.planner import estimate_plan
        from qwenvl_rbln.planning.plan import build_plan

        plan = build_plan("cpu-tiny", model=str(tiny_model), output_dir=str(tmp_path / "second"))
        plan_out["result"] = compile_job.run_compile(plan, estimate_plan(plan), cache_dir=cache, heartbeat_s=0)

    worker = threading.Thread(target=second, daemon=True)
    worker.start()
    try:
        assert copying.wait(300), "the compile never reached the cache entry"
        code, out, err = run_main(["cache", "prune", "--max-size", "0B", "--cache-dir", str(cache), "--json"], capsys)
        result = json.loads(out)
        assert code == 0, err
        assert [e["key"] for e in result["skipped_in_use"]] == [key] and result["removed"] == []
        code, _, err = run_main(["cache", "rm", key, "--cache-dir", str(cache)], capsys)
        assert code == 6 and "in use" in err
        assert (cache / key).is_dir()
    finally:
        go.set()
        worker.join(timeout=600)
    assert not worker.is_alive(), "the second compile did not end within 600 s of its release"
    assert plan_out["result"]["cache"] == "hit"
    code, _, err = run_main(["load-check", str(tmp_path / "second"), "--no-runtime"], capsys)
    assert code == 0, err
    with entry_in_use(cache, key):  # readers share: a second reader is not blocked
        pass
    code, out, _ = run_main(["cache", "prune", "--max-size", "0B", "--cache-dir", str(cache), "--json"], capsys)
    assert [e["key"] for e in json.loads(out)["removed"]] == [key] and not (cache / key).exists()


def test_a_finished_compile_leaves_no_lock_file_behind(tmp_path: Path, tiny_model, capsys):
    out = tmp_path / "out"
    argv = ["compile", "--preset", "cpu-tiny", "--model", str(tiny_model), "-o", str(out), "--no-cache"]
    code, _, err = run_main(argv, capsys)
    assert code == 0, err
    assert not lock_path(out).exists() and not lock_path(out).with_name(lock_path(out).name + ".owner").exists()


def test_cache_list_tells_apart_entries_that_differ_only_by_a_set(tmp_path: Path, capsys, monkeypatch):
    """D27: two compiles of cpu-tiny / qvl:tiny, one with --set, were two identical rows but for the key."""
    cache = tmp_path / "cache"
    argvs = [
        ["compile", "--preset", "cpu-tiny", "-o", "a"],
        ["compile", "--preset", "cpu-tiny", "--set", "max_seq_len=2048", "-s", "batch_size=1", "-o", "b"],
    ]
    for n, argv in enumerate(argvs, start=1):
        src = tmp_path / f"src{n}"
        src.mkdir()
        (src / "prefill.rbln").write_bytes(b"x")
        manifest = {"format": 1, "preset": {"name": "cpu-tiny"}, "model": {"id": "qvl:tiny"}, "backend": "torch"}
        write_manifest(src, {**manifest, "created_by": {"pid": 1, "host": "h", "argv": argv}})
        cache_store(cache, f"{n:032x}", src)
    code, out, err = run_main(["cache", "list", "--cache-dir", str(cache), "--json"], capsys)
    assert code == 0, err
    got = {e["key"]: e["overrides"] for e in json.loads(out)["entries"]}
    assert got == {f"{1:032x}": [], f"{2:032x}": ["max_seq_len=2048", "batch_size=1"]}
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_main(["cache", "list", "--cache-dir", str(cache)], capsys)
    rows = [" ".join(line.split()[1:]) for line in out.splitlines() if line.startswith(("0000",))]
    assert len(rows) == 2 and rows[0] != rows[1]  # the same preset and model, told apart beyond the key
    assert any("max_seq_len=2048 batch_size=1" in row for row in rows)
