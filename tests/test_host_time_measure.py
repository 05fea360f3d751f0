"""The host time per engine step, measured: the engine-step log (serving/step_log.py) around vLLM's EngineCore.step,
the fit by kind (tuning/host_measure.py) and the record in timings.json (tuning/host_time.py ``record``). Without an
engine: a stand-in engine core with vLLM's step signature; the engine test is tests/test_engine_device_speed.py."""

from __future__ import annotations

import contextlib
import json
import time
from types import SimpleNamespace

import pytest

from qwenvl_rbln.serving import step_log
from qwenvl_rbln.tuning import host_measure, host_time


def _reports(device_s):
    @contextlib.contextmanager
    def capture_reports():
        reports = []
        yield reports
        reports.append({"total_device": device_s * 1e6, "total_host": 0.0})

    return capture_reports


class Core:
    """vLLM's EngineCore.step in miniature: schedule, a model call inside rebel.capture_reports, update."""

    def __init__(self, plan, capture):
        self.plan = list(plan)  # (scheduler output, host seconds, device seconds, unfinished after)
        self.capture = capture
        self.scheduler = SimpleNamespace(schedule=self._schedule, has_requests=lambda: True)
        self.unfinished = 1
        self.scheduler.get_num_unfinished_requests = lambda: self.unfinished

    def _schedule(self):
        return self.current[0]

    def step(self):
        self.current = self.plan.pop(0)
        out = self.scheduler.schedule()
        time.sleep(self.current[1])  # the host's own work
        with self.capture():
            time.sleep(self.current[2])
        self.unfinished = self.current[3]
        return {}, out.total_num_scheduled_tokens > 0


def _out(tokens_per_req, new=0, images=0):
    reqs = [SimpleNamespace(mm_features=[object()] * images) for _ in range(new)]
    return SimpleNamespace(num_scheduled_tokens=dict(enumerate(tokens_per_req)),
                           total_num_scheduled_tokens=sum(tokens_per_req), scheduled_new_reqs=reqs,
                           scheduled_encoder_inputs={})  # fmt: skip


def test_each_step_is_logged_with_its_kind_and_the_runtimes_device_time(tmp_path):
    plan = [
        (_out([120], new=1, images=1), 0.004, 0.010, 1),  # a prefill with an image
        (_out([1]), 0.002, 0.003, 1),  # a decode of one row
        (_out([1, 1]), 0.002, 0.003, 0),  # a decode of two rows; then the engine idles
        (_out([]), 0.0, 0.0, 0),  # a step that scheduled nothing: not a step
        (_out([64], new=1), 0.003, 0.005, 0),
    ]
    real = _reports(0.0)  # the runtime's report: the emulated/real capture gives the device time it measured
    timed: list[float] = []

    @contextlib.contextmanager
    def runtime_capture():
        start = time.perf_counter()
        with real() as reports:
            yield reports
        reports[0]["total_device"] = (time.perf_counter() - start) * 1e6
        timed.append(reports[0]["total_device"] / 1e6)

    capture = step_log.counted(runtime_capture)
    core = Core(plan, capture)
    writer = step_log._Writer(tmp_path)
    step = step_log.wrap_step(Core.step, writer)
    since = time.time()
    for i in range(5):
        step(core)
        if i == 2:
            time.sleep(0.3)  # idle between bursts: no host work, never counted
    steps = step_log.read_steps(tmp_path, since, time.time())
    assert [(s.kind, s.tokens, s.rows, s.images) for s in steps] == [
        ("prefill", 120, 1, 1), ("decode", 1, 1, 0), ("decode", 2, 2, 0), ("prefill", 64, 1, 0)]  # fmt: skip
    logged = timed[:3] + timed[4:]  # the fourth step scheduled nothing: not logged
    assert [s.device_s for s in steps] == pytest.approx(logged, rel=1e-3)
    assert steps[0].device_s >= 0.010
    for s, host in zip(steps, (0.004, 0.002, 0.002, 0.003), strict=True):
        assert host <= s.host_s < host + 0.25, (s, host)  # generous: a loaded machine; the idle 0.3 s is not in it
    assert steps[3].host_s < 0.25  # after an idle engine the step counts from its own start


def test_a_fit_recovers_the_coefficients_and_says_what_it_could_not_measure():
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    steps = []
    for _ in range(40):
        tokens, images = int(rng.integers(50, 600)), int(rng.integers(0, 3))
        host = 0.002 + 1e-5 * tokens + 0.004 * images + rng.normal(0, 1e-4)
        steps.append(step_log.Step("prefill", tokens, 1, images, host, 0.0, 0.0))
    for _ in range(60):
        rows = int(rng.integers(1, 9))
        steps.append(step_log.Step("decode", 1, rows, 0, 0.001 + 0.0002 * rows + rng.normal(0, 5e-5), 0.0, 0.0))
    fit = host_measure.fit(steps, "test", {"cpu": "x"})
    m = fit.model
    assert m.prefill_base_s == pytest.approx(0.002, abs=3e-4)
    assert m.prefill_per_token_s == pytest.approx(1e-5, rel=0.1)
    assert m.prefill_per_image_s == pytest.approx(0.004, rel=0.1)
    assert m.decode_base_s == pytest.approx(0.001, abs=1e-4) and m.decode_per_row_s == pytest.approx(2e-4, rel=0.1)
    assert fit.kinds["decode"].rms_s < 1e-4 and fit.kinds["prefill"].unmeasured == ()
    assert set(fit.decode_by_rows) <= set(range(1, 9)) and m.source == "test" and m.host == {"cpu": "x"}
    # no image in the run and every prompt alike: those terms are not measured, never invented
    same = [step_log.Step("prefill", 100, 1, 0, 0.01 + rng.normal(0, 1e-4), 0.0, 0.0) for _ in range(5)]
    kinds = host_measure.fit(same, "t", {}).kinds["prefill"]
    assert kinds.unmeasured == ("prefill_per_token_s", "prefill_per_image_s")
    assert kinds.coefficients["prefill_base_s"] == pytest.approx(0.01, abs=5e-4)
    # a slope that noise made negative is dropped, not kept below zero
    falling = [step_log.Step("decode", 1, r, 0, 0.003 - 1e-5 * r, 0.0, 0.0) for r in (1, 2, 3, 4)]
    assert host_measure.fit(falling, "t", {}).model.decode_per_row_s == 0.0


def test_record_writes_the_host_time_section_atomically_and_keeps_the_rest(tmp_path):
    path = tmp_path / "timings.json"
    other = {"format": "qvl-timings", "version": 2, "entries": {"npu-entry": {"graphs": {}}}, "emulated": {}}
    path.write_text(json.dumps(other))
    model = host_time.HostTimeModel(prefill_base_s=0.02, decode_base_s=0.001, decode_per_row_s=1e-4,
                                    source="measured here", host={"cpu": "x", "loadavg": [1.0, 1.0, 1.0]})  # fmt: skip
    host_time.record(model, "vm | x | emulated device speed", path)
    host_time.record(host_time.HostTimeModel(decode_base_s=0.5, source="older"), "another", path)
    data = json.loads(path.read_text())
    assert data["entries"] == other["entries"] and set(data["host_time"]) == {"vm | x | emulated device speed",
                                                                              "another"}  # fmt: skip
    back = host_time.recorded(path, "vm | x | emulated device speed")
    assert back == model and back.host["loadavg"] == [1.0, 1.0, 1.0]
    assert host_time.recorded(path).source == "older"  # the newest entry by default
    assert not list(tmp_path.glob(".*qvl-tmp*"))  # the temp file was renamed into place
    path.write_text(json.dumps({"format": "qvl-timings", "version": 1}))
    from qwenvl_rbln.errors import InputError

    with pytest.raises(InputError, match="version 1"):
        host_time.record(model, "k", path)


def test_the_plugin_installs_the_step_log_only_where_it_is_asked(monkeypatch, tmp_path):
    monkeypatch.delenv(step_log.ENV, raising=False)
    monkeypatch.setattr(step_log, "_installed", False)
    assert step_log.install(lambda m: None) is False
    warned = []
    monkeypatch.setenv(step_log.ENV, str(tmp_path))
    monkeypatch.setattr(step_log.importlib if hasattr(step_log, "importlib") else __import__("importlib"),
                        "import_module", lambda name: (_ for _ in ()).throw(ImportError(name)))  # fmt: skip
    assert step_log.install(warned.append) is False and "could not be installed" in warned[0]


def test_the_report_shows_host_time_by_kind_and_where_it_was_recorded():
    from rich.console import Console

    from qwenvl_rbln.views.timed_bench import human

    steps = [step_log.Step("prefill", 100 + 50 * i, 1, i % 2, 0.01 + 0.05 * (i % 2), 0.002, 0.0) for i in range(6)]
    steps += [step_log.Step("decode", 1, 1 + i % 2, 0, 0.002 + 0.001 * (i % 2), 0.001, 0.0) for i in range(10)]
    fit = host_measure.fit(steps, "measured here", {"cpu": "x"})
    calls = {"overruns": 0, "calls": 9, "cpu_share": 0.1, "worst_cpu_share": 0.5}
    run = {"rate": float("inf"), "completed": 4, "failed": 0, "request_throughput": 1.0, "output_throughput": 9.0,
           "valid": True, "emulator_share": 0.004, "calls": calls,
           **{f"p{p}_{m}_ms": 1.0 for p in (50, 90, 99) for m in ("ttft", "tpot", "itl")}}  # fmt: skip
    doc = {"label": "emulated at device speed: ... the output tokens are meaningless", "time_scale": 1.0,
           "speed": "device", "runs": [run], "host_time": {"steps": 16, "fit": fit.to_dict(),
           "recorded": "recorded in T, host_time['k']"}}  # fmt: skip
    console = Console(width=300, record=True)
    human(console, doc)
    text = console.export_text()
    assert "meaningless" in text and "wall time at scale 1" in text and "emulator's own work 0.4%" in text
    assert "host time per engine step" in text and "measured here" in text
    assert "prefill:" in text and "1 image(s) 58.00 ms" in text and "decode:" in text and "2 row(s) 2.00 ms" in text
    assert "recorded in T" in text
