"""The API server's own time per request (``HostTimeModel.front``): it delays a request's arrival at the scheduler
and counts in its TTFT, without holding the engine, in the simulator and in tune's estimate alike; a host-time model
without it says so."""

from __future__ import annotations

import dataclasses
import io

import pytest

from qwenvl_rbln.tuning.device_time import linear_model
from qwenvl_rbln.tuning.host_time import DEFAULT, HOST_FREE, HostTimeModel, section
from qwenvl_rbln.tuning.simulate import Engine, Request, simulate
from tests.test_estimate_host import HOST, _est

TOY = linear_model(prefill=(1.0, 0.0, 0.0), decode=(0.1, 0.0, 0.0), vit=(0.5, 0.0))
FRONT = HostTimeModel(front_base_s=0.5, front_per_image_s=0.25, source="by hand")


def _engine() -> Engine:
    return Engine(batch=2, chunk=512, block_size=4096, num_blocks=4, max_model_len=8192)


def test_a_request_reaches_the_scheduler_after_its_front_end_and_its_ttft_counts_it():
    """Text T at 0.1 s reaches the scheduler at 0.6 s; image I at 0 s (one ViT call) at 0.75 s, so T is prefilled
    first although it arrived later. By hand: T's prefill 0.6-1.6 (TTFT 1.5); I's 1.6-3.1 (ViT 0.5 + chunk 1: TTFT
    3.1); then one decode of both, 3.1-3.2."""
    image, text = Request(0.0, 10, 2, vit=(1024,)), Request(0.1, 10, 2)
    trace = simulate(_engine(), TOY, [image, text], host=FRONT, keep_steps=True)
    assert [r.request for r in trace.records] == [text, image]
    assert [round(r.ttft, 9) for r in trace.records] == [1.5, 3.1]
    assert [(k, round(t, 9)) for k, t, _, _ in trace.steps] == [("prefill", 0.6), ("prefill", 1.6), ("decode", 3.1)]
    # the front end holds no step: the engine's device and host time are what they were without it
    bare = simulate(_engine(), TOY, [image, text], host=HOST_FREE)
    assert (trace.device_s, trace.host_s) == pytest.approx((bare.device_s, bare.host_s))
    assert [round(r.ttft, 9) for r in bare.records] == [1.5, 2.4]  # I first (at 0), then T waits for it


def test_fast_and_step_by_step_agree_with_a_front_end():
    requests = [Request(0.05 * i, 10 + i, 6, vit=(1024,) * (i % 3)) for i in range(12)]
    fast = simulate(_engine(), TOY, requests, host=FRONT, fast=True, keep_steps=True)
    slow = simulate(_engine(), TOY, requests, host=FRONT, fast=False, keep_steps=True)
    assert [(r.first_token, r.finish) for r in fast.records] == [(r.first_token, r.finish) for r in slow.records]


def test_the_estimates_ttft_counts_the_front_end_and_its_throughput_does_not():
    with_front = dataclasses.replace(HOST, front_base_s=0.010, front_per_image_s=0.020)
    plain, fronted = _est(HOST), _est(with_front)
    assert fronted["ttft_s"] - plain["ttft_s"] == pytest.approx(0.010 + 0.020 * 1.25)  # 1.25 ViT calls per request
    assert fronted["latency_s"] - plain["latency_s"] == pytest.approx(0.010 + 0.020 * 1.25)
    assert fronted["output_tokens_per_s"] == plain["output_tokens_per_s"]  # another process: not on the card
    assert fronted["npu_busy_share"] == plain["npu_busy_share"]


def test_a_model_without_a_front_end_says_ttft_leaves_it_out():
    assert DEFAULT.has_front and section(DEFAULT, False)["front_end_counted"] is True
    measured = section(dataclasses.replace(DEFAULT, front_base_s=0.0, front_per_image_s=0.0), True)
    assert measured["front_end_counted"] is False and "is not in this model" in measured["front_end"]
    from rich.console import Console

    from qwenvl_rbln.views.tune import _host_and_sampler

    out = io.StringIO()
    _host_and_sampler(Console(file=out, width=250, no_color=True), {"host_time": measured, "sampler": "assumed"})
    assert "API server the API server's own time per request" in out.getvalue()
    assert "TTFT leaves it out" in out.getvalue()
