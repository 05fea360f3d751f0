"""New-user audit 2026-12-06, the input findings: M2 (a non-UTF-8 --arrivals file was an internal error), L2 (absurd
rates gave 0 ms figures and 48-digit replica counts; deploy wrote replicas no Deployment holds), L3 (bench-serve and
deploy gave serve's advice for an emulated artifact) and L9's small items. Each is one line, exit 2, naming the
value and the fix; what is sane still runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.tuning.capacity import check_rate, parse_slo, unreachable_text
from tests.fakes_rbln import run_main
from tests.test_serve_emulate import emulated_artifact

W = '{"width": 256, "height": 256, "count": 1}\n'


def one_line(capsys, *argv: str) -> str:
    code, out, err = run_main(list(argv), capsys)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert lines[0].startswith("qvl: error: ") and "; fix: " in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def workload(tmp_path) -> Path:
    path = tmp_path / "one256.jsonl"
    path.write_text(W)
    return path


@pytest.mark.parametrize("head", [b"\xff\xfe", b"\x80\xc6\x01"])
def test_a_non_utf8_arrivals_file_is_one_line(head, tmp_path, workload, capsys):
    bad = tmp_path / "a.txt"
    bad.write_bytes(head + "\n".join(str(i) for i in range(31)).encode())
    line = one_line(capsys, "tune", "-w", str(workload), "--context", "2048", "--rate", "50", "--arrivals", str(bad))
    assert f"--arrivals {bad} is not a UTF-8 text file" in line and "one number per line" in line


def test_a_non_utf8_batch_trace_gets_the_traces_fix(tmp_path, workload, capsys):
    bad = tmp_path / "t.txt"
    bad.write_bytes(b"\xff\xfe1\n2\n")
    line = one_line(capsys, "tune", "-w", str(workload), "--context", "2048", "--batch-trace", str(bad))
    assert "not a UTF-8 text file" in line and "batch trace is a JSON list of running batch sizes" in line
    assert "JSONL or CSV" not in line


@pytest.mark.parametrize("rate", [1e-12, 1e-4, 1e7, 1e300])
def test_rates_outside_what_the_simulation_answers_are_refused(rate):
    with pytest.raises(InputError, match=r"is outside 0\.001\.\.1e\+06 requests per second"):
        check_rate(rate, [])


@pytest.mark.parametrize("rate", [1e-3, 20.0, 1e6])
def test_rates_inside_pass(rate):
    check_rate(rate, [])


def test_the_lowest_rate_still_gives_device_times(tmp_path, workload, capsys):
    import json
    import math

    from qwenvl_rbln.tuning.capacity import RATE_MIN

    assert math.ulp(100_000 / RATE_MIN) < 1e-6  # the longest run's last arrival keeps a microsecond's precision
    args = ["tune", "-w", str(workload), "--context", "2048", "--json", "--rate", str(RATE_MIN)]
    code, out, err = run_main(args, capsys)
    assert code == 0, err
    at = json.loads(out)["candidates"][0]["capacity"]["at_rate"]
    assert at["ttft"]["p50"] > 0 and at["tpot"]["p50"] > 0  # 1e-12 req/s gave 0.0000 ms before


def test_sim_requests_without_a_simulation_is_refused_as_arrivals_is(workload, capsys):
    line = one_line(capsys, "tune", "-w", str(workload), "--context", "2048", "--sim-requests", "50")
    assert "--sim-requests sizes the runs for the serving simulation" in line and "add --slo and/or --rate" in line


def test_a_negative_target_is_not_a_positive_time_and_a_huge_shortfall_is_short():
    for text in ("ttft_p90=-2s", "ttft_p90=0s"):
        with pytest.raises(InputError, match="is not a positive time"):
            parse_slo(text)
    line = unreachable_text(
        [{"target": "ttft_p90=1e-297ms", "got_s": 1.65e-3, "over_s": 1.65e-3, "over_ratio": 1.6e297}]
    )
    assert "x1.6e+297" in line and len(line) < 200
    assert "x1647.87" in unreachable_text([{"target": "t", "got_s": 1.0, "over_s": 1.0, "over_ratio": 1647.871}])


@pytest.mark.parametrize(("replicas", "ok"), [("2147483647", True), ("2147483648", False), ("3000000000", False)])
def test_deploy_replicas_fit_a_deployments_int32(replicas, ok, tmp_path, capsys):
    from tests.test_deploy import IMAGE, _artifact

    art = _artifact(tmp_path / "one", "rebel100-1npu")
    args = ["deploy", str(art), "--artifact", "pvc:models", "--image", IMAGE, "--dry-run", "--replicas", replicas]
    if ok:
        code, out, err = run_main(args, capsys)
        assert code == 0 and f"replicas: {replicas}" in out, err
    else:
        line = one_line(capsys, *args)
        assert f"--replicas {replicas} is more than a Deployment holds" in line and "2147483647" in line


def test_an_emulated_artifact_gets_each_commands_own_advice(tmp_path, capsys):
    from tests.test_deploy import IMAGE

    art = emulated_artifact(tmp_path / "emu")
    line = one_line(capsys, "serve", str(art), "--dry-run")
    assert "`qvl serve --emulate DIR`" in line
    line = one_line(capsys, "bench-serve", str(art), "--dry-run")
    assert "`qvl bench-serve --emulate DIR`" in line
    line = one_line(capsys, "deploy", str(art), "--artifact", "pvc:models", "--image", IMAGE, "--dry-run")
    assert "a deployment needs a real compile" in line and "qvl bench-serve" not in line


@pytest.mark.parametrize(("flags", "said"), [(["--limit", "3"], "--limit only applies to a run")])
def test_wording(flags, said, tmp_path, capsys):
    results = tmp_path / "r.jsonl"
    results.write_text('{"id": "q1", "prediction": "a", "answers": ["a"]}\n')
    code, _, err = run_main(["eval", "--score", str(results), *flags], capsys)
    assert code == 2 and said in err, err


# ------------------------------------------------------------------------------------- L9: the fleet's log


def test_an_engine_that_exits_0_unasked_is_said_so_and_no_escape_reaches_the_log(tmp_path, capfd):
    """vLLM's API server exits 0 when its engine core dies; vllm-router colours its lines even into a pipe."""
    import sys

    from qwenvl_rbln.serving import fleet_run
    from tests.helpers_cli import free_port
    from tests.test_fleet_supervisor import router, run_with, until

    coloured = "print('\\x1b[2m2026\\x1b[0m \\x1b[32m INFO\\x1b[0m started', flush=True)"
    members = [
        fleet_run.Member("engine-0", [sys.executable, "-c", coloured], {}, "engine-0 | ",
                         health_url=f"http://127.0.0.1:{free_port()}/health"),
        router(),
    ]  # fmt: skip

    def script(fleet, seen, said):
        until(lambda: any("engine-0 exited with code 0" in s for s in said), "the exit")

    code, said, _ = run_with(members, script)
    assert any("exited with code 0 unasked (vLLM's API server exits 0 when its engine core dies)" in s for s in said)
    out = capfd.readouterr().out
    assert "engine-0 | 2026  INFO started" in out and "\x1b" not in out, repr(out[-500:])


def test_fleet_engines_leave_the_routers_load_polls_out_of_their_access_log(tmp_path, capsys):
    import json

    art = emulated_artifact(tmp_path / "art")
    code, out, err = run_main(["serve", str(art), "--emulate", "--workers", "2", "--dry-run", "--json"], capsys)
    assert code == 0, err
    engines = [p for p in json.loads(out)["processes"] if p["name"].startswith("engine")]
    for proc in engines:
        argv = proc["argv"]
        assert argv[argv.index("--disable-access-log-for-endpoints") + 1] == "/health,/get_load"
    extra = ["--", "--disable-access-log-for-endpoints=/metrics"]
    code, out, err = run_main(["serve", str(art), "--emulate", "--workers", "2", "--dry-run", "--json", *extra], capsys)
    assert code == 0, err
    for proc in json.loads(out)["processes"][:2]:
        assert "/health,/get_load" not in proc["argv"] and "--disable-access-log-for-endpoints=/metrics" in proc["argv"]


def test_a_huge_quoted_value_is_clipped_in_the_one_error_line(tmp_path, capsys):
    import json

    art = emulated_artifact(tmp_path / "art")
    model = tmp_path / "huge.json"
    model.write_text(json.dumps({"kind": "linear", "vit": [0.0] * 1_000_000}))
    line = one_line(capsys, "bench-serve", str(art), "--emulate", "--time-model", str(model), "--dry-run")
    assert len(line) < 2500 and "characters left out" in line and "vit=" in line and "fix: " in line


# --------------------------------------------------------------- L8: vllm bench serve by hand, no NPU here


def test_the_printed_bench_line_runs_by_hand(tmp_path, capsys):
    """`qvl bench-serve --emulate --dry-run` is a script: its environment lets the venv's `vllm bench serve` start
    (vllm-rbln's platform plugin imports rebel, which only the emulator's shim provides on this machine)."""
    import subprocess
    import sys

    art = emulated_artifact(tmp_path / "art")
    code, out, err = run_main(["bench-serve", str(art), "--emulate", "--dry-run"], capsys)
    assert code == 0, err
    script = tmp_path / "bench.sh"
    lines = out.strip().splitlines()
    lines[-1] = lines[-1].replace("vllm bench serve", "vllm bench serve --help", 1)
    script.write_text("\n".join(lines))
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "usage: vllm bench serve" in done.stdout, done.stderr[-3000:]
    bare = subprocess.run(["bash", "-c", lines[-1]], env=env, capture_output=True, text=True, timeout=300)
    assert bare.returncode != 0 and "No module named 'rebel'" in bare.stderr  # what the audit saw, without them
