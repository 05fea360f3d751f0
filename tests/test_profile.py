"""qvl profile and timings.json: the fit recovers a known quadratic, the file is keyed, written atomically and a
re-profile replaces only its own entry, emulated figures are kept apart and never read for an NPU, the clock says
which it is, and `qvl profile --emulate` runs end to end on the emulated tiny artifact with --check's exit code."""

from __future__ import annotations

import json
import os

import pytest

from qwenvl_rbln.errors import EXIT_DIVERGED
from qwenvl_rbln.tuning.fit import fit_quadratic
from qwenvl_rbln.tuning.measured import entry_key, load_measured, read_file, write_entry
from tests.helpers_cli import run_qvl

MODEL = "qwen3_vl/text-test"


def _entry(seconds: float, *, model: str = MODEL, npu: str = "RBLN-CR13", key: str = "decoder_batch_2/block8192",
           when: str = "2026-12-03T10:00:00+00:00") -> dict:  # fmt: skip
    point = {"context": 1000, "median_s": seconds, "p10_s": seconds, "p90_s": seconds, "min_s": seconds,
             "max_s": seconds}  # fmt: skip
    return {"model_key": model, "npu": npu, "profiled_at": when, "graphs": {key: {"points": [point], "fit": None}}}


# --- the fit ------------------------------------------------------------------------------------------------------


def test_fit_recovers_a_known_quadratic():
    c0, a, b = 2e-3, 3e-7, 4e-11
    fit = fit_quadratic([(n, c0 + a * n + b * n * n) for n in (0, 1024, 4096, 8192, 16384, 32768)])
    assert fit is not None
    assert fit.c0 == pytest.approx(c0, rel=1e-6)
    assert fit.a == pytest.approx(a, rel=1e-6)
    assert fit.b == pytest.approx(b, rel=1e-6)
    assert fit.rms_rel_error < 1e-9 and (fit.lo, fit.hi) == (0, 32768)
    noisy = fit_quadratic([(0, 1.0), (100, 1.3), (200, 0.9), (300, 1.4), (400, 1.0)])
    assert noisy is not None and noisy.rms_rel_error > 0.05  # the fit says how far to trust it


def test_fit_with_two_points_is_a_line_and_one_point_a_constant():
    line = fit_quadratic([(0, 1.0), (10, 2.0)])
    assert line is not None and line.b == 0 and line(5) == pytest.approx(1.5)
    assert line.a == pytest.approx(0.1) and line(0) == pytest.approx(1.0) and line(30) == pytest.approx(4.0)
    one = fit_quadratic([(7, 3.0)])
    assert one is not None and one(1000) == pytest.approx(3.0)


def test_the_fits_errors_are_numpys_least_squares_residuals_worst_by_size_whatever_the_sign():
    """numpy.polyfit (degree 2) as the oracle: same coefficients, and the worst relative error is the largest
    residual by size, here one where the fit lies below the measurement."""
    np = pytest.importorskip("numpy")
    pts = [(0, 1.0), (100, 1.0), (200, 1.0), (300, 1.0), (400, 1.0), (500, 3.0), (600, 1.0), (700, 1.0)]
    fit = fit_quadratic(pts)
    x, y = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
    b, a, c0 = np.polyfit(x, y, 2)
    rel = (np.polyval([b, a, c0], x) - y) / y
    assert -rel.min() > rel.max()  # the worst residual is the fit below the measured time
    assert (fit.c0, fit.a, fit.b) == (pytest.approx(c0), pytest.approx(a), pytest.approx(b))
    assert fit.max_rel_error == pytest.approx(float(np.abs(rel).max()))
    assert fit.rms_rel_error == pytest.approx(float(np.sqrt(np.mean(rel**2))))


def test_the_profiled_range_ends_are_measured_not_extrapolated():
    fit = fit_quadratic([(1024, 0.002), (8192, 0.003), (32768, 0.005)])
    assert (fit.lo, fit.hi) == (1024, 32768)
    assert not fit.extrapolates(1024) and not fit.extrapolates(32768) and not fit.extrapolates(20000)
    assert fit.extrapolates(1023) and fit.extrapolates(32769)


# --- the file -----------------------------------------------------------------------------------------------------


def test_entries_are_keyed_by_npu_versions_and_graph_hash_and_replace_only_their_own(tmp_path):
    path = tmp_path / "timings.json"
    k1 = entry_key("RBLN-CR13", "0.12.0", "0.12.0", "aaa")
    k2 = entry_key("RBLN-CR13", "0.12.1", "0.12.0", "aaa")  # another rebel: another entry
    write_entry(k1, _entry(0.01), emulated=False, path=path)
    write_entry(k2, _entry(0.02, key="prefill/chunk512/block8192"), emulated=False, path=path)
    write_entry(k1, _entry(0.03, when="2026-12-03T11:00:00+00:00"), emulated=False, path=path)  # re-profile
    data = read_file(path)
    assert set(data["entries"]) == {k1, k2} and data["version"] == 2
    assert data["entries"][k1]["graphs"]["decoder_batch_2/block8192"]["points"][0]["median_s"] == 0.03
    assert data["entries"][k2]["graphs"]["prefill/chunk512/block8192"]["points"][0]["median_s"] == 0.02
    assert "rebel 0.12.1" in k2 and "aaa" in k2
    found = load_measured(MODEL, "RBLN-CR13", path).graphs
    assert {k: g.points[max(g.points)]["median_s"] for k, g in found.items()} == {
        "decoder_batch_2/block8192": 0.03, "prefill/chunk512/block8192": 0.02}  # fmt: skip


def test_a_failed_write_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "timings.json"
    write_entry("k", _entry(0.01), emulated=False, path=path)
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_entry("k2", _entry(0.05), emulated=False, path=path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".timings.json.lock", "timings.json"]  # no temp left


def test_emulated_timings_are_kept_apart_and_never_read_for_an_npu(tmp_path):
    path = tmp_path / "timings.json"
    write_entry("emu", _entry(0.5), emulated=True, path=path)
    assert load_measured(MODEL, "RBLN-CR13", path).graphs == {}
    emulated = load_measured(MODEL, "RBLN-CR13", path, emulated=True).get("decoder_batch_2/block8192")
    assert emulated is not None and "emulated" in emulated.label("measured")
    # an entry flagged emulated that sits in the real section (edited by hand) is not read for an NPU either
    data = read_file(path)
    data["entries"]["moved"] = data["emulated"].pop("emu")
    path.write_text(json.dumps(data))
    assert load_measured(MODEL, "RBLN-CR13", path).graphs == {}


def test_version_1_is_refused_with_the_fix(tmp_path):
    from qwenvl_rbln.errors import InputError

    path = tmp_path / "timings.json"
    path.write_text(json.dumps({"format": "qvl-timings", "version": 1, "entries": {}}))
    with pytest.raises(InputError) as err:
        load_measured(MODEL, "RBLN-CR13", path)
    assert "version 1" in err.value.message and "qvl profile" in (err.value.hint or "")


# --- the clock ----------------------------------------------------------------------------------------------------


def test_device_time_from_capture_reports_else_wall_time():
    from qwenvl_rbln.backends.emulator import rebel_api
    from qwenvl_rbln.profiling.timer import DEVICE, WALL, time_call

    class NoReports:
        pass

    stats, clock = time_call(NoReports(), lambda: None, warmup=0, repeats=3)
    assert clock == WALL and stats["samples"] == 3
    stats, clock = time_call(rebel_api, lambda: rebel_api._record_call(0.25), warmup=1, repeats=3)
    assert clock == DEVICE and stats["median_s"] == pytest.approx(0.25)  # the report's device time, not the clock


# --- end to end on the emulator -----------------------------------------------------------------------------------


def test_profile_refuses_an_emulated_artifact_without_emulate(tiny_rbln):
    from qwenvl_rbln.errors import InputError
    from qwenvl_rbln.profiling.run import ProfileOptions, run_profile

    with pytest.raises(InputError, match="compiled on the CPU emulator") as err:
        run_profile(ProfileOptions(tiny_rbln, emulate=False))
    assert "--emulate" in (err.value.hint or "")


@pytest.fixture(scope="module")
def profiled(tiny_rbln, tmp_path_factory):
    """`qvl profile DIR --emulate` in-process (the CLI's exit code is tested once, below): decoder graphs at 3
    contexts and the smallest ViT bucket, recorded under a private QVL_HOME."""
    from qwenvl_rbln.profiling.run import ProfileOptions, run_profile
    from tests.emulated_rbln import emulator_on

    home = tmp_path_factory.mktemp("profile-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("QVL_HOME", str(home))
    try:
        with emulator_on():
            opts = ProfileOptions(tiny_rbln, emulate=True, warmup=1, repeats=2, points=3, check=1e12,
                                  only=("decoder", "visual/call256"))  # fmt: skip
            doc = json.loads(json.dumps(run_profile(opts)))
    finally:
        mp.undo()
    return doc, home


def test_profile_emulated_times_every_decoder_graph_at_each_context_beside_the_roofline(profiled):
    doc, home = profiled
    assert doc["emulated"] and "emulated" in doc["label"] and doc["check"]["ok"] is True
    graphs = {g["key"]: g for g in doc["graphs"]}
    assert set(graphs) == {"visual/call256", "decoder_batch_1/block1024", "decoder_batch_2/block1024"}
    for key in ("decoder_batch_1/block1024", "decoder_batch_2/block1024"):
        g = graphs[key]
        assert [p["context"] for p in g["points"]] == [0, 2048, 4095]
        assert g["fit"]["points"] == 3 and g["time_source"].startswith("device time")
        for p in g["points"]:
            assert p["p10_s"] <= p["median_s"] <= p["p90_s"] and p["roofline_s"] > 0
            assert p["ratio"] == pytest.approx(p["median_s"] / p["roofline_s"])
            assert p["tokens_per_s"] == pytest.approx(g["size"] / p["median_s"])
    data = read_file(home / "timings.json")
    assert data["entries"] == {} and list(data["emulated"]) == [doc["entry_key"]]  # apart, never an NPU figure
    entry = data["emulated"][doc["entry_key"]]
    assert entry["emulated"] is True and entry["graph_hash"] == doc["graph_hash"] and entry["model_key"]


def test_profile_check_exits_7_when_a_graph_is_off_and_says_emulated(tiny_rbln, profiled):
    _, home = profiled
    before = (home / "timings.json").read_bytes()
    res = run_qvl("profile", str(tiny_rbln), "--emulate", "--only", "visual/call256", "--repeats", "1", "--warmup",
                  "0", "--check", "0.5", "--no-save", env={"QVL_HOME": str(home)})  # fmt: skip
    assert res.exit_code == EXIT_DIVERGED, res.stderr
    assert "emulated times of visual/call256 differ from the roofline bound" in res.stderr
    assert "emulated (CPU, not an NPU) against the roofline bound" in res.stdout and "OFF" in res.stdout
    assert (home / "timings.json").read_bytes() == before  # --no-save


def test_a_graph_that_cannot_load_is_one_backend_error_naming_it(tiny_rbln, tmp_path, monkeypatch):
    import shutil

    from qwenvl_rbln.errors import BackendError
    from qwenvl_rbln.profiling.run import ProfileOptions, run_profile
    from tests.emulated_rbln import emulator_on

    art = tmp_path / "art"
    shutil.copytree(tiny_rbln, art)
    (art / "decoder_batch_1.rbln").write_bytes(b"not a graph")
    (art / "qvl-manifest.json").unlink()  # with it, the changed graph is refused before loading (test_profile_guard)
    monkeypatch.setenv("QVL_HOME", str(tmp_path))
    with emulator_on(), pytest.raises(BackendError, match="decoder_batch_1.rbln .decoder_batch_1/block1024. cannot"):
        run_profile(ProfileOptions(art, emulate=True, only=("decoder_batch_1/block1024",)))
    assert not (tmp_path / "timings.json").exists()  # nothing half-recorded
