"""Verdict explanations never contradict their numbers (issue 25 item 1).

The gate line, each device's notes and the view name the binding constraint (the card total or its fullest
chiplet) with its own numbers; a property test draws many configurations and checks every number each message
quotes supports the verdict it explains.
"""

from __future__ import annotations

import io
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
VIEW_LINE = re.compile(rf"device \d+: (fits|does not fit|uncertain), (fullest chiplet margin {SIGNED} \.\. {SIGNED})?")
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
    if verdict != "fits":
        message = gate_message(report)
        planner_decided = any(
            d["verdict"] == verdict and not d["verdict_source"].startswith("observed") for d in report["devices"]
        )
        assert check_clauses(message, verdict) > 0 or not planner_decided, message
    out = io.StringIO()
    print_memory(Console(file=out, width=400, color_system=None), report)
    for m in VIEW_LINE.finditer(out.getvalue()):
        if m.group(2):  # a chiplet margin named as what binds: it really straddles or is over
            assert float(m.group(3)) < EPS, m.group(0)


def test_the_issue_s_chiplet_bound_dry_run_names_the_chiplet():
    """Before: 'device 0 margin +24.79 .. +58.09 GiB, the range straddles the limit' (all positive) and 'auto KV
    sizing left no room for the ViT' although 80.63 + 26.16 < 140."""
    res = run_qvl("compile", "--preset", "rebel100-1npu-batch4", "--set", "max_seq_len=180224", "--dry-run")
    assert res.exit_code == 4, res.stderr
    assert "the fullest chiplet needs" in res.stderr and "of 35.00 GiB (margin -" in res.stderr
    assert "left no room for the ViT" not in res.stdout
    assert "fullest chiplet margin -" in res.stdout
