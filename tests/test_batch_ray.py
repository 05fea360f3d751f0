"""The Ray pool (qwenvl_rbln/batch/ray_pool.py, ray_cluster.py) with stand-in workers (tests/ray_standin.py): one
local emulated Ray for the module (4 emulated NPUs), HOME pointed at a temporary folder (Ray 2.60 writes its auth
token to ~/.ray). Fault tests wait for conditions (a marker file, a process gone), never for time. Stand-in workers
run without ``emulate`` (the emulator imports torch: seconds per actor); the end-to-end test runs the real one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from qwenvl_rbln.batch import records  # noqa: E402
from qwenvl_rbln.batch.npus import WorkerNpus  # noqa: E402
from qwenvl_rbln.batch.ray_cluster import plan_workers  # noqa: E402
from qwenvl_rbln.batch.ray_pool import RayExecutor  # noqa: E402
from qwenvl_rbln.batch.source import WorkItem  # noqa: E402
from qwenvl_rbln.batch.worker import WorkerSpec  # noqa: E402
from qwenvl_rbln.errors import BackendError, DependencyMissing, InputError  # noqa: E402
from qwenvl_rbln.inference.runner import InferOptions  # noqa: E402
from tests.ray_standin import BrokenWorker, EchoWorker  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PINNED = [0, 1, 2, 4]  # of 5 emulated NPUs: the module's Ray is pinned to these, so NPU 3 must never be used


def ray_test_env(tmp: Path) -> dict[str, str]:
    """What a test Ray needs: a private HOME (auth token), no usage stats, the repo importable by workers."""
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {"HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": path, "QVL_EMULATOR_DEVICES": "4"}


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory):
    from qwenvl_rbln.backends import emulator
    from qwenvl_rbln.batch.ray_cluster import start_or_connect

    tmp = tmp_path_factory.mktemp("ray")
    marks = tmp / "marks"
    marks.mkdir()
    env = {**ray_test_env(tmp), "QVL_STANDIN_DIR": str(marks), "QVL_EMULATOR_DEVICES": "5"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    was_active = emulator.is_active()
    import ray

    try:
        assert start_or_connect(None, emulate=True, devices=PINNED) is True  # as --devices 0,1,2,4 does
        yield ray, marks
    finally:
        ray.shutdown()
        if not was_active:
            emulator.deactivate()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def items(*raws: dict) -> list[WorkItem]:
    return [WorkItem(id=str(r.get("id", f"r{i}")), line=i + 1, raw=r) for i, r in enumerate(raws)]


def run_pool(workers: int, work: list[WorkItem], **kw):
    out: list[dict] = []
    events: list[tuple[str, dict]] = []
    pool = RayExecutor(WorkerSpec(name="w"), workers=workers, worker_cls=EchoWorker, **kw)
    pool.run(iter(work), out.append, lambda name, fields: events.append((name, fields)))
    return out, events


BOUND_S = 300.0  # a bound on a condition (an actor loaded, a line written, a process gone) on a loaded machine


def wait_until(predicate, timeout: float = BOUND_S) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def test_local_ray_sees_the_emulated_npus_and_sends_nothing_out(ray_local, capsys):
    ray, _ = ray_local
    assert ray.cluster_resources().get("RBLN") == 4.0  # 5 emulated NPUs (QVL_EMULATOR_DEVICES), 4 pinned
    assert "RBLN_DEVICES" not in os.environ  # set only while Ray started
    assert "accelerator_type:RBLN-CR13" in ray.cluster_resources()
    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "0"
    import ray._private.worker as ray_worker  # the raylet's "a worker died" notes stay off stdout (--json)

    ray_worker.print_to_stdstream({"lines": ["A worker died"], "pid": "raylet", "is_err": False}, False)
    assert "A worker died" not in capsys.readouterr().out


def test_every_request_once_on_free_workers_with_their_own_npu(ray_local, tmp_path, monkeypatch):
    """r0 blocks its worker until 8 other requests are written: only a pool that feeds whichever worker is free
    (not fixed shards, not one worker) gets there; a watchdog opens the gate after BOUND_S so a broken pool fails."""
    gate = tmp_path / "gate"
    out: list[dict] = []
    events: list[tuple[str, dict]] = []

    def emit(record):
        out.append(record)
        if len(out) == 8:
            gate.touch()

    monkeypatch.setenv("QVL_EMULATE_CALL_MS", "7")  # set after Ray started: only runtime_env brings it to workers
    watchdog = threading.Timer(BOUND_S, gate.touch)
    watchdog.start()
    work = items({"id": "r0", "hold": str(gate)}, *({"id": f"r{i}"} for i in range(1, 12)))
    pool = RayExecutor(WorkerSpec(), workers=2, worker_cls=EchoWorker)
    try:
        pool.run(iter(work), emit, lambda name, fields: events.append((name, fields)))
    finally:
        watchdog.cancel()
    assert sorted(r["id"] for r in out) == sorted(f"r{i}" for i in range(12))
    held_by = next(r["worker"] for r in out if r["id"] == "r0")
    assert {r["worker"] for r in out[:8]} == {"worker-0", "worker-1"} - {held_by}
    seen = {r["text"].split("@")[1] for r in out}
    assert len(seen) == 2 and seen <= {"0", "1", "2", "4"}  # RBLN_DEVICES: one pinned host NPU per worker
    assert all(r["npu"] == int(r["text"].split("@")[1]) for r in out)  # records name the host's NPU id
    assert {r["timings"]["call_ms"] for r in out} == {"7"}  # the driver's QVL_* settings reach every worker
    states = {(f["worker"], f["state"]) for name, f in events if name == "worker.state"}
    assert {("worker-0", "loading"), ("worker-0", "busy"), ("worker-1", "loading"), ("worker-1", "busy")} <= states
    notes = {f["message"] for name, f in events if name == "worker.note"}
    assert notes == {"stand-in worker: echoes ids"}  # a worker's load notes (tiny model, emulated) reach the summary
    done = [f for name, f in events if name == "worker.done"]
    assert sum(max(f["requests"] for f in done if f["worker"] == w) for w in ("worker-0", "worker-1")) == 12
    assert sum(max(f["tokens"] for f in done if f["worker"] == w) for w in ("worker-0", "worker-1")) == 36


def test_dead_workers_requests_requeued_and_failed_on_two_workers_keeps_both_errors(ray_local, tmp_path):
    """Four workers: "a" kills the first worker that runs it (a process death: the worker is restarted, "a"
    re-queued, then ok); "bad" raises on every worker (a failure out of the worker: restarted, retried alone,
    then written as failed with both errors); the requests that shared a call with them are not charged and
    finish ok; no worker is dropped."""
    work = items(
        {"id": "a", "die_once": str(tmp_path / "a.died")},
        {"id": "c0"},
        {"id": "bad", "raise": "NPU error 42"},  # never in a call with "a" (calls hold 2; retries run alone)
        *({"id": f"c{i}"} for i in range(1, 10)),
    )
    # every worker loaded before the first request, so each says its NPU however fast the others finish the work
    out, events = run_pool(4, work, all_loaded_first=True)
    by_id = {r["id"]: r for r in out}
    assert sorted(r["id"] for r in out) == sorted(w.id for w in work)  # each once
    assert (tmp_path / "a.died").exists() and by_id["a"]["ok"]
    assert all(by_id[f"c{i}"]["ok"] for i in range(10))
    err = by_id["bad"]["error"]
    assert not by_id["bad"]["ok"] and err["cause"] == records.WORKER_FAILED
    assert len(err["attempts"]) == 2
    assert all("NPU error 42" in a["message"] and a["npu"] is not None for a in err["attempts"])
    dead = [f["worker"] for name, f in events if name == "worker.state" and f["state"] == "dead"]
    assert dead == []  # restarted, never dropped
    restarts = [f["message"] for name, f in events if name == "worker.note" and "restarted after" in f["message"]]
    assert len(restarts) == 3, restarts  # "a" once, "bad" twice
    npus = {f["npu"] for name, f in events if name == "worker.state" and f["npu"] is not None}
    assert npus == set(PINNED)  # one pinned NPU per worker, by its host id; never NPU 3


def test_a_worker_that_keeps_failing_is_given_up_and_the_rest_is_left_undone(ray_local):
    out: list[dict] = []
    pool = RayExecutor(WorkerSpec(), workers=1, worker_cls=EchoWorker, max_restarts=1)
    work = items(*({"id": f"k{i}", "die": "always"} for i in range(6)))
    with pytest.raises(BackendError, match="no live worker left.*failed 2 times in a row"):
        pool.run(iter(work), out.append, lambda *a: None)
    assert [(r["id"], r["ok"], len(r["error"]["attempts"])) for r in out] == [("k0", False, 2)]  # killed 2 workers
    # k1 (one attempt) and k2.. (none) are not written: left for --resume, not failures of their own


def test_a_worker_with_scattered_deaths_and_finished_calls_between_is_never_given_up(ray_local, tmp_path):
    """max_restarts 1, one worker: k1 and k2 each kill the worker that first runs them, with calls that finished in
    between; each death is the first in a row (a finished call resets the count), so the job finishes."""
    work = items(
        {"id": "k1", "die_once": str(tmp_path / "k1.died")},
        *({"id": f"n{i}"} for i in range(4)),
        {"id": "k2", "die_once": str(tmp_path / "k2.died")},
        {"id": "n4"},
    )
    out, events = run_pool(1, work, max_restarts=1)
    assert sorted(r["id"] for r in out) == sorted(w.id for w in work) and all(r["ok"] for r in out)
    assert (tmp_path / "k1.died").exists() and (tmp_path / "k2.died").exists()
    assert not any(f.get("state") == "dead" for name, f in events if name == "worker.state")


def test_workers_that_cannot_load_stop_the_job_with_their_own_error(ray_local):
    pool = RayExecutor(WorkerSpec(), workers=1, worker_cls=BrokenWorker)
    with pytest.raises(BackendError, match=r"no live worker left.*could not load: BackendError: cannot open NPU 0"):
        pool.run(iter(items({"id": "a"})), lambda r: None, lambda *a: None)


def test_ctrl_c_kills_the_actors_and_returns_promptly(ray_local, tmp_path):
    ray, marks = ray_local
    gate = tmp_path / "never"
    pool = RayExecutor(WorkerSpec(), workers=1, worker_cls=EchoWorker)
    work = items(*({"id": f"h{i}", "hold": str(gate)} for i in range(8)))
    running = lambda: [p for p in marks.glob("h*.*")]  # noqa: E731
    held = threading.Event()

    def interrupt():
        if wait_until(lambda: bool(running())):  # the worker holds a request
            held.set()
            os.kill(os.getpid(), signal.SIGINT)
        else:  # never held one: open the gate, so run ends by itself and the test fails below instead of waiting
            gate.touch()

    helper = threading.Thread(target=interrupt, daemon=True)
    helper.start()
    with pytest.raises(KeyboardInterrupt):
        pool.run(iter(work), lambda r: None, lambda *a: None)
    helper.join(timeout=BOUND_S)
    assert held.is_set(), f"the worker held no request within {BOUND_S} s"
    pids = {int(p.suffix[1:]) for p in running()}
    assert len(pids) == 1 and pool.slots == []

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    assert wait_until(lambda: all(gone(p) for p in pids), timeout=60)


def test_more_workers_than_npus_is_refused_naming_the_count(ray_local):
    with pytest.raises(InputError, match=r"holds 4 \(RBLN per node: .*=4\)"):
        run_pool(5, items({"id": "a"}))


def test_artifact_unreadable_on_a_node_fails_naming_the_node(ray_local, tmp_path):
    import socket

    spec = WorkerSpec(InferOptions(directory=tmp_path / "nowhere"))
    pool = RayExecutor(spec, workers=1, worker_cls=EchoWorker)
    with pytest.raises(BackendError, match=f"node {socket.gethostname()}: .*nowhere is not a folder"):
        pool.run(iter(items({"id": "a"})), lambda r: None, lambda *a: None)


def test_cluster_plan_names_what_is_missing():
    nodes = [{"id": "n1", "name": "gpu-box", "rbln": 0}]
    with pytest.raises(BackendError, match="no RBLN resource .*gpu-box") as exc:
        plan_workers(nodes, 2, 1, 0.0)
    assert "rebel.device_count()" in exc.value.hint
    two = [{"id": "a", "name": "a", "rbln": 3}, {"id": "b", "name": "b", "rbln": 1}]
    assert plan_workers(two, None, 1, 4.0) == 4
    assert plan_workers(two, None, 2, 4.0) == 1  # a pair must sit on one node: b's single NPU holds none
    with pytest.raises(InputError, match="holds 1"):
        plan_workers(two, 2, 2, 4.0)
    with pytest.raises(BackendError, match="1 free RBLN of 4"):
        plan_workers(two, 2, 1, 1.0)


def test_devices_must_fit_the_artifacts_npus_per_worker():
    with pytest.raises(InputError, match="lists 3 NPUs, but each worker of this artifact takes 2"):
        RayExecutor(WorkerSpec(), devices=[0, 1, 2], npus=WorkerNpus(2, 3))
    assert RayExecutor(WorkerSpec(), devices=[0, 1, 2, 3], npus=WorkerNpus(2, 3)).workers == 2


def run_python(code: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout
    )


def test_without_ray_the_pool_exits_3_with_the_install_line(tmp_path):
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from qwenvl_rbln.batch.ray_pool import RayExecutor\n"
        "from qwenvl_rbln.batch.worker import WorkerSpec\n"
        "from qwenvl_rbln.errors import QvlError\n"
        "try:\n    RayExecutor(WorkerSpec(), workers=2).run(iter([]), print, print)\n"
        "except QvlError as e:\n    print(e.message, '|', e.hint); sys.exit(e.exit_code)\n"
    )
    res = run_python(code, ray_test_env(tmp_path))
    assert res.returncode == DependencyMissing.exit_code == 3, res.stderr
    assert "pip install 'qwenvl-rbln[ray]'" in res.stdout and "make install" in res.stdout


def test_a_ray_without_rbln_fails_in_seconds_naming_it(tmp_path):
    """No emulator, no rebel: Ray detects 0 NPUs; the pool refuses before starting any worker (no hang)."""
    code = (
        "import sys\n"
        "from qwenvl_rbln.batch.ray_pool import RayExecutor\n"
        "from qwenvl_rbln.batch.worker import WorkerSpec\n"
        "from qwenvl_rbln.errors import QvlError\n"
        "try:\n    RayExecutor(WorkerSpec(), workers=2).run(iter([]), print, print)\n"
        "except QvlError as e:\n    print(e.message, '|', e.hint); sys.exit(e.exit_code)\n"
    )
    res = run_python(code, ray_test_env(tmp_path), timeout=300)
    assert res.returncode == BackendError.exit_code, res.stdout + res.stderr
    assert "no RBLN resource" in res.stdout and "rebel.device_count()" in res.stdout


DRIVER = """
import sys
from pathlib import Path
from qwenvl_rbln.batch.driver import BatchOptions, run_batch
from qwenvl_rbln.batch.ray_pool import RayExecutor
from qwenvl_rbln.batch.worker import WorkerSpec
from qwenvl_rbln.errors import QvlError
from tests.ray_standin import EchoWorker

batch, out, address, resume = sys.argv[1:5]
spec = WorkerSpec(batch_file=batch)
opts = BatchOptions(spec, Path(batch), Path(out), resume == "1", workers=2, ray_address=address)
try:
    run_batch(opts, executor=RayExecutor(spec, workers=2, ray_address=address, worker_cls=EchoWorker))
except QvlError as exc:
    print(exc.message, file=sys.stderr)
    sys.exit(exc.exit_code)
"""


def complete_lines(path: Path) -> list[dict]:
    """The output's lines; every one must be a whole JSON object (a torn tail is the only exception allowed)."""
    import json

    if not path.exists():
        return []
    text = path.read_text()
    lines = text.split("\n")
    whole = [json.loads(x) for x in lines[:-1] if x]
    return whole


def test_exactly_once_under_seeded_worker_and_driver_kills_then_resume(ray_local, tmp_path):
    """Seeded: three requests each kill the worker that first runs them; the driver (run_batch, as `qvl infer
    --output` runs it, with stand-in workers) is SIGKILLed or interrupted (SIGINT) after a random number of new
    lines, then resumed until it finishes. Every id must be in the output exactly once, and ok."""
    import json
    import random

    ray, _ = ray_local
    rng = random.Random(30)
    ids = [f"q{i:03d}" for i in range(60)]
    killers = set(rng.sample(ids, 3))
    rows = [{"id": i, **({"die_once": str(tmp_path / f"{i}.died")} if i in killers else {})} for i in ids]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "results.jsonl"
    env = {**os.environ, "QVL_EMULATE_CALL_MS": "100", "PYTHONPATH": os.environ["PYTHONPATH"]}
    address = ray.get_runtime_context().gcs_address
    signals = [signal.SIGKILL, signal.SIGINT]
    codes = []
    log = tmp_path / "driver.log"  # a file, not a pipe nobody reads while the driver runs (a full pipe blocks it)
    proc = None
    try:
        for attempt in range(8):
            before = len(complete_lines(out))
            with log.open("a") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-c", DRIVER, str(batch), str(out), address, "1" if attempt else "0"],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    text=True,
                )
            if attempt < len(signals):
                target = before + rng.randint(1, 8)
                # the signal only once the job writes lines (its Ctrl-C handling is in place); a bound, not a budget
                wrote = wait_until(lambda p=proc, n=target: p.poll() is not None or len(complete_lines(out)) >= n)
                if proc.poll() is None:
                    assert wrote, f"attempt {attempt}: fewer than {target} lines within {BOUND_S} s"
                    proc.send_signal(signals[attempt])
            try:
                codes.append(proc.wait(timeout=BOUND_S))
            except subprocess.TimeoutExpired:
                pytest.fail(f"attempt {attempt}: the driver did not exit within {BOUND_S} s (codes so far {codes})")
            if codes[-1] == 0:
                break
    finally:  # a failed bound leaves no driver running
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=BOUND_S)
    assert codes[-1] == 0 and len(codes) > len(signals), (codes, log.read_text()[-4000:])
    assert -signal.SIGKILL in codes and 130 in codes  # the driver was killed and interrupted, not just finished
    lines = complete_lines(out)
    assert out.read_text().endswith("\n")
    assert sorted(r["id"] for r in lines) == ids  # each id exactly once
    assert all(r["ok"] for r in lines)
    assert all((tmp_path / f"{k}.died").exists() for k in killers)  # the worker kills did happen


def test_two_emulated_workers_give_the_one_npu_runs_tokens(ray_local, tiny_rbln, tmp_path, capsys):
    """`qvl infer --emulate --workers 2` (the real CLI, BatchWorker actors on the tiny artifact, on this module's
    emulated Ray): every request once, two workers started, greedy tokens equal to the one-NPU run's."""
    import json

    from tests.fakes_rbln import run_main

    words = ["cats", "rain", "tea"] * 2
    rows = [{"id": f"p{i}", "prompt": f"Tell me {i} facts about {w}."} for i, w in enumerate(words)]
    batch = tmp_path / "b.jsonl"
    batch.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = {}
    for name, extra in (("one", []), ("two", ["--workers", "2"])):
        out = tmp_path / f"{name}.jsonl"
        argv = ["infer", str(tiny_rbln), "--batch-file", str(batch), "--output", str(out), "--emulate"]
        code, stdout, err = run_main([*argv, "--max-new-tokens", "4", *extra, "--json"], capsys)
        assert code == 0, err
        runs[name] = {r["id"]: r for r in complete_lines(out)}
        runs[name + "-summary"] = json.loads(stdout)
    assert sorted(runs["two"]) == sorted(runs["one"]) == sorted(r["id"] for r in rows)
    pool = runs["two-summary"]["workers"]  # both started (which one finishes first is up to the load)
    assert [w["worker"] for w in pool] == ["worker-0", "worker-1"] and sum(w["requests"] for w in pool) == 6
    assert all(r["ok"] and len(r["token_ids"]) == 4 for r in runs["two"].values())
    assert {i: r["token_ids"] for i, r in runs["two"].items()} == {i: r["token_ids"] for i, r in runs["one"].items()}


# ------------------------------------------------------------------ isolation with real workers (issue 37, round 4)


def test_on_ray_a_poisoned_request_costs_its_own_line_and_its_worker_is_restarted(ray_local, tiny_model):
    """Real BatchWorkers (tiny model) with a fault injected in each actor (tests/faulty_worker.py): [a, p1] raises
    together, so each runs alone (a ok, p1 its own line); [b, c] ok; [p2] raises alone, so its worker is
    restarted, p2 runs once more there and is written with both errors. No worker is dropped, every id once.
    Also: this Ray's head answers qvl's address probe (--ray-address HOST:PORT)."""
    from qwenvl_rbln.batch import ray_cluster
    from tests.faulty_worker import PoisonedWorker

    ray, _ = ray_local
    ray_cluster.check_reachable(ray.get_runtime_context().gcs_address)
    rows = [{"id": "a"}, {"id": "p1", "prompt": "POISON"}, {"id": "b"}, {"id": "c"}, {"id": "p2", "prompt": "POISON"}]
    work = items(*({"prompt": "Hello.", **r} for r in rows))
    out: list[dict] = []
    events: list[tuple[str, dict]] = []
    spec = WorkerSpec(InferOptions(directory=tiny_model, max_new_tokens=2))
    pool = RayExecutor(spec, workers=1, worker_cls=PoisonedWorker)
    pool.run(iter(work), out.append, lambda name, fields: events.append((name, fields)))
    by_id = {r["id"]: r for r in out}
    assert sorted(by_id) == sorted(r["id"] for r in rows) and len(out) == len(rows)
    assert all(by_id[i]["ok"] and by_id[i]["num_tokens"] == 2 for i in ("a", "b", "c"))
    assert by_id["p1"]["error"]["cause"] == records.INTERNAL and "batch-mates ran" in by_id["p1"]["error"]["message"]
    p2 = by_id["p2"]["error"]
    assert len(p2["attempts"]) == 2 and all("TypeError" in a["message"] for a in p2["attempts"]), p2
    assert any("restarted after" in f["message"] for name, f in events if name == "worker.note")
    assert not any(f.get("state") == "dead" for name, f in events if name == "worker.state")


def test_on_ray_a_request_that_kills_every_worker_is_written_failed_and_the_rest_finish(ray_local):
    work = items({"id": "k"}, {"id": "die", "die": "always"}, *({"id": f"n{i}"} for i in range(5)))
    out, events = run_pool(1, work)
    by_id = {r["id"]: r for r in out}
    assert sorted(by_id) == sorted(w.id for w in work) and len(out) == len(work)
    assert all(by_id[w.id]["ok"] for w in work if w.id != "die"), [(r["id"], r.get("error")) for r in out]
    assert by_id["die"]["error"]["cause"] == records.WORKER_FAILED and len(by_id["die"]["error"]["attempts"]) == 2
    assert not any(f.get("state") == "dead" for name, f in events if name == "worker.state")
