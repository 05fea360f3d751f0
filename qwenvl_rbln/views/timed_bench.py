"""The human form of ``qvl bench-serve``'s own-server runs (timed emulator, device speed, an NPU's step log): one
line per rate, then the host time per engine step by kind (``--json`` gives the same document)."""

from __future__ import annotations

from typing import Any


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def why_invalid(r: dict[str, Any], speed: str | None) -> str:
    """Every reason a run is invalid: calls that overran their hold, requests that failed (or none done: the run
    measured no server, audit 2026-12-06 M3), the emulator's own work over its bound at device speed."""
    calls = r.get("calls") or {}
    why = [f"{calls['overruns']} of {calls['calls']} calls overran their hold"] if calls.get("overruns") else []
    if r["failed"] or not r["completed"]:
        why.append(f"{r['failed']} of {r['completed'] + r['failed']} requests failed")
    if speed == "device" and calls and not why:
        why.append("the emulator's own work took over 5 % of the run")
    return "; ".join(why) or "see the run's figures"


def human(console: Any, d: dict[str, Any]) -> None:
    say = lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    say(d["label"])
    say("figures in device time (the scale taken out); latencies in ms" if d["time_scale"] != 1
        else "figures in wall time at scale 1 (= device time plus the host's real time); latencies in ms")  # fmt: skip
    for r in d["runs"]:
        calls = r.get("calls")
        mark = "valid" if r["valid"] else f"INVALID: {why_invalid(r, d.get('speed'))}"
        share = ""
        if calls is not None:
            share = f"; CPU share {calls['cpu_share']:.1%} (worst call {calls['worst_cpu_share']:.0%})"
            if d.get("speed") == "device":
                share = f"; emulator's own work {r.get('emulator_share', 0.0):.1%} of the wall time"
        say(
            f"rate {r['rate']:g} req/s: {r['completed']} done, {r['failed']} failed, "
            f"{r['request_throughput']:.3f} req/s, {r['output_throughput']:.1f} tok/s; "
            + "; ".join(
                f"{m.upper()} p50/p90/p99 {r[f'p50_{m}_ms']:.3f}/{r[f'p90_{m}_ms']:.3f}/{r[f'p99_{m}_ms']:.3f}"
                for m in ("ttft", "tpot", "itl")
                if f"p50_{m}_ms" in r
            )
            + f"{share}; {mark}"
        )
    host = d.get("host_time")
    if host:
        _host(say, host)


def _unmeasured(k: dict[str, Any]) -> str:
    return f"; not measured: {', '.join(k['unmeasured'])}" if k["unmeasured"] else ""


def _host(say: Any, h: dict[str, Any]) -> None:
    """Host time per engine step: the fit by kind, its error, the medians behind it, where it was recorded."""
    fit, model = h["fit"], h["fit"]["model"]
    say(f"host time per engine step (wall time less device time; {h['steps']} steps): {model['source']}")
    kinds = fit["kinds"]
    if "prefill" in kinds:
        k = kinds["prefill"]
        images = ", ".join(f"{i} image(s) {_ms(v)}" for i, v in fit["prefill_by_images"].items())
        say(f"  prefill: {_ms(model['prefill_base_s'])} ms + {model['prefill_per_token_s'] * 1e6:.2f} us/token + "
            f"{_ms(model['prefill_per_image_s'])} ms/image; median {_ms(k['median_s'])} ms ({images} ms), "
            f"p90 {_ms(k['p90_s'])} ms; fit rms {_ms(k['rms_s'])} ms, median |err| {k['median_abs_rel']:.0%} "
            f"over {k['steps']} steps" + _unmeasured(k))  # fmt: skip
    if "decode" in kinds:
        k = kinds["decode"]
        rows = ", ".join(f"{r} row(s) {_ms(v)}" for r, v in fit["decode_by_rows"].items())
        say(f"  decode: {_ms(model['decode_base_s'])} ms + {_ms(model['decode_per_row_s'])} ms/row; median "
            f"{_ms(k['median_s'])} ms ({rows} ms), p90 {_ms(k['p90_s'])} ms; fit rms {_ms(k['rms_s'])} ms, median "
            f"|err| {k['median_abs_rel']:.0%} over {k['steps']} steps" + _unmeasured(k))  # fmt: skip
    if not kinds:
        say("  too few steps of either kind to fit")
    say(f"  {h['recorded']}")
