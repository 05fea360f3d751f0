"""``qvl bench-serve --emulate --time-model FILE --time-scale N``: the real vLLM + vllm-rbln scheduler over the
timed emulator, its latencies and throughput in device time.

Why its own server: the hold is set in the environment of every process vLLM starts (the engine core is a
subprocess), so the benchmark starts ``qvl serve --emulate``'s exact command with the time model in its
environment, runs vLLM's own ``vllm bench serve`` once per request rate against it, and stops it. The figures are
vLLM's (``np.percentile`` over its per-request lists, read from its ``--save-result`` JSON) with the scale taken
out: a latency divided by N, a throughput multiplied by N. Each figure is labelled emulated with the time model
and scale named, and a run in which any graph call's CPU work took longer than its hold is marked invalid
(``backends/emulator/timed.py``, ``Stats.valid``).

At device speed (``speed="device"``, scale 1) no graph is computed and the holds follow the emulator's own work in
each call, so no call overruns; the run is invalid instead when that work exceeds MAX_EMULATOR_SHARE of the run's
wall time (the pace it distorts). Without a time model (``--host-time`` on an NPU host) the server is the real
engine. Every such server logs its engine steps (``step_log.py``): each run carries its steps with their host time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import BackendError
from qwenvl_rbln.serving import step_log
from qwenvl_rbln.serving.options import Launch

METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 99)
MAX_EMULATOR_SHARE = 0.05  # device speed: the emulator's own work inside the calls, at most 5 % of the run's wall
START_S = 600.0  # a bound on the engine's start on a busy machine (about 30 s idle)
STOP_S = 30.0


@dataclass(frozen=True)
class TimedRun:
    """What the timed benchmark takes besides the two launches."""

    model: dict[str, Any] | None  # the device-time model as JSON (DeviceTimeModel.to_json); None: a real NPU
    model_name: str
    scale: float
    rates: tuple[float, ...]  # requests/s in device time; inf: all at once
    speed: str = "cpu"  # cpu: the tiny model's math inside each hold; device: nothing computed (timed.py)

    @property
    def label(self) -> str:
        if self.model is None:
            return "the NPU: its own engine with the engine-step log (host time = step wall time - device time)"
        held = f"qvl's CPU emulator held to device time model {self.model_name}, scale {self.scale:g}"
        if self.speed == "device":
            return (f"emulated at device speed: {held}; no graph computed, the output tokens are meaningless "
                    "(their lengths kept with --ignore-eos); the host's time is real")  # fmt: skip
        return f"emulated: {held}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_argv(argv: list[str], wall_rate: float, result: Path) -> list[str]:
    """``vllm bench serve``'s argv for one rate (wall requests/s): Poisson arrivals without a client-side cap on
    concurrency (requests queue in the server's scheduler, as they would in a deployment), every per-request list
    saved, and the percentiles the report gives."""
    out = list(argv)
    if "--max-concurrency" in out:
        i = out.index("--max-concurrency")
        del out[i : i + 2]
    out += ["--request-rate", "inf" if wall_rate == float("inf") else repr(wall_rate)]
    out += ["--save-result", "--save-detailed", "--result-dir", str(result.parent), "--result-filename", result.name]
    out += ["--percentile-metrics", ",".join(METRICS), "--metric-percentiles", ",".join(map(str, PERCENTILES))]
    return out


def figures(result: Mapping[str, Any], scale: float) -> dict[str, Any]:
    """vLLM's figures of one run in device time: latencies (ms) divided by the scale, rates multiplied by it."""
    out: dict[str, Any] = {"completed": result["completed"], "failed": result.get("failed", 0)}
    for metric in METRICS:
        for p in PERCENTILES:
            key = f"p{p}_{metric}_ms"
            if key in result:
                out[key] = result[key] / scale
        if f"mean_{metric}_ms" in result:
            out[f"mean_{metric}_ms"] = result[f"mean_{metric}_ms"] / scale
    out["duration_s"] = result["duration"] / scale
    out["request_throughput"] = result["request_throughput"] * scale
    out["output_throughput"] = result["output_throughput"] * scale
    return out


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def _server(argv: list[str], env: dict[str, str], port: int, log: Path) -> Iterator[None]:
    """The emulated server in its own session, ready (/health 200 within START_S); afterwards its whole group is
    ended (SIGINT, then SIGKILL)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
    try:
        t0 = time.monotonic()
        while not _healthy(port):
            if proc.poll() is not None or time.monotonic() - t0 > START_S:
                tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
                why = (
                    f"exited with code {proc.returncode}"
                    if proc.poll() is not None
                    else f"no /health in {START_S:.0f} s"
                )
                raise BackendError(f"the timed emulated server {why}; its output ends:\n{tail}", "rerun with --dry-run")
            time.sleep(0.5)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its group is left (the engine core)
        proc.wait(timeout=STOP_S)


def run(
    serve: Launch, bench: Launch, timed: TimedRun, environ: Mapping[str, str], vllm: str, timed_mod: Any
) -> dict[str, Any]:
    """Start the timed server, benchmark it at every rate, stop it: the document ``qvl bench-serve`` prints.
    ``timed_mod``: the emulator's timing module (its ``environment`` and ``read_stats``), given by the command, which
    composes the emulator in (serving never imports a backend)."""

    runs = []
    with tempfile.TemporaryDirectory(prefix="qvl-timed-bench-") as tmp:
        work = Path(tmp)
        port = free_port()
        server_argv = [vllm, *serve.argv[1:]]
        server_argv[server_argv.index("--port") + 1] = str(port)
        env = serve.exec_env(environ)
        if timed.model is not None:
            model_file = work / "time-model.json"
            model_file.write_text(json.dumps(timed.model), encoding="utf-8")
            env.update(timed_mod.environment(model_file, timed.scale, work / "stats", timed.speed))
        env[step_log.ENV] = str(work / "steps")
        bench_env = bench.exec_env(environ)
        with _server(server_argv, env, port, work / "server.log"):
            _warm_up([vllm, *bench.argv[1:]], port, work / "warm-up.json", bench_env)
            for rate in timed.rates:
                result_file = work / f"bench-{len(runs)}.json"
                argv = bench_argv([vllm, *bench.argv[1:]], rate / timed.scale, result_file)
                argv[argv.index("--port") + 1] = str(port)
                since = time.time()
                done = subprocess.run(argv, env=bench_env, capture_output=True, text=True, check=False)
                until = time.time()
                if done.returncode != 0:
                    raise BackendError(f"`vllm bench serve` exited with {done.returncode}: {done.stderr[-2000:]}",
                                       "rerun with --dry-run to see the exact command")  # fmt: skip
                result = json.loads(result_file.read_text(encoding="utf-8"))
                stats = timed_mod.read_stats(work / "stats", since, until) if timed.model is not None else None
                steps = step_log.read_steps(work / "steps", since, until)
                share = stats.cpu_s / max(until - since, 1e-9) if stats is not None else 0.0
                got = figures(result, timed.scale)
                valid = run_valid(got, stats is None or stats.valid)
                valid = valid and not (timed.speed == "device" and share > MAX_EMULATOR_SHARE)
                runs.append({"rate": rate, **got,
                             "calls": stats.to_dict() if stats is not None else None, "emulator_share": share,
                             "valid": valid, "steps": [s.to_dict() for s in steps], "raw": _raw(result)})  # fmt: skip
    return {"emulated": timed.model is not None, "label": timed.label, "time_model": timed.model_name,
            "time_model_json": timed.model, "time_scale": timed.scale, "speed": timed.speed,
            "valid": all(r["valid"] for r in runs), "runs": runs}  # fmt: skip


def run_valid(got: Mapping[str, Any], held: bool) -> bool:
    """A run is valid when every graph call kept its hold and every request completed: a run with a failed request
    (or none done) measured no server (audit 2026-12-06 M3)."""
    return held and got["completed"] > 0 and not got["failed"]


def _warm_up(argv: list[str], port: int, result: Path, env: dict[str, str]) -> None:
    """One batch-sized burst before the measured runs, not counted: every graph's first call (torch's lazy set-up
    of its ops) is slow, and would overrun a hold of the run it fell in."""
    batch = argv[argv.index("--max-concurrency") + 1] if "--max-concurrency" in argv else "1"  # the compiled batch
    argv = bench_argv(argv, float("inf"), result)
    argv[argv.index("--port") + 1] = str(port)
    argv[argv.index("--num-prompts") + 1] = batch
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BackendError(f"`vllm bench serve` (warm-up) exited with {done.returncode}: {done.stderr[-2000:]}",
                           "rerun with --dry-run to see the exact command")  # fmt: skip


def _raw(result: Mapping[str, Any]) -> dict[str, Any]:
    """The per-request lists (wall seconds) a fidelity check replays: arrivals, prompt and output lengths."""
    return {k: result.get(k) for k in ("start_times", "input_lens", "output_lens", "ttfts", "itls")}
