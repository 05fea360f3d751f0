"""Property: any timings.json, valid or not, read by tune (load_measured, then the cost model's lookups and a whole
tune run) and by the reader deploy uses (deploy.sizing.prefill_throughput) is either used, every figure finite and
positive, or refused with a cause naming the file (InputError: one line, the "move it aside" fix). Never another
exception, which the CLI would print as `qvl: internal error`. Bounded examples, no deadline (a 2-core box)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.memory.calibration import model_key
from qwenvl_rbln.planning.catalogue.devices import REBEL100_COMPUTE
from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_2B
from qwenvl_rbln.tuning.fit import fit_quadratic
from qwenvl_rbln.tuning.measured import load_measured
from qwenvl_rbln.tuning.measured_roofline import MeasuredRoofline

MK = model_key(QWEN3_VL_2B)
NPU = "RBLN-CR13"
KEYS = [f"decoder_batch_{b}/block8192" for b in (1, 2, 3, 4)] + [
    "prefill/chunk512/block8192", "visual/call1200", "visual/call3520", "decoder_batch_1/block4096",
    "visual/call0", "decoder_batch_0/block8192", "visual/call" + "9" * 400, "prefill/chunk7/block8192"]  # fmt: skip
CONTEXTS = [None, 0, 1, 511.5, 4096, 100_000, 262_143, 10**7]
HOWS = {"measured", "fitted", "interpolated", "extrapolated"}

ANY = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.none(),
    st.booleans(),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
)
GOOD_S = st.floats(min_value=1e-4, max_value=5.0)


@st.composite
def records(draw) -> dict:
    """A graph record as qvl profile writes it: 1-4 contexts, p10 <= median <= p90, a qvl fit or none."""
    contexts = draw(st.lists(st.integers(0, 300_000), min_size=1, max_size=4, unique=True))
    pts = []
    for n in contexts:
        m, spread = draw(GOOD_S), draw(st.floats(min_value=0, max_value=0.5))
        pts.append({"context": n, "median_s": m, "p10_s": m * (1 - spread), "p90_s": m * (1 + spread)})
    fit = fit_quadratic([(p["context"], p["median_s"]) for p in pts]) if draw(st.booleans()) else None
    return {"points": pts, "fit": fit.to_dict() if fit else None}


@st.composite
def entries(draw) -> dict:
    return {
        "model_key": draw(st.sampled_from([MK, MK, MK, "another model"])),
        "npu": NPU,
        "emulated": False,
        "profiled_at": draw(st.sampled_from(["2026-12-03T10:00:00+00:00", "2026-12-04T10:00:00+00:00"])),
        "graph_hash": "h",
        "graphs": draw(st.dictionaries(st.sampled_from(KEYS), records(), min_size=1, max_size=5)),
    }


def _paths(value, at=()):
    """Every place in a JSON document (key paths), the document itself first."""
    yield at
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield from _paths(v, (*at, k))


@st.composite
def documents(draw) -> str:
    """A valid v2 file, then 0-2 damages: any value anywhere replaced by anything, or removed."""
    doc = {"format": "qvl-timings", "version": 2, "emulated": {},
           "entries": draw(st.dictionaries(st.text(max_size=6), entries(), min_size=1, max_size=2))}  # fmt: skip
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        at = draw(st.sampled_from(list(_paths(doc))[1:]))
        parent = doc
        for k in at[:-1]:
            parent = parent[k]
        if isinstance(parent, dict) and draw(st.integers(0, 4)) == 0:
            del parent[at[-1]]
        else:
            parent[at[-1]] = draw(ANY)
    return json.dumps(doc)


RAW = st.one_of(
    st.text(max_size=40),
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.text(max_size=4),
        lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
        max_leaves=8,
    ).map(json.dumps),
)
FILES = st.one_of(documents(), documents(), documents(), RAW, st.binary(max_size=20))


def _refusal(exc: InputError) -> None:
    assert "timings file" in exc.message and "\n" not in exc.message, exc.message
    assert "qvl profile" in (exc.hint or ""), exc.hint


@contextlib.contextmanager
def _home(content: str | bytes):
    """A private QVL_HOME holding the timings file (hypothesis runs many examples inside one test call)."""
    with tempfile.TemporaryDirectory() as home:
        path = Path(home) / "timings.json"
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
        old = os.environ.get("QVL_HOME")
        os.environ["QVL_HOME"] = home
        try:
            yield path
        finally:
            os.environ.pop("QVL_HOME") if old is None else os.environ.__setitem__("QVL_HOME", old)


def _figure(call) -> None:
    try:
        value = call()
    except InputError as exc:
        _refusal(exc)
    else:
        assert isinstance(value, float) and math.isfinite(value) and value > 0, value


@pytest.fixture(scope="module")
def deploy_art(tmp_path_factory):
    from qwenvl_rbln.planning.plan import build_plan
    from tests.fakes_rbln import write_artifact

    art = write_artifact(tmp_path_factory.mktemp("prop") / "art", build_plan("rebel100-1npu"))
    return tuple(json.loads((art / f).read_text()) for f in ("config.json", "rbln_config.json"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])  # fmt: skip
@given(content=FILES)
def test_every_timings_file_is_used_or_refused_with_a_cause(content, deploy_art):
    from qwenvl_rbln.deploy.sizing import prefill_throughput

    with _home(content) as path:
        try:
            measured = load_measured(MK, NPU, path)
        except InputError as exc:
            _refusal(exc)
            measured = None
        event("refused" if measured is None else f"used: {min(len(measured.graphs), 2)}+ graphs")
        for timing in measured.graphs.values() if measured else ():
            for context in CONTEXTS:
                seconds, how = timing.seconds(context)
                assert math.isfinite(seconds) and seconds > 0 and how in HOWS
                assert timing.label(how)
        if measured is not None:
            roof = MeasuredRoofline(QWEN3_VL_2B, REBEL100_COMPUTE, measured=measured, scale_unmeasured=True)
            for context in CONTEXTS[1:]:
                for b in (1, 2, 3, 4):
                    _figure(lambda b=b, c=context: roof.decode_step(b, b, float(c), 8192))
                _figure(lambda c=context: roof.prefill_chunk(int(c), 8192))
            for bucket in (1200, 3520, 256):
                _figure(lambda b=bucket: roof.vit_call(b))
        model_config, cfg = deploy_art
        try:
            out = prefill_throughput(model_config, cfg, NPU)
        except InputError as exc:  # a figure under its physical bound: refused (one line), never a crash
            _refusal(exc)
        else:
            tokens = out["tokens_per_s"]
            assert tokens is None and out["reason"] or isinstance(tokens, int) and 0 < tokens < 10**9, out


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    path = tmp_path_factory.mktemp("prop-wl") / "w.jsonl"
    path.write_text('{"width": 1280, "height": 720, "count": 10}\n{"width": 640, "height": 480, "count": 30}\n')
    return path


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])  # fmt: skip
@given(content=documents())
def test_tune_ranks_any_timings_file_or_refuses_it(content, workload):
    from qwenvl_rbln.tuning.search import Needs
    from qwenvl_rbln.tuning.tune import run_tune

    with _home(content):
        try:
            doc, _ = run_tune(Needs(model=None, context=262144, devices=1), workload)
        except InputError as exc:
            _refusal(exc)
            return
    for row in doc["candidates"]:
        assert math.isfinite(row["score"]) and row["score"] > 0
        est = row["estimate"]
        assert all(math.isfinite(est[k]) and est[k] > 0 for k in ("ttft_s", "tpot_s", "output_tokens_per_s"))
    scores = [r["score"] for r in doc["candidates"]]
    assert doc["best"]["score"] == min(scores)
