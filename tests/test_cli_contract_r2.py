"""The CLI contract, round 2 (issue 25): what a report says is what the command does.

Each test pins one defect with the command that showed it; most run in-process through ``cli.main``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes_rbln import run_main


# ----------------------------------------------------------------- 2. bucket-plan --json failures carry `error`
@pytest.mark.parametrize(
    "args, code",
    [
        (["/nonexistent/cat.jpg"], 2),  # a missing file
        (["--batch-trace", "TRACE"], 2),  # a trace value above the batch size
        (["--preset", "rebel100-1npu-batch4", "--set", "max_seq_len=262144", "--size", "640x480"], 4),  # no fit
    ],
)
def test_bucket_plan_json_failures_carry_the_error_object(args, code, capsys, tmp_path: Path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("[1, 2, 9]\n")
    args = [str(trace) if a == "TRACE" else a for a in args]
    got, out, err = run_main(["bucket-plan", *args, "--json"], capsys)
    assert got == code, err
    doc = json.loads(out)
    assert doc["error"]["exit_code"] == code and doc["error"]["message"] and doc["error"]["hint"]
    assert "summary" in doc  # the report stays beside the error


# ----------------------------------------------------------------- 5. a closed pipe is not an internal error
def _run_into_closed_pipe(*args: str) -> tuple[int, str]:
    """qvl with stdout a pipe whose reader has already left (``qvl ... | head -n0``), deterministically: the read
    end is closed before qvl starts, so its first write meets EPIPE."""
    import os
    import subprocess
    import sys

    from tests.helpers_cli import REPO

    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "qwenvl_rbln", *args],
            cwd=REPO,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
        )
    finally:
        os.close(write)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["bucket-plan", "--size", "1920x1080", "--rows", "0"],
        ["compile", "--preset", "rebel100-1npu", "--dry-run"],
        ["compile", "--preset", "rebel100-1npu", "--dry-run", "--json"],
    ],
)
def test_a_closed_pipe_ends_quietly_not_as_an_internal_error(args):
    code, err = _run_into_closed_pipe(*args)
    assert code == 141, err  # 128 + SIGPIPE, as `yes | head` reports; 1 would be "internal error"
    assert "Traceback" not in err and "internal error" not in err and "Exception ignored" not in err


# ----------------------------------------------------------------- 6. a dry run refuses what the real run refuses
def test_a_dry_run_refuses_what_the_real_run_refuses(capsys, tmp_path: Path):
    code, _, err = run_main(["compile", "--preset", "cpu-tiny", "--emulate", "--dry-run"], capsys)
    assert code == 2 and "nothing to emulate" in err
    taken = tmp_path / "mine"
    taken.mkdir()
    (taken / "notes.txt").write_text("my files")
    # an existing directory: a dry run writes nothing, so it only warns (D3); with --force, one that is not an
    # artifact is refused as the real run refuses it
    code, _, err = run_main(["compile", "--preset", "cpu-tiny", "-o", str(taken), "--dry-run"], capsys)
    assert code == 0 and str(taken) in err and "even with --force" in err, err
    code, _, err = run_main(["compile", "--preset", "cpu-tiny", "-o", str(taken), "--dry-run", "--force"], capsys)
    assert code == 2 and str(taken) in err, err
    assert (taken / "notes.txt").read_text() == "my files"
    code, _, err = run_main(["compile", "--preset", "cpu-tiny", "-o", str(tmp_path / "new"), "--dry-run"], capsys)
    assert code == 0, err


# ----------------------------------------------------------------- 4. load-check never says "ok" after "does not fit"
def test_load_check_does_not_fit_is_exit_4_never_ok(tiny_rbln, emulated, capsys, monkeypatch):
    from qwenvl_rbln.backends.rbln import optimum

    def no_load(*a, **k):
        raise AssertionError("--no-runtime loaded the model")

    monkeypatch.setattr(optimum, "load_model", no_load)  # 8: --emulate --no-runtime must not load it (4.5 s)
    args = ["load-check", str(tiny_rbln), "--emulate", "--no-runtime", "--device-memory", "1MiB"]
    code, out, err = run_main(args, capsys)
    assert code == 4, err
    assert "load-check: ok" not in out and "runtimes created" not in out
    code, out, err = run_main([*args, "--json"], capsys)
    doc = json.loads(out)
    assert code == 4 and doc["ok"] is False and doc["error"]["exit_code"] == 4
    # the emulated table is judged against --device-memory too
    assert doc["memory"]["fits"] is False and doc["memory"]["devices"][0]["usable_bytes"] == 1 << 20
    code, out, err = run_main(["load-check", str(tiny_rbln), "--emulate", "--no-runtime", "--json"], capsys)
    assert code == 0 and json.loads(out)["ok"] is True, err


def test_load_check_of_a_torch_artifact_that_does_not_fit_is_exit_4(tiny_model, capsys, tmp_path: Path):
    out_dir = tmp_path / "torch"
    code, _, err = run_main(["compile", "--preset", "cpu-tiny", "-o", str(out_dir)], capsys)
    assert code == 0, err
    code, out, err = run_main(["load-check", str(out_dir), "--no-runtime", "--device-memory", "1MiB", "--json"], capsys)
    doc = json.loads(out)
    assert code == 4 and doc["ok"] is False and doc["memory"]["fits"] is False, err


# ----------------------------------------------------------------- 3. infer refuses a --set the artifact disagrees with
@pytest.mark.parametrize(
    "sets, key",
    [
        (["max_seq_len=2048"], "max_seq_len 2048"),  # was silently ignored (and --max-new-tokens 3000 ran)
        (["visual.max_seq_len=[256,4096]"], "visual.max_seq_len [256, 4096]"),  # was only a warning
        (["prefill_chunk_size=256"], "prefill_chunk_size 256"),
    ],
)
def test_infer_refuses_every_compiled_key_it_disagrees_with(tiny_rbln, emulated, sets, key, capsys, no_model_load):
    args = ["infer", str(tiny_rbln), "--emulate", "--prompt", "hi", "--max-new-tokens", "3000"]
    code, _, err = run_main([*args, *[x for s in sets for x in ("--set", s)]], capsys)
    assert code == 2 and f"says {key}" in err and "pass what it was compiled with: --set" in err, err


def test_infer_with_the_compiled_values_spelled_out_still_runs(tiny_rbln, emulated, capsys):
    args = ["infer", str(tiny_rbln), "--emulate", "--prompt", "hi", "--max-new-tokens", "1", "--json"]
    code, out, err = run_main([*args, "--set", "max_seq_len=4096", "--preset", "cpu-tiny-rbln"], capsys)
    assert code == 0, err


# ----------------------------------------------------------------- 10. shipped presets produce no library warnings
def test_no_shipped_rbln_preset_makes_optimum_rbln_switch_attn_impl_with_a_warning():
    """optimum-rbln's own defaults code, on each shipped rbln preset's compile rbln_config: no warning (it used to
    print "attn_impl ... automatically switched to 'flash_attn'" on every cpu-tiny-rbln compile)."""
    import logging

    from tests.emulated_rbln import optimum_rbln_installed
    from tests.fakes_rbln import rbln_presets

    if not optimum_rbln_installed():
        pytest.skip("optimum-rbln is not installed")
    from qwenvl_rbln.backends.emulator import active
    from qwenvl_rbln.planning.plan import build_plan

    with active():
        from optimum.rbln.transformers import modeling_attention_utils as mau

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    mau.logger.addHandler(handler)
    try:
        for name in rbln_presets():
            cfg = build_plan(name).rbln_config
            keys = ("attn_impl", "kvcache_partition_len", "kvcache_block_size", "max_seq_len", "prefill_chunk_size")
            mau.set_default_values(**{k: cfg.get(k) for k in keys}, npu=cfg.get("npu"))
            assert not records, f"{name}: {records[0].getMessage()}"
    finally:
        mau.logger.removeHandler(handler)


# ----------------------------------------------------------------- 7. parallel CI jobs can share the tiny model
def test_a_second_tiny_model_writer_waits_and_reuses_the_first_s(tmp_path: Path):
    """The lock is held (as by a first `qvl tiny-model DIR` half-way through); a second one says it waits
    (an event, no sleep), and once the first has written the model, reuses it instead of failing with exit 2."""
    import threading

    from qwenvl_rbln.artifacts import flock
    from qwenvl_rbln.backends.tiny.model import build_or_reuse, create_tiny_model

    target = tmp_path / "tiny"
    waiting = threading.Event()
    result: dict = {}

    def notify(line: str) -> None:
        if line.startswith("waiting for another process"):
            waiting.set()

    def second() -> None:
        try:
            result["data"] = build_or_reuse(target, seed=0, notify=notify)
        except Exception as exc:  # noqa: BLE001 - reported below
            result["error"] = exc

    fd = flock.take(tmp_path / ".tiny.lock")  # the first writer
    worker = threading.Thread(target=second, daemon=True)
    try:
        worker.start()
        assert waiting.wait(300), f"the second writer did not wait: {result}"
        create_tiny_model(target, seed=0)
    finally:
        flock.release(fd)
        worker.join(timeout=300)
    assert not worker.is_alive(), "the second writer did not finish within 300 s of the lock's release"
    assert "error" not in result, result.get("error")
    assert result["data"]["created"] is False


def test_a_tiny_model_with_another_seed_names_the_cli_flag(tmp_path: Path, capsys):
    target = tmp_path / "tiny"
    code, _, err = run_main(["tiny-model", str(target), "--json"], capsys)
    assert code == 0, err
    code, _, err = run_main(["tiny-model", str(target), "--seed", "1"], capsys)
    assert code == 2 and "--force" in err and "overwrite=True" not in err and "()" not in err, err
    code, out, err = run_main(["tiny-model", str(target), "--seed", "1", "--force", "--json"], capsys)
    assert code == 0 and json.loads(out)["created"] is True, err


# ----------------------------------------------------------------- 8. truthful messages
def test_an_emulated_artifact_without_its_manifest_is_named_by_its_graph_files(tiny_rbln, tmp_path: Path, capsys):
    import shutil

    art = tmp_path / "art"
    shutil.copytree(tiny_rbln, art)
    (art / "qvl-manifest.json").unlink()
    code, _, err = run_main(["load-check", str(art), "--no-runtime"], capsys)
    assert code == 2 and "qvl's CPU emulator" in err, err
    assert "qvl-manifest.json emulated: true" not in err and "the emulator's marker in" in err


def test_a_missing_rebel_beside_optimum_rbln_hints_at_emulate(monkeypatch):
    from qwenvl_rbln.backends.rbln import optimum
    from qwenvl_rbln.errors import DependencyMissing

    monkeypatch.setattr(optimum, "missing_dependencies", lambda: ["rebel-compiler"])
    with pytest.raises(DependencyMissing) as info:
        optimum.check_dependencies()
    assert "--emulate" in info.value.hint and "pip install optimum-rbln" not in info.value.hint
    monkeypatch.setattr(optimum, "missing_dependencies", lambda: ["optimum-rbln", "rebel-compiler"])
    with pytest.raises(DependencyMissing) as info:
        optimum.check_dependencies()
    assert "optimum-rbln==0.12.0" in info.value.hint


def test_bench_serve_host_help_says_it_is_the_address_to_connect_to(capsys):
    code, out, _ = run_main(["bench-serve", "--help"], capsys)
    import re

    text = re.sub(r"[\s│]+", " ", out)  # the help box wraps and frames each column
    assert code == 0 and "to connect to" in text and "listens on" not in text


def test_compare_counts_in_words_and_says_when_no_tokens_are_shared(tmp_path: Path, capsys):
    def run(path: Path, ids: list[int]) -> str:
        doc = {
            "backend": "torch",
            "preset": "cpu-tiny",
            "generation": {"max_new_tokens": 8, "do_sample": False},
            "requests": [{"id": "r0", "text": "", "token_ids": ids}],
        }
        path.write_text(json.dumps(doc))
        return str(path)

    code, out, err = run_main(["compare", run(tmp_path / "a.json", []), run(tmp_path / "b.json", [])], capsys)
    assert code == 0, err
    assert "1 request)" in out and "1 requests" not in out and "1/1 request identical" in out
    assert "of 0 shared tokens" not in out and "no shared tokens to compare" in out


def test_an_empty_preset_file_says_it_is_empty(tmp_path: Path, capsys):
    empty = tmp_path / "mine.yaml"
    empty.write_text("# nothing yet\n")
    code, _, err = run_main(["compile", "--preset", str(empty), "--dry-run"], capsys)
    assert code == 2 and "the preset file is empty" in err, err


def test_qvl_home_pointing_at_a_file_is_named_as_such(tmp_path: Path, capsys, monkeypatch):
    home = tmp_path / "home-file"
    home.write_text("not a folder")
    monkeypatch.setenv("QVL_HOME", str(home))
    code, _, err = run_main(["tiny-model"], capsys)
    assert code == 2 and "is a file, not a directory" in err and "QVL_HOME" in err, err
    monkeypatch.setenv("QVL_HOME", str(home / "below"))
    code, _, err = run_main(["tiny-model"], capsys)
    assert code == 2 and f"lies below {home}, which is a file" in err, err


@pytest.mark.parametrize("flag", ["--host", "--served-model-name"])
@pytest.mark.parametrize("command", ["serve", "bench-serve"])
def test_empty_host_and_served_model_name_are_refused(tiny_rbln, command, flag, capsys):
    code, _, err = run_main([command, str(tiny_rbln), flag, "", "--dry-run"], capsys)
    assert code == 2 and f"{flag} is empty" in err, err


# ----------------------------------------------------------------- 9. bucket-plan DIR names what it skips
def test_bucket_plan_follows_folder_links_without_looping_and_names_what_it_skips(tmp_path: Path, capsys):
    import os

    from PIL import Image

    real, top = tmp_path / "real", tmp_path / "top"
    real.mkdir()
    top.mkdir()
    Image.new("RGB", (64, 48)).save(real / "a.png")
    Image.new("RGB", (64, 48)).save(top / "b.png")
    (top / "linked").symlink_to(real, target_is_directory=True)  # followed
    (top / "loop").symlink_to(top, target_is_directory=True)  # walked once
    (top / "broken.png").symlink_to(tmp_path / "nowhere.png")
    os.mkfifo(top / "pipe.png")  # never opened (reading a FIFO would block)
    code, out, err = run_main(["bucket-plan", str(top), "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert sorted(Path(i["input"]).name for i in doc["items"]) == ["a.png", "b.png"]
    skipped = {Path(s["path"]).name: s["why"] for s in doc["skipped_files"]["not_regular"]}
    assert "FIFO" in skipped["pipe.png"] and "broken symlink" in skipped["broken.png"] and "loop" in skipped["loop"]
    assert "pipe.png: a FIFO" in err and "broken.png: a broken symlink" in err


# ----------------------------------------------------------------- 11. names survive machine readers
def test_a_newline_in_a_file_name_does_not_split_a_table_row(tmp_path: Path, capsys, monkeypatch):
    from PIL import Image

    Image.new("RGB", (64, 48)).save(tmp_path / "line\nbreak.png")
    monkeypatch.chdir(tmp_path)  # a short name: the column never needs to fold
    code, out, err = run_main(["bucket-plan", "."], capsys)
    assert code == 0, err
    rows = [line for line in out.splitlines() if "break.png" in line]
    assert len(rows) == 1 and "line\u240abreak.png" in rows[0] and "│ 64x48" in rows[0]
    code, out, _ = run_main(["bucket-plan", ".", "--json"], capsys)
    assert json.loads(out)["items"][0]["input"].endswith("line\nbreak.png")  # --json keeps the exact name


def test_non_utf8_file_names_keep_their_exact_bytes_in_json(tmp_path: Path, capsys):
    import base64
    import os

    from PIL import Image

    raw = os.fsencode(tmp_path) + b"/caf\xe9.png"
    Image.new("RGB", (64, 48)).save(os.fsdecode(raw))
    code, out, err = run_main(["bucket-plan", str(tmp_path), "--json"], capsys)
    assert code == 0, err
    out.encode("utf-8")  # valid UTF-8 (it was not: the raw byte went to stdout)
    item = json.loads(out)["items"][0]
    assert item["input"].endswith("caf\ufffd.png")
    assert base64.b64decode(item["input_bytes_b64"]) == raw  # a script maps the result back to its file


def test_a_newline_in_a_request_id_does_not_split_the_compare_row(tmp_path: Path, capsys):
    docs = []
    for side in ("a", "b"):
        doc = {
            "backend": "torch",
            "preset": "cpu-tiny",
            "generation": {"max_new_tokens": 8, "do_sample": False},
            "requests": [{"id": "first\nsecond", "text": "", "token_ids": [1, 2, 3]}],
        }
        (tmp_path / f"{side}.json").write_text(json.dumps(doc))
        docs.append(str(tmp_path / f"{side}.json"))
    code, out, err = run_main(["compare", *docs], capsys)
    assert code == 0, err
    rows = [line for line in out.splitlines() if "second" in line]
    assert len(rows) == 1 and "first\u240asecond" in rows[0], out
