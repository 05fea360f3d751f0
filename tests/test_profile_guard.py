"""qvl profile against hostile input (audit 2026-12-04-new-user H2, H8, L11, M7; upstream finding 24): `--only`
merges into the artifact's entry and never drops what it did not time; an artifact changed after compile is refused
before anything is measured; a missing graph file is "missing", exit 2; `--check inf` is refused like nan; the
capture_reports report is credited to the vllm-rbln release it was read in, and rebel's version to its package."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from qwenvl_rbln.errors import EXIT_BAD_INPUT, InputError
from qwenvl_rbln.tuning.measured import read_file, write_entry
from tests.helpers_cli import REPO, run_qvl

QUICK = ("--repeats", "1", "--warmup", "0", "--points", "2")


def _copy(tiny_rbln: Path, tmp_path: Path) -> Path:
    art = tmp_path / "art"
    shutil.copytree(tiny_rbln, art)
    return art


def _profile(art: Path, **kw):
    from qwenvl_rbln.profiling.run import ProfileOptions, run_profile
    from tests.emulated_rbln import emulator_on

    with emulator_on():
        return run_profile(ProfileOptions(art, emulate=True, warmup=0, repeats=1, points=2, **kw))


# --- H2: --only merges ----------------------------------------------------------------------------------------------


def _graph(seconds: float) -> dict:
    point = {"context": 0, "median_s": seconds, "p10_s": seconds, "p90_s": seconds}
    return {"points": [point], "fit": None}


def test_an_entry_written_again_with_fewer_graphs_keeps_the_others_with_their_own_date(tmp_path):
    path = tmp_path / "timings.json"
    first = {"model_key": "m", "npu": "RBLN-CR13", "profiled_at": "2026-12-01T00:00:00+00:00",
             "graphs": {"visual/call256": _graph(0.01), "decoder_batch_1/block1024": _graph(0.02)}}  # fmt: skip
    write_entry("k", first, emulated=False, path=path)
    again = {**first, "profiled_at": "2026-12-04T00:00:00+00:00", "graphs": {"visual/call256": _graph(0.03)}}
    _, kept = write_entry("k", again, emulated=False, path=path)
    graphs = read_file(path)["entries"]["k"]["graphs"]
    assert kept == ["decoder_batch_1/block1024"]
    assert set(graphs) == {"visual/call256", "decoder_batch_1/block1024"}
    assert graphs["visual/call256"]["points"][0]["median_s"] == 0.03
    assert graphs["visual/call256"]["profiled_at"].startswith("2026-12-04")
    assert graphs["decoder_batch_1/block1024"]["points"][0]["median_s"] == 0.02  # not timed again: kept
    assert graphs["decoder_batch_1/block1024"]["profiled_at"].startswith("2026-12-01")  # with its own date


def test_profile_only_merges_into_the_artifacts_entry_and_says_what_it_kept(tiny_rbln, tmp_path, monkeypatch):
    monkeypatch.setenv("QVL_HOME", str(tmp_path))
    first = _profile(tiny_rbln, only=("decoder_batch_1/block1024",))
    res = run_qvl("profile", str(tiny_rbln), "--emulate", "--only", "vit", *QUICK, env={"QVL_HOME": str(tmp_path)})
    assert res.exit_code == 0, res.stderr
    assert "kept 1 graph(s) this run did not time, each with its own date: decoder_batch_1/block1024" in res.stdout
    entry = read_file(tmp_path / "timings.json")["emulated"][first["entry_key"]]
    assert set(entry["graphs"]) == {"decoder_batch_1/block1024", "visual/call256", "visual/call1024",
                                    "visual/call4096"}  # fmt: skip
    assert entry["graphs"]["decoder_batch_1/block1024"]["points"] == json.loads(json.dumps(
        [{k: v for k, v in p.items()} for p in first["graphs"][0]["points"]]))  # fmt: skip


# --- H8: changed after compile --------------------------------------------------------------------------------------


def test_profile_refuses_an_artifact_changed_after_compile_before_measuring(tiny_rbln, tmp_path, monkeypatch):
    art = _copy(tiny_rbln, tmp_path)
    cfg_path = art / "rbln_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["max_seq_len"] = 8192  # the graphs were compiled for 4096
    cfg_path.write_text(json.dumps(cfg))
    monkeypatch.setenv("QVL_HOME", str(tmp_path / "home"))
    with pytest.raises(InputError, match=r"rbln_config.json changed or missing since compile") as err:
        _profile(art)
    assert "qvl-manifest.json" in err.value.message and "load-check" in (err.value.hint or "")
    assert not (tmp_path / "home" / "timings.json").exists()  # nothing recorded under the good graphs' key
    (art / "decoder_batch_1.rbln").write_bytes(b"not a graph")  # a changed graph: the same refusal
    cfg_path.write_text(json.dumps({**cfg, "max_seq_len": 4096}))
    res = run_qvl("profile", str(art), "--emulate", *QUICK, "--no-save")
    assert res.exit_code == EXIT_BAD_INPUT, res.stderr
    assert "changed or missing since compile" in res.stderr and "decoder_batch_1.rbln" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


# --- M7: a missing graph file ---------------------------------------------------------------------------------------


def test_a_missing_graph_file_is_reported_missing_exit_2(tiny_rbln, tmp_path):
    art = _copy(tiny_rbln, tmp_path)
    (art / "prefill.rbln").unlink()
    res = run_qvl("profile", str(art), "--emulate", "--repeats", "1", "--warmup", "0", "--points", "1", "--no-save")
    assert res.exit_code == EXIT_BAD_INPUT, res.stderr
    assert "prefill.rbln is missing (the compiled graph of prefill/chunk" in res.stderr
    assert "not written by qvl's emulator" not in res.stderr and "Traceback" not in res.stderr


# --- L11: --check inf -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tol", ["inf", "Infinity", "nan"])
def test_check_inf_is_refused_like_nan(tiny_rbln, tol):
    res = run_qvl("profile", str(tiny_rbln), "--emulate", "--points", "1", "--no-save", "--check", tol)
    assert res.exit_code == EXIT_BAD_INPUT, res.stdout + res.stderr
    assert "--check" in res.stderr and "Traceback" not in res.stderr


def test_run_profile_refuses_an_infinite_tolerance_before_anything_runs(tmp_path):
    from qwenvl_rbln.profiling.run import ProfileOptions, run_profile

    with pytest.raises(InputError, match=r"--check inf: not a tolerance"):
        run_profile(ProfileOptions(tmp_path / "not-even-there", emulate=True, check=float("inf")))


# --- upstream finding 24: the capture_reports label, rebel's version ------------------------------------------------


def test_capture_reports_is_credited_to_the_vllm_rbln_release_it_was_read_in():
    from qwenvl_rbln.backends.emulator import rebel_api
    from qwenvl_rbln.profiling import timer

    docs = (REPO / "docs" / "profiling.md").read_text()
    for text in (timer.__doc__, rebel_api.__doc__, docs):
        assert "vllm-rbln 0.12" not in text  # no such release: the report is read so in v0.11.0 (and 0.10)
    assert "v0.11.0" in timer.CAPTURE_SOURCE and "v0.11.0" in rebel_api.__doc__ and "v0.11.0" in docs


def test_rebels_version_comes_from_its_package_not_an_unattested_attribute(monkeypatch):
    from importlib import metadata

    from qwenvl_rbln.profiling.run import _versions

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda d: "0.9.3" if d == "rebel-compiler" else real(d))

    class Rebel:  # no __version__: nothing upstream shows one
        pass

    assert _versions(Rebel())["rebel"] == "0.9.3"
    from qwenvl_rbln.backends.emulator import rebel_api

    assert _versions(rebel_api)["rebel"] == rebel_api.__version__  # the emulator is no installed package
