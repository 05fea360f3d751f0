"""`qvl deploy --load-check FILE`: a load-check report sizes the startup probe only when it is a real NPU load of
THIS artifact's graphs with a plausible number of seconds; anything else is one line naming the cause (audit
2026-12-04 H11, mutation D3). Also the load qvl load-check records in $QVL_HOME/load-times.json, the other way a
measured load reaches deploy. `qvl tune` reads no load-check report (its inputs are a workload and timings.json), so
deploy's reader is the only one.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from qwenvl_rbln.artifacts.manifest import graph_hash, read_manifest, write_manifest
from qwenvl_rbln.deploy.build import build
from qwenvl_rbln.deploy.options import DeployOptions
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import deploy_artifact, run_main

IMAGE = "registry.internal/vllm-rbln:0.12.0"


pytestmark = pytest.mark.usefixtures("own_qvl_home")  # tests/conftest.py


def _artifact(root: Path, preset: str = "rebel100-1npu", placement: dict | None = None) -> Path:
    return deploy_artifact(root, preset, placement=placement, model_id="m")


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
    base = tmp_path_factory.mktemp("reports")
    return {"one": _artifact(base / "one", placement={"device": 1, "visual_device": 1}),
            "two": _artifact(base / "two", "rebel100-2npu-batch4")}  # fmt: skip


def read_load_check(report: Path, artifact: Path) -> float:
    from qwenvl_rbln.deploy.load_report import read_load_check as read

    return read(report, artifact)


def report_of(artifact: Path, seconds=150.0, **runtime) -> dict:
    """What `qvl load-check DIR --json` writes after a real runtime creation on an NPU."""
    body = {"attempted": True, "ok": True, "create_runtimes": True, "seconds": seconds}
    body["graph_hash"] = graph_hash(artifact, read_manifest(artifact))
    return {"artifact_dir": str(artifact), "kind": "rbln", "emulated": False, "runtime": {**body, **runtime}}


def deploy(capsys, art: Path, report: Path, *extra: str) -> tuple[int, str, str]:
    args = ["deploy", str(art), "--artifact", "pvc:models", "--image", IMAGE, "--load-check", str(report)]
    return run_main([*args, "--dry-run", "--json", *extra], capsys)


def one_line_refusal(code: int, out: str, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "fix:" in lines[0], (code, out, err)
    assert "internal error" not in err and "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------------------------------------- H11: identity


def test_another_artifacts_report_is_refused_naming_both(tmp_path, arts, capsys):
    """The audit's `other.json`: fake2's report used silently for fake1 (a 20 s load sized fake1's probe)."""
    report = tmp_path / "other.json"
    report.write_text(json.dumps(report_of(arts["two"], seconds=20.0)))
    line = one_line_refusal(*deploy(capsys, arts["one"], report))
    assert "measured other graphs" in line and str(arts["two"]) in line and str(arts["one"]) in line
    report.write_text(json.dumps(report_of(arts["one"], seconds=20.0)))
    code, out, err = deploy(capsys, arts["one"], report)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["load_measured"] is True and doc["startup_budget_s"] == 300  # 3 x 20 s, at least 300 s


def test_a_copy_of_the_artifact_elsewhere_matches_by_graph_hash_and_a_recompile_does_not(tmp_path, arts):
    """The NPU host's path is not the deploying machine's: the graphs decide, not the folder's name."""
    copy = tmp_path / "elsewhere" / "qwen3-vl"
    shutil.copytree(arts["one"], copy)
    report = tmp_path / "lc.json"
    report.write_text(json.dumps(report_of(arts["one"])))  # artifact_dir names the original
    assert read_load_check(report, copy) == 150.0
    (copy / "prefill.rbln").write_bytes(b"recompiled")  # new graphs, and a manifest that lists them
    plan = build_plan("rebel100-1npu")
    write_manifest(copy, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "m"}})
    with pytest.raises(InputError, match="measured other graphs"):
        read_load_check(report, copy)


def test_a_report_without_a_graph_hash_counts_only_for_the_folder_it_names(tmp_path, arts):
    """An older qvl's report (no graph hash): its artifact_dir must be DIR itself; no artifact_dir at all (the
    audit's hand-written `{"runtime": {...}}`) is refused."""
    old = report_of(arts["one"])
    del old["runtime"]["graph_hash"]
    report = tmp_path / "old.json"
    report.write_text(json.dumps(old))
    assert read_load_check(report, arts["one"]) == 150.0
    with pytest.raises(InputError, match="carries no graph hash"):
        read_load_check(report, arts["two"])
    del old["artifact_dir"]
    report.write_text(json.dumps(old))
    with pytest.raises(InputError, match="an unnamed artifact and carries no graph hash"):
        read_load_check(report, arts["one"])


def test_load_check_writes_the_graph_hash_deploy_matches(tmp_path, monkeypatch, capsys):
    """The round trip: `qvl load-check --json` after a (faked) real runtime creation, then deploy with that
    report; before, the report had no graph hash, so nothing tied it to its artifact."""
    from tests.fakes_rbln import install, make_auto, make_rebel

    plan = build_plan("rebel100-1npu")
    root = _artifact(tmp_path / "art")
    install(monkeypatch, make_auto(plan), rebel=make_rebel())
    code, out, err = run_main(["load-check", str(root), "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["runtime"]["graph_hash"] == graph_hash(root, read_manifest(root))
    data["runtime"]["seconds"] = 95.0  # a fake runtime loads in milliseconds; a real one does not
    report = tmp_path / "load-check.json"
    report.write_text(json.dumps(data))
    assert read_load_check(report, root) == 95.0


def test_a_no_runtime_report_checked_only_the_config_and_sizes_no_probe(tmp_path, monkeypatch, capsys):
    """`qvl load-check DIR --no-runtime --json` validated the config and loaded nothing: its seconds are not a
    load, however plausible, so deploy refuses it as a measured load (the probe would be sized from seconds)."""
    from tests.fakes_rbln import install, make_auto, make_rebel

    root = _artifact(tmp_path / "art")
    install(monkeypatch, make_auto(build_plan("rebel100-1npu")), rebel=make_rebel())
    code, out, err = run_main(["load-check", str(root), "--no-runtime", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["runtime"]["create_runtimes"] is False and data.get("emulated") is False, data
    data["runtime"].update(ok=True, seconds=95.0)  # even with a load-like figure in it
    report = tmp_path / "no-runtime.json"
    report.write_text(json.dumps(data))
    line = one_line_refusal(*deploy(capsys, root, report))
    assert "has no measured load" in line, line


# -------------------------------------------------------------------------------------- H11 / D3: the numbers


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [("NaN", "NaN"), ("Infinity", "Infinity"), ("-Infinity", "-Infinity"), ("1e12", "1000000000000.0"),
     ("0", "0"), ("-50", "-50"), ("true", "true"), ("null", "null"), ('"95"', '"95"'), ("1" + "0" * 400, "1000")],
)  # fmt: skip
def test_seconds_that_are_not_a_load_time_are_refused_never_a_crash(tmp_path, arts, capsys, seconds, shown):
    """Before: NaN and Infinity were `qvl: internal error` (int() of them), 1e12 wrote failureThreshold
    299999999999 (outside int32), and 0, -50 and true were accepted as measured loads."""
    body = json.dumps(report_of(arts["one"], seconds="SECONDS")).replace('"SECONDS"', seconds)
    report = tmp_path / "lc.json"
    report.write_text(body)
    line = one_line_refusal(*deploy(capsys, arts["one"], report))
    assert f"runtime.seconds={shown}" in line and "is not a load time" in line and "None" not in line


def test_a_failed_runtime_is_no_measured_load(tmp_path, arts, capsys):
    """Mutation D3 (`ok` not checked): a report whose runtime failed sized the probe from the seconds it ran."""
    report = tmp_path / "lc.json"
    failed = report_of(arts["one"], seconds=12.0, ok=False, error="NPU 0 busy")
    report.write_text(json.dumps(failed))
    line = one_line_refusal(*deploy(capsys, arts["one"], report))
    assert "no measured load (NPU 0 busy)" in line
    with pytest.raises(InputError, match=r"no measured load \(NPU 0 busy\)"):
        build(DeployOptions(directory=arts["one"], artifact="pvc:m", image=IMAGE, dry_run=True, load_check=report))


def test_an_emulated_or_unmarked_report_is_refused(tmp_path, arts):
    report = tmp_path / "lc.json"
    for emulated, said in ((True, "ran on the emulator"), (None, "'emulated' is null, not false")):
        body = report_of(arts["one"])
        body["emulated"] = emulated
        report.write_text(json.dumps(body))
        with pytest.raises(InputError, match=said):
            read_load_check(report, arts["one"])


@pytest.mark.parametrize(
    "text",
    ["", "{", "[1, 2]", "42", '"report"', "[" * 100_000 + "]" * 100_000, '{"runtime": 3}', "\udcff"],
    ids=["empty", "cut", "list", "number", "string", "deep", "runtime-not-object", "not-utf8"],
)
def test_a_file_that_is_not_a_report_is_one_line(tmp_path, arts, capsys, text):
    report = tmp_path / "lc.json"
    report.write_bytes(text.encode("utf-8", "surrogateescape"))
    line = one_line_refusal(*deploy(capsys, arts["one"], report))
    assert f"--load-check {report}" in line


# ---------------------------------------------------------------------------------- load-times.json (recorded)


def test_a_damaged_recorded_load_is_one_line_never_a_crash(tmp_path, arts, capsys):
    """The load `qvl load-check` recorded is read without --load-check: NaN there crashed deploy the same way."""
    from qwenvl_rbln.artifacts.load_times import load_times_path, record_load

    record_load(arts["one"], 40.0)
    args = ["deploy", str(arts["one"]), "--artifact", "pvc:models", "--image", IMAGE, "--dry-run", "--json"]
    code, out, err = run_main(args, capsys)
    assert code == 0 and json.loads(out)["startup_budget_s"] == 300, err
    data = json.loads(load_times_path().read_text())
    key = next(iter(data["entries"]))
    for bad in (float("nan"), float("inf"), 0, -3, True, None, "40"):
        data["entries"][key]["seconds"] = bad
        load_times_path().write_text(json.dumps(data))
        line = one_line_refusal(*run_main(args, capsys))
        assert str(load_times_path()) in line and "not a load time" in line and "None" not in line
    data["entries"][key] = 40.0  # a bare number where the entry's table belongs
    load_times_path().write_text(json.dumps(data))
    line = one_line_refusal(*run_main(args, capsys))
    assert str(load_times_path()) in line and "holds 40.0 (not a table)" in line and "damaged" in line


# ------------------------------------------------------------------------------------------- property-based


def _number():
    return st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(10**30), max_value=10**30),
        st.booleans(),
        st.none(),
        st.text(max_size=5),
    )


def _runtime(hash_ok: bool, ours: str):
    return st.fixed_dictionaries(
        {},
        optional={
            "ok": st.one_of(st.booleans(), st.none(), st.integers(0, 2)),
            "create_runtimes": st.one_of(st.booleans(), st.none()),
            "seconds": _number(),
            "error": st.one_of(st.text(max_size=20), st.integers(), st.none()),
            "graph_hash": st.just(ours) if hash_ok else st.one_of(st.text(max_size=8), st.integers(), st.none()),
        },
    )


def _documents(ours: str, artifact: str):
    """Report-shaped documents (right and wrong in every field) and arbitrary JSON."""
    report = st.fixed_dictionaries(
        {"runtime": st.booleans().flatmap(lambda ok: _runtime(ok, ours))},
        optional={
            "emulated": st.one_of(st.booleans(), st.none(), st.integers(0, 1)),
            "artifact_dir": st.one_of(st.just(artifact), st.text(max_size=10), st.none()),
            "kind": st.sampled_from(["rbln", "torch"]),
        },
    )
    scalars = st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text(max_size=8))
    anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=8), inner, max_size=3), max_leaves=8)  # fmt: skip
    return st.one_of(report, anything)


def test_any_document_is_used_or_refused_with_a_cause_never_an_internal_error(tmp_path, arts):
    """Random valid and invalid --load-check documents through deploy's reader: a used one gives a finite,
    positive load of at most a day, and only when it is a real NPU load of this artifact; every other document is
    an InputError with a fix. (`qvl tune` reads no load-check report: nothing to feed it.)"""
    from qwenvl_rbln.artifacts.load_times import MAX_LOAD_S
    from qwenvl_rbln.deploy.sizing import load_budget

    art = arts["one"]
    ours = graph_hash(art, read_manifest(art))
    report = tmp_path / "lc.json"

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(_documents(ours, str(art)))
    @example({"runtime": {"ok": True, "create_runtimes": True, "seconds": float("nan"), "graph_hash": ours},
              "emulated": False})  # fmt: skip
    @example({"runtime": {"ok": True, "create_runtimes": True, "seconds": 1e12, "graph_hash": ours}, "emulated": False})
    @example({"runtime": {"ok": True, "create_runtimes": True, "seconds": 20, "graph_hash": ours}, "emulated": False})
    def check(doc):
        report.write_text(json.dumps(doc))
        try:
            seconds = read_load_check(report, art)
        except InputError as exc:
            assert exc.message.startswith(f"--load-check {report}: ") and exc.hint
            assert exc.message.isprintable()  # one line, no escape sequence from the document
            return
        runtime = doc["runtime"]
        assert doc.get("emulated") is False and runtime["ok"] is True and runtime["create_runtimes"] is True
        assert runtime.get("graph_hash") == ours or (
            "graph_hash" not in runtime and doc.get("artifact_dir") == str(art)
        )
        assert math.isfinite(seconds) and 0 < seconds <= MAX_LOAD_S and seconds == runtime["seconds"]
        budget = load_budget(seconds, 10**9, "the report")
        assert budget["budget_s"] >= 300 and budget["progress_deadline_s"] < 2**31  # an int32 in the manifest

    check()
