"""qvl tune --slo/--rate: each candidate's simulated capacity under the latency targets, the replicas and NPUs the
rate needs, the ranking by NPUs, the compile/serve/deploy commands with that replica count (and qvl deploy takes
it), an unreachable target named with its shortfall, and bad targets refused in one line."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest
import yaml

from qwenvl_rbln.artifacts.manifest import write_manifest
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import write_artifact
from tests.helpers_cli import run_qvl

ARGS = ["--context", "32768", "--sim-requests", "40"]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tune-capacity")
    (root / "w.jsonl").write_text(
        '{"width": 1280, "height": 720, "count": 3}\n{"width": 640, "height": 480, "count": 2}\n'
    )
    return root


def _tune(home: Path, *extra: str):
    return run_qvl("tune", "-w", str(home / "w.jsonl"), *ARGS, *extra, env={"QVL_HOME": str(home)})


@pytest.fixture(scope="module")
def sized(home):
    res = _tune(home, "--slo", "ttft_p90=150ms,tpot_p99=100ms", "--rate", "20", "--json")
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def test_every_candidate_has_its_capacity_and_fleet_and_the_table_is_ranked_by_npus(sized):
    sec = sized["capacity"]
    assert sec["targets"] == ["ttft_p90=150ms", "tpot_p99=100ms"] and sec["rate_rps"] == 20.0
    assert sized["needs"]["slo"] == sec["targets"]
    caps = [r["capacity"] for r in sized["candidates"]]
    assert len(caps) > 2 and all(c["capacity_rps"] > 0 for c in caps)
    for c in caps:
        assert c["replicas"] == math.ceil(20 / c["capacity_rps"]) and c["npus"] == c["replicas"]
        figures = c["at_capacity"]
        assert figures["ttft"]["p90"] <= 0.150 and figures["tpot"]["p99"] <= 0.100
    keys = [(c["npus"], -c["capacity_per_npu_rps"]) for c in caps]
    assert keys == sorted(keys)
    assert sized["best"]["batch_size"] == sized["candidates"][0]["batch_size"]
    assert sec["best"]["replicas"] == caps[0]["replicas"]


def test_the_commands_carry_the_replica_count_and_qvl_deploy_takes_it(sized, tmp_path):
    n = sized["capacity"]["best"]["replicas"]
    cmds = sized["commands"]
    assert cmds["replicas"] == n
    argv = shlex.split(cmds["deploy"])
    assert argv[:3] == ["qvl", "deploy", "qvl-out/tuned"] and argv[argv.index("--replicas") + 1] == str(n)
    assert "simulated capacity" in sized["preset"]["description"]
    # the same options on an artifact of the base preset: deploy writes that many replicas
    plan = build_plan("rebel100-1npu")
    art = write_artifact(tmp_path / "art", plan)
    write_manifest(
        art, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "Qwen/Qwen3-VL-2B-Instruct"}}
    )
    argv[2] = str(art)
    argv[argv.index("--artifact") + 1] = "pvc:models"
    argv[argv.index("--image") + 1] = "registry.internal/vllm-rbln:0.12.0"
    res = run_qvl(*argv[1:], "--dry-run", env={"QVL_HOME": str(tmp_path)})
    assert res.exit_code == 0, res.stderr
    text = res.stdout[res.stdout.index("# ---- deployment.yaml ----") :]
    deployment = yaml.safe_load(text.split("\n# ---- ")[0].split("\n", 1)[1])
    assert deployment["spec"]["replicas"] == n


def test_human_output_shows_the_capacity_table_and_the_fleet(home):
    res = _tune(home, "--slo", "ttft_p90=150ms", "--rate", "20")
    assert res.exit_code == 0, res.stderr
    assert "capacity under ttft_p90=150ms (vllm-rbln's scheduler simulated" in res.stdout
    assert "fleet 20 req/s:" in res.stdout and "--replicas" in res.stdout
    assert "numpy.percentile's default (linear), as vllm bench serve computes them" in res.stdout


def test_the_same_seed_gives_the_same_answer(home, sized):
    again = json.loads(_tune(home, "--slo", "ttft_p90=150ms,tpot_p99=100ms", "--rate", "20", "--json").stdout)
    assert [r["capacity"] for r in again["candidates"]] == [r["capacity"] for r in sized["candidates"]]


def test_an_unreachable_target_exits_4_naming_it_and_by_how_much(home):
    res = _tune(home, "--slo", "ttft_p50=1ms", "--rate", "20")
    assert res.exit_code == 4
    line = res.stderr.strip().splitlines()[-1]
    assert "no configuration meets the latency targets at any rate: ttft_p50=1ms is unreachable:" in line
    assert "at the lightest load" in line and "over (x" in line and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--slo", "ttft_p90=2"], "--slo target 'ttft_p90=2' has no unit"),
        (["--slo", "ttft_p95=2s"], "p95 is not p50, p90 or p99"),
        (["--slo", "ttft_p90=2s", "--rate", "0"], "--rate 0.0 is not a positive request rate"),
        (["--slo", "ttft_p90=2s", "--seed", "-1"], "--seed -1 is outside 0..4294967295"),  # numpy's seed range
    ],
)
def test_bad_targets_are_one_line_errors_naming_the_value_and_the_fix(home, extra, said):
    res = _tune(home, *extra)
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and said in lines[0] and "fix:" in lines[0], res.stderr


def test_a_replayed_arrival_trace_is_searched_instead_of_poisson(home):
    trace = home / "arrivals.txt"
    trace.write_text("\n".join(str(0.1 * i) for i in range(30)) + "\n")
    res = _tune(home, "--slo", "ttft_p90=150ms", "--arrivals", str(trace), "--json")
    assert res.exit_code == 0, res.stderr
    sec = json.loads(res.stdout)["capacity"]
    assert sec["arrivals"].startswith("the --arrivals trace (30 requests)") and sec["requests_per_run"] == 30
    bad = _tune(home, "--arrivals", str(trace))
    assert bad.exit_code == 2 and "--arrivals replays a trace for the serving simulation" in bad.stderr


def test_a_rate_alone_predicts_each_candidates_figures_on_one_replica(home):
    res = _tune(home, "--rate", "40", "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["capacity"]["targets"] == [] and "best" not in doc["capacity"]
    for row in doc["candidates"]:
        at = row["capacity"]["at_rate"]
        assert at["replica_rps"] == 40.0 and "capacity_rps" not in row["capacity"]
        assert at["ttft"]["p50"] <= at["ttft"]["p90"] <= at["ttft"]["p99"]
    # a smaller batch queues more at the same rate: its TTFT is no better
    by_batch = {r["batch_size"]: r["capacity"]["at_rate"]["ttft"]["p90"] for r in doc["candidates"]}
    assert by_batch[min(by_batch)] >= by_batch[max(by_batch)]
    assert "replicas" not in doc["commands"]
    human = _tune(home, "--rate", "40")
    assert human.exit_code == 0 and "at 40 req/s on one replica (vllm-rbln's scheduler simulated" in human.stdout


def test_the_workload_mix_becomes_request_kinds_with_packed_vit_calls():
    from qwenvl_rbln.tuning.fleet import kinds
    from qwenvl_rbln.tuning.workload import Work

    work = Work(
        path="w", requests=10, lines=2, distinct=2, errors=0, first_error=None, vit_buckets=[1024, 4096],
        vit_section={}, groups={}, prompt_tokens=100, output_tokens=8,
        mix={(900, 1, 230): 5, (200, 4, 210): 3, (1000, 3, 760): 2},
    )  # fmt: skip
    got = {(k.prompt, k.vit): k.weight for k in kinds(work, [1024, 4096])}
    # each request in the smallest bucket that holds one of its images (as tune's estimate and the packer):
    # 900 patches: one 1024 call; four 200-patch images share one 1024 call (5 fit); three of 1000: one 1024 call each
    assert got == {(330, (1024,)): 5.0, (310, (1024,)): 3.0, (860, (1024, 1024, 1024)): 2.0}
    # an image larger than every bucket cannot be served: it is left out, as tune's estimate leaves it
    assert {(k.prompt, k.vit) for k in kinds(work, [512])} == {(310, (512, 512))}


def test_the_host_time_source_and_the_npu_busy_share_are_named_in_json_and_the_table(home, sized):
    """No host_time in timings.json: the named default (this machine's measurement), never 0 in silence; every row
    its NPU busy share at capacity, and its capacity at the other context end."""
    sec = sized["capacity"]
    host = sec["host_time"]
    assert host["measured"] is False and host["source"].startswith("default: this machine's measurement")
    assert host["seconds"]["decode_base_s"] > 0 and host["host"]["cpu"]
    assert "assumed, not measured" in sec["sampler"]
    assert sec["decode_context"]["ranked"] == "longest" and sec["npu_busy_share"].startswith("NPU busy share")
    for row in sized["candidates"]:
        cap = row["capacity"]
        assert 0 < cap["npu_busy_share"] < 1 and cap["at_capacity"]["npu_busy_share"] == cap["npu_busy_share"]
        assert cap["own_context"]["capacity_rps"] >= 0.99 * cap["capacity_rps"]  # the lower end serves no less
    res = _tune(home, "--slo", "ttft_p90=150ms,tpot_p99=100ms", "--rate", "20")
    assert res.exit_code == 0, res.stderr
    out = " ".join(res.stdout.split())
    assert "NPU busy" in out and "own-context req/s" in out
    assert "host time default: this machine's measurement" in out
    assert "sampler assumed, not measured" in out and "decode rows ranked at the upper end" in out
    assert "NPU busy" in sized["preset"]["description"] and "host time this machine's default" in (
        sized["preset"]["description"])  # fmt: skip


def test_a_measured_host_time_in_timings_json_is_used_and_named(home, tmp_path, sized):
    from qwenvl_rbln.tuning.host_time import SECTION
    from qwenvl_rbln.tuning.measured import EMULATED, FORMAT, REAL, VERSION

    slow = {"prefill_base_s": 0.02, "decode_base_s": 0.02, "source": "measured on host-x at scale 1",
            "measured_at": "2026-12-06T05:00:00Z", "host": {"cpu": "test cpu"}}  # fmt: skip
    doc = {"format": FORMAT, "version": VERSION, REAL: {}, EMULATED: {}, SECTION: {"host-x": slow}}
    (tmp_path / "timings.json").write_text(json.dumps(doc))
    res = run_qvl("tune", "-w", str(home / "w.jsonl"), *ARGS, "--slo", "ttft_p90=150ms,tpot_p99=100ms", "--rate",
                  "20", "--json", env={"QVL_HOME": str(tmp_path)})  # fmt: skip
    assert res.exit_code == 0, res.stderr
    got = json.loads(res.stdout)
    host = got["capacity"]["host_time"]
    assert host["measured"] is True and host["source"] == "measured on host-x at scale 1"
    assert host["seconds"]["decode_base_s"] == 0.02 and host["host"] == {"cpu": "test cpu"}
    # 20 ms of host per step against the default's 3-4 ms: every row serves less, and its NPU is idler
    defaults = {(r["batch_size"], r["npus"]): r for r in sized["candidates"]}
    for mine in got["candidates"]:
        default = defaults[(mine["batch_size"], mine["npus"])]
        assert mine["capacity"]["capacity_rps"] < default["capacity"]["capacity_rps"]
        assert mine["capacity"]["npu_busy_share"] < default["capacity"]["npu_busy_share"]
