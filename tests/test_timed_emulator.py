"""The timed emulator (backends/emulator/timed.py) and bench-serve's timed figures (serving/timed_bench.py), without
an engine: which call is which, the hold (CPU work inside it, overruns counted, never hidden), the call lines read
back over a window, and vLLM's own figures with the scale taken out. Emulated: no NPU ran."""

from __future__ import annotations

import json
import time

import pytest

torch = pytest.importorskip("torch")

from qwenvl_rbln.backends.emulator import rebel_api, timed  # noqa: E402
from qwenvl_rbln.serving import timed_bench  # noqa: E402
from qwenvl_rbln.tuning.device_time import linear_model  # noqa: E402

MODEL = linear_model(vit=(0.001, 0.0), prefill=(0.002, 0.0, 0.0), decode=(0.004, 0.0, 0.0), name="toy times")


def test_calls_are_classified_as_profile_and_the_time_model_name_them():
    prefill = [("inputs_embeds", [1, 128, 64], "float32"), ("cache_position", [1, 128], "int32")]
    pos = torch.arange(256, 384, dtype=torch.int32).reshape(1, 128)  # the third chunk of a prompt
    assert timed.classify(prefill, [torch.zeros(1, 128, 64), pos]) == timed.Call("prefill", 128, 384)
    decode = [("inputs_embeds", [4, 1, 64], "float32"), ("cache_position", [4, 1], "int32")]
    rows = torch.tensor([[40], [75], [0], [0]], dtype=torch.int32)  # two real rows, two padding rows at 0
    # each real row's context is its position + 1 (prompt + generated, the simulator's); the call's the longest
    assert timed.classify(decode, [torch.zeros(4, 1, 64), rows]) == timed.Call("decode", 4, 76, 2)
    lone = torch.tensor([[0], [9], [0], [0]], dtype=torch.int32)  # a lone real row in the second slot
    assert timed.classify(decode, [torch.zeros(4, 1, 64), lone]) == timed.Call("decode", 4, 10, 1)
    vit = [("hidden_states", [1024, 64], "float32"), ("attn_mask", [1, 1, 1024, 1024], "float32")]
    assert timed.classify(vit, [torch.zeros(1024, 64), torch.zeros(1, 1, 1024, 1024)]) == timed.Call("vit", 1024, 0)


def test_a_call_holds_for_its_device_time_times_the_scale_and_an_overrun_is_counted(tmp_path):
    timer = timed.Timer(MODEL, scale=10.0, stats_dir=tmp_path)
    since = time.time()
    start = time.perf_counter()
    timer.hold(start, timed.Call("decode", 2, 10, 2))
    assert time.perf_counter() - start >= 0.04  # 4 ms of device time x 10
    timer.hold(time.perf_counter() - 0.5, timed.Call("prefill", 128, 128))  # CPU took 0.5 s against a 20 ms hold
    stats = timed.read_stats(tmp_path, since, time.time())
    assert (stats.calls, stats.overruns, stats.valid) == (2, 1, False)
    assert stats.overruns_by_kind == {"prefill": 1} and stats.by_kind == {"decode": 1, "prefill": 1}
    assert stats.device_s == pytest.approx(0.006)
    assert stats.worst_cpu_share >= 0.5 / 0.02
    assert timed.read_stats(tmp_path, time.time() + 1).calls == 0  # outside the window: not counted


def test_the_runtime_holds_each_graph_call_under_the_environment_model(tmp_path, monkeypatch):
    model_file = tmp_path / "model.json"
    model_file.write_text(json.dumps(MODEL.to_json()))
    for key, value in timed.environment(model_file, 20.0, tmp_path / "stats").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(timed, "_reader", None)
    with pytest.raises(RuntimeError, match="no device-time model reader"):  # nothing above registered one
        timed.configured()
    timed._cache.clear()
    from qwenvl_rbln import vllm_plugin

    vllm_plugin.register()  # in a vLLM process qvl's plugin gives the emulator the tuning layer's reader
    lin = torch.nn.Linear(4, 2)
    rt = rebel_api.Runtime(rebel_api.compile_from_torch(lin, [("x", [2, 4], "float32")], npu="RBLN-CR13"), device=0)
    since = time.time()
    with rebel_api.capture_reports() as reports:
        rt(torch.randn(2, 4))  # no cache_position: a ViT call of bucket 2, 1 ms x 20
    assert reports[0]["total_device"] >= 20_000  # microseconds
    stats = timed.read_stats(tmp_path / "stats", since, time.time())
    assert (stats.calls, stats.by_kind, stats.valid) == (1, {"vit": 1}, True)
    monkeypatch.setenv(timed.SCALE_ENV, "-1")
    with pytest.raises(RuntimeError, match="QVL_EMULATE_TIME_SCALE"):
        rt(torch.randn(2, 4))


def test_bench_serve_figures_are_vllms_own_percentiles_with_the_scale_taken_out(emulated):
    """The figures are read from vLLM's own result (its calculate_metrics, np.percentile over the per-request
    lists), and divided by the scale: checked against numpy on the same lists. (``emulated``: vllm-rbln's platform
    plugin imports rebel with vLLM.)"""
    np = pytest.importorskip("numpy")
    serve = pytest.importorskip("vllm.benchmarks.serve")
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    rng = np.random.default_rng(1)
    outputs = []
    for i in range(9):
        itl = list(rng.uniform(0.1, 0.3, 5))
        ttft = float(rng.uniform(0.2, 2.0))
        outputs.append(RequestFuncOutput(generated_text="x" * 6, success=True, latency=ttft + sum(itl), ttft=ttft,
                                         itl=itl, prompt_len=10, output_tokens=6, start_time=float(i)))  # fmt: skip
    requests = [serve.SampleRequest(prompt="p", prompt_len=10, expected_output_len=6) for _ in outputs]
    metrics, _ = serve.calculate_metrics(requests, outputs, 12.0, None, [50.0, 90.0, 99.0], {})
    result = {"completed": metrics.completed, "failed": metrics.failed, "duration": 12.0}
    result.update(request_throughput=metrics.request_throughput, output_throughput=metrics.output_throughput)
    for name in ("ttft", "tpot", "itl"):
        for p, value in getattr(metrics, f"percentiles_{name}_ms"):
            result[f"p{int(p) if int(p) == p else p}_{name}_ms"] = value  # serve.py's own key (p_word)
    got = timed_bench.figures(result, 100.0)
    ttfts = [o.ttft for o in outputs]
    itls = [x for o in outputs for x in o.itl]
    tpots = [(o.latency - o.ttft) / 5 for o in outputs]
    for p in (50, 90, 99):
        assert got[f"p{p}_ttft_ms"] == pytest.approx(np.percentile(ttfts, p) * 1000 / 100)
        assert got[f"p{p}_itl_ms"] == pytest.approx(np.percentile(itls, p) * 1000 / 100)
        assert got[f"p{p}_tpot_ms"] == pytest.approx(np.percentile(tpots, p) * 1000 / 100)
    assert got["duration_s"] == pytest.approx(0.12)
    assert got["output_throughput"] == pytest.approx(54 / 12.0 * 100)


def test_bench_argv_sends_poisson_arrivals_uncapped_and_saves_every_list(tmp_path):
    base = ["vllm", "bench", "serve", "--max-concurrency", "2", "--port", "1"]
    argv = timed_bench.bench_argv(base, 0.25, tmp_path / "r.json")
    assert "--max-concurrency" not in argv
    assert argv[argv.index("--request-rate") + 1] == "0.25"
    assert {"--save-result", "--save-detailed"} <= set(argv)
    assert argv[argv.index("--metric-percentiles") + 1] == "50,90,99"


def test_bench_serve_time_model_refusals_are_one_line_and_the_dry_run_shows_both_commands(tmp_path, capsys):
    from tests.fakes_rbln import run_main
    from tests.test_serve_emulate import emulated_artifact

    art = emulated_artifact(tmp_path / "emu")
    model_file = tmp_path / "times.json"
    model_file.write_text(json.dumps(MODEL.to_json()))
    base = ["bench-serve", str(art), "--time-model", str(model_file)]
    code, _, err = run_main(base, capsys)  # no --emulate
    assert code == 2 and "need --emulate" in err and "Traceback" not in err
    code, _, err = run_main([*base, "--emulate", "--time-scale", "0"], capsys)
    assert code == 2 and "--time-scale 0.0 is not a positive number" in err
    code, _, err = run_main([*base[:3], str(tmp_path / "missing.json"), "--emulate"], capsys)
    assert code == 2 and "cannot be read as a device-time model" in err and "Traceback" not in err
    code, out, err = run_main([*base, "--emulate", "--time-scale", "50", "--request-rate", "2", "--dry-run", "--json"],
                              capsys)  # fmt: skip
    assert code == 0, err
    shown = json.loads(out)
    assert shown["serve"]["argv"][:2] == ["vllm", "serve"] and shown["bench"]["argv"][:3] == ["vllm", "bench", "serve"]
    assert shown["rates"] == [2.0] and shown["serve"]["env"]["QVL_EMULATE_NPU"] == "1"


def test_a_decode_and_a_sampler_call_hold_for_what_the_simulator_charges():
    """The emulator's hold and the simulator's step cost agree: a decode at the longest real row's context (position +
    1) over its real rows, the sampler at ``DeviceTimeModel.sampler`` of the logits' padded rows."""
    from qwenvl_rbln.tuning.device_time import time_model_for
    from qwenvl_rbln.tuning.simulate import Engine, StepCosts

    model = time_model_for(model="Qwen/Qwen3-VL-2B-Instruct", chunk=128, block=4096)
    info = [("inputs_embeds", [4, 1, 64], "float32"), ("cache_position", [4, 1], "int32")]
    pos = torch.tensor([[900], [1999], [0], [0]], dtype=torch.int32)  # two real rows: contexts 901 and 2000
    call = timed.classify(info, [torch.zeros(4, 1, 64), pos])
    engine = Engine(batch=4, chunk=128, block_size=4096, num_blocks=4, max_model_len=4096, graphs=(1, 2, 4))
    _, device, _ = StepCosts(engine, model).decode(2, 2000)  # the simulator's LONGEST: graph 2 + sampler on 2 rows
    graph = engine.decoder_graphs()[1]
    assert timed.device_seconds(model, call) == pytest.approx(model.decode(4, 2000, rows=2))
    assert model.sampler(engine.sampler_rows(2)) > 0
    sampler = timed.device_seconds(model, timed.Call("sampler", engine.sampler_rows(2), 0))
    assert sampler == pytest.approx(model.sampler(2))
    assert device == pytest.approx(model.decode(graph, 2000, rows=2) + sampler)
