"""The batch job holds against hostile input (issue 37, round 4): no request can stop the job, kill a worker for
good or reach an internal error, and nothing is lost.

- A vision placeholder typed into a prompt (``<|image_pad|>`` and the rest, taken from the tokenizer) is that
  request's ``bad-request`` line, checked before generate; ``qvl infer --prompt`` refuses it in one line.
- Isolation as a rule: a request that makes generate raise, whatever the cause, costs only its own line; a worker
  that fails is restarted, locally and on Ray, and a worker that keeps failing is given up.
- The job's identity (artifact, backend, generation) is recorded beside the results: ``--resume`` of another job
  is refused, naming what differs.
- ``--devices`` ids the host lacks, ``--ray-address ray://...`` and an address where nothing answers are one line
  each, in seconds; an interrupted job's ``--json`` still has its counts.
- Which NPUs a worker holds and how it numbers them (``batch/npus.py``).

The pool's isolation tests on Ray are in tests/test_batch_ray.py, on that module's local emulated Ray (one Ray
start for both, on a 2-core machine): test_on_ray_a_poisoned_request_costs_its_own_line_and_its_worker_is_restarted,
test_on_ray_a_request_that_kills_every_worker_is_written_failed_and_the_rest_finish.
"""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from qwenvl_rbln.batch import records
from qwenvl_rbln.batch.executor import InProcessExecutor
from qwenvl_rbln.batch.npus import WorkerNpus
from qwenvl_rbln.batch.source import WorkItem
from qwenvl_rbln.batch.worker import WorkerSpec
from qwenvl_rbln.errors import BackendError, InputError
from qwenvl_rbln.inference.runner import InferOptions
from tests.fakes_rbln import refused_infer as refused
from tests.fakes_rbln import run_main
from tests.helpers_cli import free_port

PLACEHOLDERS = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>"]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _job(capsys: Any, directory: Path, batch: Path, out: Path, *extra: str) -> tuple[int, Any, str]:
    argv = ["infer", str(directory), "--batch-file", str(batch), "--output", str(out), *extra, "--json"]
    code, stdout, err = run_main(argv, capsys)
    return code, (json.loads(stdout) if stdout.strip() else None), err


# ------------------------------------------------------------------------------ H1: vision placeholders


def test_the_placeholders_come_from_the_tokenizer(tiny_model):
    from qwenvl_rbln.inference.inputs import shared_processor, vision_placeholders

    assert sorted(vision_placeholders(shared_processor(tiny_model))) == sorted(PLACEHOLDERS)


@pytest.mark.parametrize("token", PLACEHOLDERS)
def test_a_placeholder_in_prompt_or_system_is_refused_before_any_load(tiny_model, capsys, no_model_load, token):
    line = refused(capsys, str(tiny_model), "--prompt", f"{token} what is this?", "--max-new-tokens", "2")
    assert f"--prompt contains {token}" in line and "vision placeholder" in line and "--image" in line, line
    line = refused(capsys, str(tiny_model), "--prompt", "Hi.", "--system", f"Be {token} brief.")
    assert f"--system contains {token}" in line, line


def test_placeholders_in_a_batch_job_are_bad_request_lines_and_the_job_goes_on(tiny_rbln, tmp_path, capsys):
    """On the emulated NPU (where optimum-rbln's generate raised for them and stopped the job, exit 5, nothing
    written): each placeholder line is its own bad-request line, its batch-mates run, no worker restarts, and
    --resume gets past them."""
    from PIL import Image

    Image.new("RGB", (64, 48), (20, 200, 40)).save(tmp_path / "green.png")
    rows = [
        {"id": "a", "prompt": "Hello."},
        {"id": "pad", "prompt": "<|image_pad|> what"},
        {"id": "pic", "prompt": "Describe.", "image": "green.png"},
        {"id": "vid", "prompt": "<|video_pad|> and <|vision_start|>"},
        {"id": "sys", "prompt": "Hi.", "system": "<|vision_end|>"},
        {"id": "vpad", "prompt": "x <|vision_pad|>", "image": "green.png"},
        {"id": "b", "prompt": "Bye."},
    ]
    batch = _write(tmp_path / "b.jsonl", rows)
    out = tmp_path / "r.jsonl"
    code, summary, err = _job(capsys, tiny_rbln, batch, out, "--emulate", "--max-new-tokens", "2")
    assert code == 0, err
    by_id = {r["id"]: r for r in _lines(out)}
    assert sorted(by_id) == sorted(r["id"] for r in rows)
    assert all(by_id[i]["ok"] for i in ("a", "pic", "b")), by_id
    for rid, token in (("pad", "<|image_pad|>"), ("vid", "<|video_pad|>"), ("sys", "<|vision_end|>")):
        error = by_id[rid]["error"]
        assert error["cause"] == records.BAD_REQUEST and token in error["message"], error
        assert f"{batch}:" in error["message"]
    assert by_id["vpad"]["error"]["cause"] == records.BAD_REQUEST
    assert summary["failures_by_cause"] == {"bad-request": 4}
    assert not any("restarted" in n for n in summary["notes"]) and summary["workers"][0]["state"] != "dead"
    code, again, err = _job(capsys, tiny_rbln, batch, out, "--emulate", "--max-new-tokens", "2", "--resume")
    assert code == 0 and again["counts"]["skipped_by_resume"] == len(rows) and again["counts"]["done"] == 0, err


# ------------------------------------------------------------------------------ isolation, one NPU


@pytest.mark.parametrize(
    "fault",
    [
        lambda: TypeError("'NoneType' object is not an iterator"),
        lambda: StopIteration(),
        lambda: BackendError("generate failed for request(s) p1: RuntimeError: NPU said no", "rerun"),
    ],
    ids=["TypeError", "StopIteration", "BackendError"],
)
def test_a_request_whose_generate_raises_costs_only_its_own_line(tiny_model, tmp_path, capsys, monkeypatch, fault):
    """Batches of 2: [a, p1] raises together, so each runs alone: a ok, p1 its own line (its batch-mate ran); [b, c]
    ok; [p2] raises alone with nothing to show the worker sound, so the worker is restarted and p2 runs once more
    on the fresh one, then is written with both errors. The job finishes, exit 0, worker alive."""
    from qwenvl_rbln.inference.reference import ReferenceBackend
    from tests.faulty_worker import poisoned

    real = ReferenceBackend.run_batch
    monkeypatch.setattr(
        ReferenceBackend,
        "run_batch",
        lambda self, reqs, *a, **k: poisoned(lambda r, *a2, **k2: real(self, r, *a2, **k2), fault)(reqs, *a, **k),
    )
    rows = [{"id": "a"}, {"id": "p1", "prompt": "POISON"}, {"id": "b"}, {"id": "c"}, {"id": "p2", "prompt": "POISON"}]
    batch = _write(tmp_path / "b.jsonl", [{"prompt": "Hello.", **r} for r in rows])
    out = tmp_path / "r.jsonl"
    code, summary, err = _job(capsys, tiny_model, batch, out, "--max-new-tokens", "2")
    assert code == 0, err
    by_id = {r["id"]: r for r in _lines(out)}
    assert sorted(by_id) == sorted(r["id"] for r in rows) and len(_lines(out)) == len(rows)  # each exactly once
    assert all(by_id[i]["ok"] and by_id[i]["num_tokens"] == 2 for i in ("a", "b", "c"))
    p1 = by_id["p1"]["error"]
    assert p1["cause"] == records.INTERNAL and "alone (its batch-mates ran)" in p1["message"], p1
    p2 = by_id["p2"]["error"]
    assert p2["cause"] == records.INTERNAL and len(p2["attempts"]) == 2, p2
    assert sum("restarted after" in n for n in summary["notes"]) >= 1, summary["notes"]
    assert [w["state"] for w in summary["workers"]] == ["idle"]


class Flaky:
    """A stand-in worker: an item ``{"raise": true}`` makes ``run`` itself raise (the worker breaks, not one
    request); ``{"raise": "load"}`` also makes every later load fail. Counts the loads (restarts)."""

    max_batch = 2
    loads = 0
    broken = False

    def __init__(self, spec: Any):
        if Flaky.broken:
            raise BackendError("cannot open NPU 0", "free it")
        Flaky.loads += 1
        self.spec, self.npu = spec, 0

    def run(self, items: list[WorkItem]) -> list[dict[str, Any]]:
        for item in items:
            if item.raw.get("raise"):
                Flaky.broken = item.raw["raise"] == "load"
                raise RuntimeError(f"device lost on {item.id}")
        return [_ok(i) for i in items]


def _ok(item: WorkItem) -> dict[str, Any]:
    return records.ok_record(
        item, text="ok", token_ids=[1], finish_reason="stop", vision=[], decoder_graph=None, prompt_tokens=1,
        timings={}, worker="worker-0", npu=0,
    )  # fmt: skip


def _run_local(work: list[WorkItem], **kw: Any) -> tuple[list[dict[str, Any]], list[tuple[str, dict]]]:
    Flaky.loads, Flaky.broken = 0, False
    out: list[dict[str, Any]] = []
    events: list[tuple[str, dict]] = []
    ex = InProcessExecutor(WorkerSpec(), worker_cls=Flaky, **kw)
    try:
        ex.run(iter(work), out.append, lambda name, fields: events.append((name, fields)))
    finally:
        ex.close()
    return out, events


def _items(*raws: dict[str, Any]) -> list[WorkItem]:
    return [WorkItem(str(r["id"]), n + 1, r) for n, r in enumerate(raws)]


def test_the_one_npu_worker_is_restarted_after_an_exception_not_dropped():
    """[a, bad] breaks the worker: restarted, a and bad each run alone; bad breaks the fresh one too and is written
    with both errors; the rest runs on a third load."""
    out, events = _run_local(_items({"id": "a"}, {"id": "bad", "raise": True}, {"id": "b"}, {"id": "c"}))
    by_id = {r["id"]: r for r in out}
    assert sorted(by_id) == ["a", "b", "bad", "c"] and len(out) == 4
    assert by_id["a"]["ok"] and by_id["b"]["ok"] and by_id["c"]["ok"]
    err = by_id["bad"]["error"]
    assert (
        err["cause"] == records.WORKER_FAILED
        and [a["message"] for a in err["attempts"]] == ["RuntimeError: device lost on bad"] * 2
    )
    assert Flaky.loads == 3  # the first load and two restarts
    assert not any(f.get("state") == "dead" for name, f in events if name == "worker.state")


def test_a_worker_that_keeps_failing_is_given_up_with_the_rest_left_for_resume():
    work = _items(*({"id": f"k{i}", "raise": True} for i in range(8)))
    with pytest.raises(BackendError, match="failed 3 times in a row") as exc:
        _run_local(work, max_restarts=2)
    assert "--resume" in exc.value.hint


def test_a_worker_that_cannot_load_again_stops_the_job():
    with pytest.raises(BackendError, match="cannot open NPU 0"):
        _run_local(_items({"id": "a"}, {"id": "x", "raise": "load"}, {"id": "b"}))


# ------------------------------------------------------------------------------ M1: --resume of another job


def test_resume_with_other_settings_or_another_artifact_is_refused_naming_what_differs(tiny_model, tmp_path, capsys):
    batch = _write(tmp_path / "b.jsonl", [{"id": f"k{i}", "prompt": f"Say {i}."} for i in range(3)])
    first = _write(tmp_path / "first.jsonl", [{"id": "k0", "prompt": "Say 0."}])
    out = tmp_path / "r.jsonl"
    code, _, err = _job(capsys, tiny_model, first, out, "--max-new-tokens", "1")
    assert code == 0, err
    before = out.read_bytes()
    code, _, err = _job(capsys, tiny_model, batch, out, "--max-new-tokens", "3", "--temperature", "1.5", "--resume")
    assert code == 2 and out.read_bytes() == before, err
    line = next(x for x in err.splitlines() if x.startswith("qvl: error:"))
    assert "written by another job" in line and "was max_new_tokens 1, mode greedy" in line, line
    assert "now max_new_tokens 3, mode sampling, temperature 1.5" in line and "new --output" in line, line
    code, _, err = _job(capsys, tiny_model, batch, out, "--max-new-tokens", "1", "--system", "Be brief.", "--resume")
    assert code == 2 and "default system prompt (--system): was none, now Be brief." in err, err
    code, summary, err = _job(capsys, tiny_model, batch, out, "--max-new-tokens", "1", "--resume")  # the same job
    assert code == 0 and summary["counts"]["skipped_by_resume"] == 1 and summary["counts"]["done"] == 2, err


def test_the_job_record_names_another_artifact_and_backend(tiny_model, tiny_rbln, tmp_path):
    from qwenvl_rbln.batch import stamp
    from qwenvl_rbln.inference.target import resolve_target

    opts = InferOptions(max_new_tokens=2)
    torch_job = stamp.identity(opts, resolve_target(tiny_model, None, []), False, None)
    rbln_job = stamp.identity(opts, resolve_target(tiny_rbln, None, []), True, None)
    diff = stamp.differences(rbln_job, torch_job)
    assert [d.split(":")[0] for d in diff] == ["artifact", "backend", "emulated (--emulate)", "preset (--preset)"]
    assert rbln_job["artifact_sha256"] and stamp.differences(rbln_job, dict(rbln_job, artifact="/moved")) == []


def test_results_without_a_job_record_are_continued_with_a_note(tmp_path):
    from qwenvl_rbln.batch import stamp

    out = tmp_path / "r.jsonl"
    out.write_text('{"id":"a","ok":true}\n')
    job = {"backend": "torch", "generation": {"max_new_tokens": 1, "mode": "greedy"}}
    notes = stamp.check(out, job, resume=True)
    assert notes and "had no job record" in notes[0] and not stamp.sidecar(out).exists()  # nothing written yet
    stamp.record(out, job)
    assert stamp.check(out, job, resume=True) == []
    with pytest.raises(InputError, match=r"generation .*: was max_new_tokens 1, mode greedy, now max_new_tokens 2"):
        stamp.check(out, {**job, "generation": {"max_new_tokens": 2, "mode": "greedy"}}, resume=True)
    stamp.sidecar(out).write_text("[1]")
    with pytest.raises(InputError, match="not a qvl job record"):
        stamp.check(out, job, resume=True)


# ------------------------------------------------------------------------------ M4: an interrupted job's report


class _StopAfter:
    """A stand-in executor: an ok line per item, then Ctrl-C after ``n``."""

    def __init__(self, n: int):
        self.n = n

    def run(self, items, emit, event) -> None:
        event("worker.state", {"worker": "worker-0", "npu": 0, "state": "busy"})
        for k, item in enumerate(items):
            if k == self.n:
                raise KeyboardInterrupt
            emit(_ok(item))

    def close(self) -> None:
        pass


def test_an_interrupted_jobs_json_has_its_counts_and_interrupted_true(tiny_model, tmp_path, capsys, monkeypatch):
    from qwenvl_rbln.batch import driver

    monkeypatch.setattr(driver, "make_executor", lambda opts, npus: _StopAfter(2))
    batch = _write(tmp_path / "b.jsonl", [{"id": f"s{i}", "prompt": "x"} for i in range(6)])
    code, doc, err = _job(capsys, tiny_model, batch, tmp_path / "r.jsonl")
    assert code == 130, err
    assert doc["interrupted"] is True and doc["complete"] is False
    assert doc["counts"] == {"total": 6, "done": 2, "ok": 2, "failed": 0, "skipped_by_resume": 0, "left": 4}
    assert doc["error"]["exit_code"] == 130 and "--resume" in doc["error"]["hint"]
    assert err.count("qvl: error: interrupted after 2 requests") == 1


# ------------------------------------------------------------------------------ pool flags: H9, M2, M3


def test_a_ray_client_address_is_refused_in_one_line(tmp_path, capsys):
    batch = _write(tmp_path / "b.jsonl", [{"prompt": "x"}])
    out = tmp_path / "r.jsonl"
    line = refused(capsys, "--batch-file", str(batch), "--output", str(out), "--ray-address", "ray://127.0.0.1:1")
    assert "is a Ray Client address (ray://)" in line and "--ray-address auto" in line and "HOST:PORT" in line
    assert not out.exists()


def test_devices_the_host_does_not_have_are_refused_naming_them_and_the_count(monkeypatch):
    from qwenvl_rbln.backends import emulator
    from qwenvl_rbln.batch.ray_pool import RayExecutor

    monkeypatch.setenv("QVL_EMULATOR_DEVICES", "4")
    with emulator.active(), pytest.raises(InputError) as exc:
        RayExecutor(WorkerSpec(), devices=[1, 9, 4])
    assert "--devices 1,9,4: this host has 4 NPUs (NPUs 0-3); 9, 4 are not one of them" in exc.value.message
    with emulator.active():
        assert RayExecutor(WorkerSpec(), devices=[3, 0]).workers == 2


class _Listener:
    """A TCP server on 127.0.0.1 that accepts and, with ``answer``, writes it (a gRPC server's SETTINGS frame)."""

    def __init__(self, answer: bytes = b""):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.answer, self.conns = answer, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        try:
            while True:
                conn, _ = self.sock.accept()
                self.conns.append(conn)
                if self.answer:
                    conn.sendall(self.answer)
        except OSError:
            return

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.sock.close()


def test_an_address_where_nothing_answers_fails_at_once_without_joining_ray(monkeypatch):
    pytest.importorskip("ray")
    import ray

    from qwenvl_rbln.batch import ray_cluster

    def joined(**kwargs):
        raise AssertionError("ray.init was called: Ray retries such an address for ten minutes")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", joined)
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(BackendError, match=f"cannot reach the Ray cluster at --ray-address {address}: nothing answers"):
        ray_cluster.start_or_connect(address)
    silent = _Listener()  # something listens, but it is no Ray head: it never answers
    try:
        with pytest.raises(BackendError, match="answers, but not as a Ray head"):
            ray_cluster.check_reachable(f"127.0.0.1:{silent.port}", timeout=0.5)
    finally:
        silent.close()
    grpc = _Listener(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # HTTP/2 SETTINGS, as a GCS answers
    try:
        ray_cluster.check_reachable(f"127.0.0.1:{grpc.port}", timeout=5)
    finally:
        grpc.close()


# ------------------------------------------------------------------------------ B12: a worker's NPUs


@pytest.mark.parametrize(
    ("lm", "vit", "seen", "count", "label"),
    [
        (2, 3, (0, 1), 2, [2, 3]),
        (3, 2, (1, 0), 2, [3, 2]),
        (0, 2, (0, 1), 2, [0, 2]),
        (1, 1, (0, 0), 1, 1),
        ([4, 5], 7, ([0, 1], 2), 3, [4, 5, 7]),
    ],
)
def test_a_workers_npus_are_renumbered_from_0_in_host_order(lm, vit, seen, count, label):
    npus = WorkerNpus.of({"device": lm, "visual_device": vit})
    assert (npus.seen().device, npus.seen().visual_device) == seen
    assert npus.count == count and npus.own_vit == (count > 1) and npus.label == label


@pytest.mark.parametrize(("lm", "vit"), [(2, 3), (3, 2)])
def test_a_pool_worker_loads_the_recorded_pair_renumbered_and_records_host_ids(tmp_path, monkeypatch, lm, vit):
    """From the artifact's manifest (LM and ViT on host NPUs 2 and 3) to the worker's placement: the driver reads
    the pair, the pool sizes its workers by 2, and the actor body (run here, with RBLN_DEVICES as Ray sets it)
    hands the worker devices 0 and 1 in the recorded order, while its records name the host ids."""
    from qwenvl_rbln.artifacts.manifest import write_manifest
    from qwenvl_rbln.batch.driver import _target_check
    from qwenvl_rbln.batch.ray_pool import RayExecutor, WorkerHost
    from qwenvl_rbln.planning.plan import build_plan
    from tests.fakes_rbln import write_artifact

    plan = build_plan("rebel100-2npu-batch4")
    root = write_artifact(tmp_path / "art", plan)
    placement = {"device": lm, "visual_device": vit}
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": placement, "model": {"id": "m"}})
    spec = WorkerSpec(InferOptions(directory=root))
    from qwenvl_rbln.backends import emulator

    was = emulator.is_active()  # an in-process `qvl infer --emulate` earlier leaves it on: this is no emulated artifact
    emulator.deactivate()
    try:
        npus, directory, _ = _target_check(spec, None)
    finally:
        if was:
            emulator.activate()
    assert (npus.device, npus.visual_device, npus.count) == (lm, vit, 2) and directory == str(root.absolute())
    pool = RayExecutor(spec, devices=None, workers=1, npus=npus)
    assert pool.per_worker == 2

    class Seen:
        def __init__(self, spec: Any):
            self.spec = spec

    monkeypatch.setenv("RBLN_DEVICES", "2,3")
    host = WorkerHost(spec, Seen, pool.seen)
    placed = host.worker.spec.opts
    assert (placed.device, placed.visual_device) == ((0, 1) if lm < vit else (1, 0))
    assert host.worker.spec.npu == [2, 3] and host.load_error is None


def test_the_job_record_is_written_with_the_first_line_never_before(tmp_path, capsys, monkeypatch):
    """A job that fails before any request finished (a pool that cannot start, a cluster nothing answers at) leaves
    neither R nor its job record behind; one that writes a line leaves both."""
    from qwenvl_rbln.batch import driver, stamp
    from qwenvl_rbln.batch.npus import WorkerNpus
    from qwenvl_rbln.errors import BackendError
    from tests.fakes_rbln import run_main
    from tests.test_batch_core import Echo, _write

    class NoPool:
        def run(self, items, emit, event) -> None:
            raise BackendError("the pool cannot start", "start it")

        def close(self) -> None:
            pass

    batch = _write(tmp_path / "b.jsonl", [{"id": "a"}, {"id": "b"}])
    job = {"artifact": str(tmp_path), "backend": "rbln"}
    monkeypatch.setattr(driver, "_target_check", lambda spec, system: (WorkerNpus(), str(tmp_path), job))
    for executor, code_wanted, left_behind in ((NoPool(), 5, False), (Echo(), 0, True)):
        monkeypatch.setattr(driver, "make_executor", lambda opts, npus, ex=executor: ex)
        out = tmp_path / f"r-{code_wanted}.jsonl"
        argv = ["infer", str(tmp_path), "--batch-file", str(batch), "--output", str(out)]
        code, _, err = run_main(argv, capsys)
        assert code == code_wanted, err
        assert out.exists() is left_behind and stamp.sidecar(out).exists() is left_behind, err


def test_a_call_that_finished_before_its_actor_died_is_written_not_charged():
    """The Ray pool's wait can hand back the failed call of a dead actor before the call queued ahead of it that
    finished: that finished call's requests are written, and only the call that was running is charged (a race
    the real-Ray test test_on_ray_a_request_that_kills_every_worker_is_written_failed_and_the_rest_finish met)."""
    from types import SimpleNamespace

    from qwenvl_rbln.batch import ray_pool
    from qwenvl_rbln.batch.source import WorkItem

    class Ray:
        def wait(self, refs, num_returns=1, timeout=None):
            return [r for r in refs if r in ("k-call", "die-call")][:num_returns], []

        def get(self, ref):
            if ref == "die-call":
                raise RuntimeError("ActorDiedError: the actor died unexpectedly")
            return [{"id": "k", "ok": True, "num_tokens": 1}]

        def kill(self, handle, no_restart=True) -> None:
            pass

    k, die = WorkItem("k", 1, {}), WorkItem("die", 2, {})
    slot = ray_pool._Slot(name="worker-0", handle=object(), state="busy")
    slot.calls = {"k-call": [k], "die-call": [die]}
    pool = SimpleNamespace(ray=Ray(), depth=2, max_restarts=3, slots=[slot], launch=lambda s: "load")
    written: list[dict] = []
    loop = ray_pool._Loop(pool, iter(()), written.append, lambda name, fields: None, {})
    loop._finished("die-call", slot)
    assert [r["id"] for r in written] == ["k"]  # k finished: written once, never charged or run again
    assert list(loop.failures) == ["die"] and [w.id for w in loop.retry] == ["die"]
