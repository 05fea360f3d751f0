"""Device-speed emulation (``--emulate-speed device``, backends/emulator/timed.py and engine.py): graph and sampler
calls return zeros of their declared shapes without computing, hold for their device time and are logged; and the
command-line side (serve / bench-serve refusals and defaults, the --time-model checks of the audit's L1 and L7).
Emulated: no NPU ran."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from qwenvl_rbln.backends.emulator import engine, rebel_api, timed  # noqa: E402
from qwenvl_rbln.tuning.device_time import linear_model  # noqa: E402

MODEL = linear_model(vit=(0.004, 0.0), prefill=(0.004, 0.0, 0.0), decode=(0.004, 0.0, 0.0), name="toy times")


class WithSampler:
    """A time model with the optional sampler figure (tuning.simulate's developer defines the real one)."""

    name = "toy times with a sampler"

    def vit(self, bucket):
        return 0.004

    def prefill(self, chunk, context):
        return 0.004

    def decode(self, batch, context, rows=None):
        return 0.004

    def sampler(self, rows):
        return 0.003


@pytest.fixture
def device_speed(tmp_path, monkeypatch):
    model_file = tmp_path / "model.json"
    model_file.write_text(json.dumps(MODEL.to_json()))
    for key, value in timed.environment(model_file, 1.0, tmp_path / "stats", "device").items():
        monkeypatch.setenv(key, value)
    timed._cache.clear()
    from qwenvl_rbln import vllm_plugin

    vllm_plugin.register_time_model_reader()
    yield tmp_path / "stats"
    timed._cache.clear()


def _decoder():
    class Dec(torch.nn.Module):
        def forward(self, x, cache_position):
            return x * 2.0 + cache_position.float().sum()

    info = [("x", [2, 1, 8], "float32"), ("cache_position", [2, 1], "int32")]
    return rebel_api.compile_from_torch(Dec(), info, npu="RBLN-CR13")


def test_a_device_speed_call_returns_declared_zeros_without_computing_and_holds(device_speed, monkeypatch):
    compiled = _decoder()
    rt = rebel_api.Runtime(compiled, device=0)
    assert compiled._modules == [None]  # nothing built at device speed

    def boom(index):
        raise AssertionError("a graph was computed at device speed")

    monkeypatch.setattr(compiled, "module", boom)
    pos = torch.tensor([[40], [0]], dtype=torch.int32)  # one real row, one padding row
    since = time.time()
    start = time.perf_counter()
    out = rt(torch.ones(2, 1, 8), pos)
    assert time.perf_counter() - start >= 0.004  # the decode's device time at scale 1
    assert out.shape == (2, 1, 8) and out.dtype == torch.float32 and not out.any()
    buf = torch.full((2, 1, 8), float("nan"))
    assert rt(torch.ones(2, 1, 8), pos, out=buf) is buf and not buf.any()  # given buffers are zeroed in place
    stats = timed.read_stats(device_speed, since, time.time())
    assert (stats.calls, stats.by_kind, stats.valid) == (2, {"decode": 2}, True)
    line = next(device_speed.glob("calls-*.tsv")).read_text().splitlines()[0].split()
    assert line[1:4] == ["decode", "2", "41"] and line[7] == "1"  # the real rows, the context position + 1


def test_the_cpu_speed_computes_the_graph(tmp_path, monkeypatch):
    model_file = tmp_path / "model.json"
    model_file.write_text(json.dumps(MODEL.to_json()))
    for key, value in timed.environment(model_file, 1.0, None, "cpu").items():
        monkeypatch.setenv(key, value)
    timed._cache.clear()
    from qwenvl_rbln import vllm_plugin

    vllm_plugin.register_time_model_reader()
    rt = rebel_api.Runtime(_decoder(), device=0)
    out = rt(torch.ones(2, 1, 8), torch.tensor([[3], [0]], dtype=torch.int32))
    assert torch.allclose(out, torch.full((2, 1, 8), 5.0))
    timed._cache.clear()


def test_device_speed_refuses_an_unknown_speed_and_a_missing_model(monkeypatch):
    monkeypatch.setenv(timed.SPEED_ENV, "warp")
    timed._cache.clear()
    with pytest.raises(RuntimeError, match="QVL_EMULATE_SPEED='warp'"):
        timed.configured()
    monkeypatch.setenv(timed.SPEED_ENV, "device")
    monkeypatch.delenv(timed.MODEL_ENV, raising=False)
    with pytest.raises(RuntimeError, match="needs a device-time model"):
        timed.configured()
    timed._cache.clear()


def test_the_sampler_is_a_logged_call_held_for_the_models_sampler_time(device_speed, monkeypatch):
    def greedy(logits):
        return (logits.argmax(dim=-1),)

    run = engine.rbln_backend(type("GM", (), {"forward": staticmethod(greedy)})(), [])
    logits = torch.zeros(3, 10)
    logits[:, 7] = 1.0
    since = time.time()
    (first,) = run(logits)  # the first call at these shapes runs (the output spec is learnt from it)
    assert first.tolist() == [7, 7, 7]
    (second,) = run(logits)  # then zeros of that spec, nothing computed
    assert second.dtype == torch.int64 and second.tolist() == [0, 0, 0]
    stats = timed.read_stats(device_speed, since, time.time())
    assert stats.by_kind == {"sampler": 2} and stats.valid  # no sampler figure: not held, never an overrun
    timer = timed.configured()
    monkeypatch.setattr(timer, "model", WithSampler())
    start = time.perf_counter()
    run(logits)
    assert time.perf_counter() - start >= 0.003  # the model's sampler(rows) figure


def test_read_stats_reads_the_seven_column_lines_of_older_logs(tmp_path):
    (tmp_path / "calls-1.tsv").write_text("100.0 decode 2 40 0.001 0.0001 0.001\n100.5 sampler 2 0 0 0.00001 0\n")
    stats = timed.read_stats(tmp_path)
    assert (stats.calls, stats.overruns, stats.by_kind) == (2, 0, {"decode": 1, "sampler": 1})


# ----------------------------------------------------------------------------------------------- the commands


@pytest.fixture
def art(tmp_path):
    from tests.test_serve_emulate import emulated_artifact

    return emulated_artifact(tmp_path / "emu")


def _model_file(tmp_path, spec):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(spec))
    return str(path)


def test_bench_serve_refuses_time_models_that_cannot_time_the_artifact_before_starting(art, tmp_path, capsys):
    """The audit's L1: each of these started a server that could only end invalid or hang."""
    from tests.fakes_rbln import run_main

    base = ["bench-serve", str(art), "--emulate", "--time-model"]
    cases = {
        "timings:" + str(tmp_path / "nonexistent.json"): "nonexistent.json is not a file",
        _model_file(tmp_path, {"kind": "linear", "vit": [True, False], "prefill": [0.1, 0, 0], "decode": [0.1, 0, 0]}):
            "vit=[True, False] is not 2 numbers",
        _model_file(tmp_path, {"kind": "linear", "vit": [0, 0], "prefill": [0, 0, 0], "decode": [0, 0, 0]}):
            "a call that takes no time cannot be held",
        _model_file(tmp_path, {"kind": "linear", "vit": [1e9, 0], "prefill": [1, 0, 0], "decode": [1, 0, 0]}):
            "over an hour per call",
    }  # fmt: skip
    for spec, why in cases.items():
        code, _, err = run_main([*base, spec], capsys)
        assert code == 2 and why in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_the_time_scale_defaults_and_needs_a_time_model(art, tmp_path, capsys):
    """The audit's L7: scale 1 at device speed (the point of it), 3000 for the CPU-computing timed emulator (a
    default of 1 was invalid by construction), and --time-scale alone is refused instead of silently ignored."""
    from tests.fakes_rbln import run_main

    model = _model_file(tmp_path, MODEL.to_json())
    base = ["bench-serve", str(art), "--emulate", "--dry-run", "--json"]
    code, out, err = run_main([*base, "--time-model", model, "--emulate-speed", "device"], capsys)
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["speed"], shown["time_scale"]) == ("device", 1.0)
    code, out, err = run_main([*base, "--time-model", model], capsys)
    assert code == 0 and json.loads(out)["time_scale"] == 3000.0, err
    code, _, err = run_main([*base[:3], "--time-scale", "100"], capsys)
    assert code == 2 and "--time-scale 100 scales the timed emulator's holds: it needs --time-model" in err
    code, _, err = run_main([*base[:3], "--emulate-speed", "device"], capsys)
    assert code == 2 and "needs --time-model" in err
    code, _, err = run_main(["bench-serve", str(art), "--time-model", model, "--emulate-speed", "device"], capsys)
    assert code == 2 and "need --emulate" in err


def test_serve_at_device_speed_sets_the_hold_and_refuses_a_fleet(art, tmp_path, capsys):
    from tests.fakes_rbln import run_main

    model = _model_file(tmp_path, MODEL.to_json())
    base = ["serve", str(art), "--emulate", "--emulate-speed", "device", "--time-model", model]
    code, out, err = run_main([*base, "--dry-run", "--json"], capsys)
    assert code == 0, err
    shown = json.loads(out)
    assert shown["env"][timed.SPEED_ENV] == "device" and shown["env"][timed.SCALE_ENV] == "1.0"
    assert json.loads(Path(shown["env"][timed.MODEL_ENV]).read_text())["name"] == "toy times"
    assert any(c["check"] == "emulate speed" and "meaningless" in c["detail"] for c in shown["checks"])
    code, _, err = run_main([*base, "--workers", "2", "--dry-run"], capsys)
    assert code == 2 and "serves one engine, not a fleet" in err
    code, _, err = run_main(["serve", str(art), "--emulate", "--time-model", model, "--dry-run"], capsys)
    assert code == 2 and "--time-model only with --emulate-speed device" in err


def test_host_time_on_an_npu_host_starts_the_real_engine_with_the_step_log(tmp_path, capsys):
    """``--host-time`` without --emulate: bench-serve's own server is the NPU's engine (no emulator, no hold, scale
    1); the step log is switched on when it starts (``timed_bench.run``), so the dry run shows the plain serve line."""
    from tests.fakes_rbln import run_main
    from tests.test_serve_emulate import emulated_artifact

    art = emulated_artifact(tmp_path / "npu", emulated=False)
    code, out, err = run_main(["bench-serve", str(art), "--host-time", "--dry-run", "--json"], capsys)
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["speed"], shown["time_scale"], shown["rates"]) == ("npu", 1.0, [float("inf")])
    assert shown["serve"]["argv"][:2] == ["vllm", "serve"] and not any("EMULATE" in k for k in shown["serve"]["env"])
    code, _, err = run_main(["bench-serve", str(art), "--host-time", "--emulate-speed", "device", "--dry-run"], capsys)
    assert code == 2 and "need --emulate" in err
