"""Verdict explanations never contradict their numbers (issue 25 item 1).

The gate line, each device's notes and the view name the binding constraint (the card total or its fullest
chiplet) with its own numbers; a property test draws many configurations and checks every number each message
quotes supports the verdict it explains.
"""

from __future__ import annotations

import io
import json
import re

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from qwenvl_rbln.memory.planner import estimate_plan
from qwenvl_rbln.memory.verdicts import gate_message, verdict_of
from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.views.memory import print_memory
from tests.helpers_cli import run_qvl

NUM = r"([0-9]+\.[0-9]+)"
SIGNED = r"([+-][0-9]+\.[0-9]+)"
CLAUSE = re.compile(
    rf"(the card total|the fullest chiplet) needs {NUM}(?: \.\. {NUM})? of {NUM} GiB "
    rf"\(margin {SIGNED}(?: \.\. {SIGNED})? GiB\)"
)
FINE = re.compile(rf"(the card total|the fullest chiplet) fits in every scenario \(margin {SIGNED} GiB at worst\)")
NO_ROOM = re.compile(rf"for the LM alone \({NUM} GiB of {NUM} GiB budget\); the ViT on the same device needs {NUM}")
CHIP_OVER = re.compile(
    rf"fullest chiplet is over \({NUM} GiB of {NUM} GiB\) although the card total fits \({NUM} GiB of {NUM}"
)
VIEW_LINE = re.compile(
    rf"device \d+: (fits|does not fit|uncertain): [^\n]*?"
    rf"(fullest chiplet margin {SIGNED}(?: \.\. {SIGNED})? GiB)?(?:; card|, margin)"
)
EPS = 0.006  # two decimals


def check_clauses(text: str, verdict: str) -> int:
    """Every 'X needs A .. B of U GiB (margin W .. Z)' clause in ``text`` supports ``verdict``; returns how many."""
    found = 0
    for m in CLAUSE.finditer(text):
        found += 1
        low = float(m.group(2))
        high = float(m.group(3) or m.group(2))
        usable = float(m.group(4))
        worst = float(m.group(5))
        best = float(m.group(6) or m.group(5))
        assert abs((usable - high) - worst) < EPS and abs((usable - low) - best) < EPS, text
        assert high > usable - EPS and worst < EPS, f"a binding limit that is never crossed: {text}"
        if verdict == "uncertain":
            assert best > -EPS, f"uncertain, yet the limit is crossed in every scenario: {text}"
        if verdict == "does_not_fit":
            assert low > usable - EPS and best < EPS, f"does not fit, yet the limit holds in some scenario: {text}"
    for m in FINE.finditer(text):
        assert float(m.group(2)) > -EPS, text
    return found


def check_decided(dev: dict, kv: dict) -> None:
    """What a device's verdict line names as deciding really decides it: a memory limit crossed in some scenario
    (every one for does_not_fit when one is), never one that always holds; a fit's tightest limit holds."""
    d, verdict = dev["decided_by"], dev["verdict"]
    if d["constraint"] in ("device", "chiplet"):
        crossed = d["need_high_bytes"] > d["usable_bytes"]
        assert crossed == (verdict != "fits"), d
    elif d["constraint"] == "kv_blocks":
        assert verdict != "fits" and d["blocks_low"] < d["minimum"], d
        assert [d["blocks_low"], d["blocks_high"]] == kv["num_blocks_range"], d
    else:
        assert d["constraint"] in ("observed", "split"), d


def check_notes(dev: dict) -> None:
    for note in dev["notes"]:
        m = NO_ROOM.search(note)
        if m:  # "loading fails" is a claim that the card total is over
            lm, vis, usable = float(m.group(1)), float(m.group(3)), dev["usable_bytes"] / (1 << 30)
            assert lm + vis > usable - EPS, note
        m = CHIP_OVER.search(note)
        if m:
            assert float(m.group(1)) > float(m.group(2)) - EPS and float(m.group(3)) < float(m.group(4)) + EPS, note
        if dev["verdict"] == "uncertain" and "loading fails" in note:
            assert note.startswith("at the estimate") or note.startswith("the planner alone"), note
        check_clauses(note, dev["verdict"])


PRESETS = ["rebel100-1npu", "rebel100-1npu-batch4", "rebel100-2npu-batch4", "rebel100-1npu-vit-buckets"]


@st.composite
def configurations(draw):
    preset = draw(st.sampled_from(PRESETS))
    batch = draw(st.integers(1, 8))
    sets = [
        f"max_seq_len={draw(st.integers(2, 32)) * 8192}",
        f"batch_size={batch}",
        f"decoder_batch_sizes=[{batch}]",
        f"visual.max_seq_len=[{draw(st.sampled_from([1024, 4096, 8192, 12288, 16384, 20480]))}]",
    ]
    if draw(st.booleans()):
        sets.append(f"placement.visual_device={draw(st.sampled_from([0, 1]))}")
    memory = draw(st.sampled_from([None, "96GiB", "120GiB", "140GiB", "36GiB"]))
    return preset, sets, memory


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configurations())
@example(("rebel100-1npu-batch4", ["max_seq_len=180224"], None))
def test_every_message_s_numbers_support_its_verdict(config):
    preset, sets, memory = config
    plan = build_plan(preset, sets)
    report = estimate_plan(plan, device_memory=memory, calibration={}, suggest=False).to_dict()
    verdict = verdict_of(report)
    for dev in report["devices"]:
        check_notes(dev)
        check_decided(dev, report["kv"])
    words = {"fits": "fits", "does_not_fit": "does not fit", "uncertain": "uncertain"}[verdict]
    assert report["headline"].startswith(f"{words}: "), report["headline"]
    if verdict != "fits":
        message = gate_message(report)
        planner_decided = any(
            d["verdict"] == verdict and not d["verdict_source"].startswith("observed") for d in report["devices"]
        )
        assert check_clauses(message, verdict) > 0 or not planner_decided, message
    out = io.StringIO()
    print_memory(Console(file=out, width=400, color_system=None), report)
    lines = list(VIEW_LINE.finditer(out.getvalue()))
    assert len(lines) == len(report["devices"]), out.getvalue()
    for m, dev in zip(lines, report["devices"], strict=True):
        if m.group(2) and m.group(1) != "fits":  # a chiplet margin named as what binds: it straddles or is over
            assert float(m.group(3)) < EPS, m.group(0)
        if m.group(2) and dev["verdict"] == "fits":  # the tightest limit of a fit holds in every scenario
            assert float(m.group(3)) > -EPS, m.group(0)


def test_the_issue_s_chiplet_bound_dry_run_names_the_chiplet():
    """Before: 'device 0 margin +24.79 .. +58.09 GiB, the range straddles the limit' (all positive) and 'auto KV
    sizing left no room for the ViT' although 80.63 + 26.16 < 140."""
    res = run_qvl("compile", "--preset", "rebel100-1npu-batch4", "--set", "max_seq_len=180224", "--dry-run")
    assert res.exit_code == 4, res.stderr
    assert "the fullest chiplet needs" in res.stderr and "of 35.00 GiB (margin -" in res.stderr
    assert "left no room for the ViT" not in res.stdout
    assert "fullest chiplet margin -" in res.stdout


def dry_report(preset: str, sets: list[str], memory: str | None = None) -> dict:
    return estimate_plan(build_plan(preset, sets), device_memory=memory, calibration={}, suggest=False).to_dict()


def test_the_headline_names_the_kv_block_minimum_under_a_memory_budget():
    """D9: the 30B MoE at memory_budget=0.5 said 'does not fit, margin +53.69 .. +57.78 GiB' (all positive); what
    decides it is optimum-rbln's KV search, which finds fewer blocks than the minimum under that budget."""
    report = dry_report("rebel100-30b-a3b", ["memory_budget=0.5"])
    assert report["verdict"] == "does_not_fit"
    decided = report["decided_by"]
    assert decided["constraint"] == "kv_blocks" and decided["device"] == 0
    assert decided["blocks_high"] < decided["minimum"] == 33
    assert report["headline"] == f"does not fit: {decided['text']}"
    assert decided["text"] == "KV blocks 15 .. 18 < minimum 33 under memory_budget 0.5"
    assert report["devices"][0]["decided_by"]["constraint"] == "kv_blocks"
    assert "KV blocks 15 .. 18 < minimum 33" in gate_message(report)


def test_an_uncertain_kv_search_is_named_with_its_block_range():
    """D9: the 32B at memory_budget=0.5 said 'uncertain, margin +32.54 .. +68.17 GiB'; the KV search ends between
    3 and 5 blocks against a minimum of 5."""
    report = dry_report("rebel100-32b", ["memory_budget=0.5"])
    assert report["verdict"] == "uncertain"
    assert report["headline"] == "uncertain: KV blocks 3 .. 5 vs minimum 5 under memory_budget 0.5"
    assert "device 0: KV blocks 3 .. 5 vs minimum 5" in gate_message(report)


def test_an_uncertain_chiplet_is_named_with_its_own_numbers():
    """D9: the 8B at batch 2 said 'uncertain: device 0 113.49 GiB of 140.00 GiB'; its fullest chiplet decides."""
    report = dry_report("rebel100-8b", ["batch_size=2"])
    decided = report["decided_by"]
    assert report["verdict"] == "uncertain" and decided["constraint"] == "chiplet"
    assert decided["need_low_bytes"] <= decided["usable_bytes"] < decided["need_high_bytes"]
    assert report["headline"] == "uncertain: fullest chiplet 22.43 .. 38.33 of 35.00 GiB"


def test_the_dry_run_s_memory_line_and_json_say_what_decides():
    res = run_qvl("compile", "--preset", "rebel100-30b-a3b", "--set", "memory_budget=0.5", "--dry-run")
    assert res.exit_code == 4, res.stderr
    assert "memory: does not fit: KV blocks 15 .. 18 < minimum 33 under memory_budget 0.5" in res.stdout
    assert "device 0: does not fit: KV blocks 15 .. 18 < minimum 33 under memory_budget 0.5; card margin" in res.stdout
    js = run_qvl("compile", "--preset", "rebel100-30b-a3b", "--set", "memory_budget=0.5", "--dry-run", "--json")
    memory = json.loads(js.stdout)["memory"]
    assert memory["decided_by"]["constraint"] == "kv_blocks"
    assert memory["headline"].startswith("does not fit: KV blocks")


def test_every_device_header_names_the_usable_bytes_source():
    """D27: device 1's header said 'usable 140.00 GiB: planner' (its verdict source) where device 0 said the
    DRAM spec."""
    for memory, source in ((None, "optimum-rbln 0.12 DRAM spec"), ("120GiB", "--device-memory")):
        out = io.StringIO()
        print_memory(Console(file=out, width=400, color_system=None), dry_report("rebel100-2npu-batch4", [], memory))
        headers = re.findall(r"memory on device (\d) \(RBLN-CR13, usable [0-9.]+ GiB: ([^)]*)\)", out.getvalue())
        assert headers == [("0", source), ("1", source)], out.getvalue()


def test_a_multi_device_headline_names_the_deciding_device():
    over = dry_report("rebel100-2npu-batch4", [], "20GiB")
    assert over["headline"] == "does not fit: device 0: card total 115.25 .. 116.05 of 20.00 GiB"
    assert over["decided_by"]["device"] == 0 and over["decided_by"]["constraint"] == "device"
    sets = ["placement.visual_device=1", "batch_size=8", "decoder_batch_sizes=[8]"]
    tight = dry_report("rebel100-2npu-batch4", sets)  # a fit names its tightest device only
    assert tight["headline"] == "fits: device 0: fullest chiplet 34.81 .. 34.94 of 35.00 GiB"


def test_a_report_without_decided_by_still_prints_what_decides():
    """A memory dict written before decided_by existed (an older artifact's manifest) is worked out on view."""
    report = dry_report("rebel100-30b-a3b", ["memory_budget=0.5"])
    old = {k: v for k, v in report.items() if k not in ("decided_by", "headline")}
    old["devices"] = [{k: v for k, v in d.items() if k != "decided_by"} for d in report["devices"]]
    out = io.StringIO()
    print_memory(Console(file=out, width=400, color_system=None), old)
    assert "memory: does not fit: KV blocks 15 .. 18 < minimum 33 under memory_budget 0.5" in out.getvalue()


def test_a_model_whose_weights_alone_exceed_the_card_is_headlined_by_its_weights():
    """235B-A22B leaves no KV block because its weights alone exceed the card: the headline names that cause, not
    only the symptom 'KV blocks 0 < minimum 32'."""
    from tests.helpers_cli import run_qvl

    result = run_qvl(
        "compile", "--preset", "rebel100-1npu", "--model", "Qwen/Qwen3-VL-235B-A22B-Instruct", "--dry-run", "--json"
    )
    assert result.exit_code == 4, result.stderr
    decided = json.loads(result.stdout)["memory"]["devices"][0]["decided_by"]
    assert decided["constraint"] == "kv_blocks"
    assert decided["text"].startswith("the LM weights alone (436.74 GiB) exceed the card's 140.00 GiB, so KV blocks 0")
