"""The batch job's bookkeeping, without a model or a Ray: restart counts that reset when a call finishes (both
executors), the Ray pool's rule that a retried request runs alone on its actor (and leaves the set of such calls
once it finishes), the cause a failed request is filed under, which system prompt a line runs with, the order of a
refused file's bad lines, and one lock for a results file reached through a symlink.

The Ray pool's dispatch loop (``ray_pool._Loop``) is driven here with a stand-in for Ray's ``wait``/``get`` so
each rule is checked on its own, deterministically; ``tests/test_batch_ray.py`` runs the same loop on a real Ray.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from qwenvl_rbln.batch import ray_pool, records, results, source
from qwenvl_rbln.batch.executor import InProcessExecutor
from qwenvl_rbln.batch.source import WorkItem
from qwenvl_rbln.batch.worker import BatchWorker, WorkerSpec, _probe_cause, _Ready
from qwenvl_rbln.errors import BusyError, InputError, InputErrors


def _items(*raws: dict[str, Any]) -> list[WorkItem]:
    return [WorkItem(str(r["id"]), n + 1, r) for n, r in enumerate(raws)]


def _ok(item: WorkItem) -> dict[str, Any]:
    return records.ok_record(
        item, text="ok", token_ids=[1], finish_reason="stop", vision=[], decoder_graph=None, prompt_tokens=1,
        timings={}, worker="worker-0", npu=0,
    )  # fmt: skip


# ----------------------------------------------------------------------------- one NPU: restarts in a row


class BreaksOnce:
    """A stand-in worker: an item ``{"breaks": true}`` makes ``run`` raise the first time it is seen (a device
    hiccup: the fresh worker runs it fine). Counts its loads."""

    max_batch = 2
    loads = 0
    seen: set[str] = set()

    def __init__(self, spec: Any):
        BreaksOnce.loads += 1
        self.npu = 0

    def run(self, items: list[WorkItem]) -> list[dict[str, Any]]:
        for item in items:
            if item.raw.get("breaks") and item.id not in BreaksOnce.seen:
                BreaksOnce.seen.add(item.id)
                raise RuntimeError(f"device hiccup on {item.id}")
        return [_ok(i) for i in items]


def test_scattered_failures_with_finished_calls_between_never_give_the_worker_up():
    """max_restarts 1: two unrelated failures, each followed by calls that finished, are two restarts of one in a
    row each, not two in a row: the job finishes (a worker given up would stop it with 'failed 2 times')."""
    BreaksOnce.loads, BreaksOnce.seen = 0, set()
    work = _items({"id": "x1", "breaks": True}, {"id": "a"}, {"id": "b"}, {"id": "c"}, {"id": "x2", "breaks": True})
    out: list[dict[str, Any]] = []
    ex = InProcessExecutor(WorkerSpec(), worker_cls=BreaksOnce, max_restarts=1)
    try:
        ex.run(iter(work), out.append, lambda name, fields: None)
    finally:
        ex.close()
    assert sorted(r["id"] for r in out) == ["a", "b", "c", "x1", "x2"] and all(r["ok"] for r in out)
    assert BreaksOnce.loads == 3  # the first load and one restart after each failure


# ----------------------------------------------------------------------------- the Ray pool's dispatch loop


class _Ray:
    """Ray's wait/get/kill as the loop uses them: a call is done once the test gives it a result."""

    def __init__(self) -> None:
        self.results: dict[str, Any] = {}

    def wait(self, refs, num_returns=1, timeout=None):
        done = [r for r in refs if r in self.results][:num_returns]
        return done, [r for r in refs if r not in done]

    def get(self, ref):
        value = self.results[ref]
        if isinstance(value, BaseException):
            raise value
        return value

    def kill(self, handle, no_restart=True) -> None:
        pass


class _Actor:
    """An actor handle: ``run.remote(batch)`` hands back a new ref and keeps the batch."""

    def __init__(self, name: str):
        self.name, self.sent = name, []
        self.run = SimpleNamespace(remote=self._remote)

    def _remote(self, batch: list[WorkItem]) -> str:
        self.sent.append(batch)
        return f"{self.name}-call{len(self.sent)}"


def _loop(slots: list[ray_pool._Slot], source_items: list[WorkItem]) -> tuple[ray_pool._Loop, list[dict]]:
    pool = SimpleNamespace(ray=_Ray(), depth=2, max_restarts=3, slots=slots, launch=lambda s: "load",
                           all_loaded_first=False)  # fmt: skip
    written: list[dict] = []
    return ray_pool._Loop(pool, iter(source_items), written.append, lambda name, fields: None, {}), written


def _slot(name: str, **kw: Any) -> ray_pool._Slot:
    return ray_pool._Slot(name=name, handle=_Actor(name), max_batch=2, **{"state": "idle", **kw})


def test_a_retried_request_runs_alone_never_behind_or_before_another_call_on_its_actor():
    """'r' is re-queued after its actor died: it goes to the free actor, alone, and nothing follows it there while
    it runs; the actor with a call in flight gets neither it nor anything behind it in the same pass (a second
    death there could only be blamed on 'r' if 'r' ran with nothing else)."""
    a, b, c, r = _items({"id": "a"}, {"id": "b"}, {"id": "c"}, {"id": "r"})
    busy, free = _slot("worker-0", state="busy"), _slot("worker-1")
    busy.calls = {"worker-0-call0": [a]}
    loop, _ = _loop([busy, free], [b, c])
    loop.retry = collections.deque([r])
    loop._fill()
    assert list(busy.calls.values()) == [[a]]  # nothing new behind the call in flight while 'r' waited
    assert list(free.calls.values()) == [[r]] and loop.alone == set(free.calls)  # 'r' alone, nothing behind it
    assert not loop.retry


def test_a_retried_call_that_finished_leaves_the_alone_set_and_its_slot_is_filled_again():
    """The set of lone calls holds a retried call only while it runs (it would otherwise keep every retried call's
    ref, and its result in Ray's object store, for the job's life); its actor then takes new work again."""
    r, b, c = _items({"id": "r"}, {"id": "b"}, {"id": "c"})
    slot = _slot("worker-0", restarts=2)
    loop, written = _loop([slot], [b, c])
    loop.retry = collections.deque([r])
    loop._fill()
    (ref,) = slot.calls
    assert loop.alone == {ref}
    loop.ray.results[ref] = [_ok(r)]
    loop._finished(ref, slot)
    assert [x["id"] for x in written] == ["r"] and loop.alone == set()
    assert slot.restarts == 0  # a call that finished: the next failure is the first in a row again
    loop._fill()
    assert list(slot.calls.values()) == [[b, c]]


def test_a_retried_call_whose_requests_failed_again_leaves_the_alone_set_too():
    from qwenvl_rbln.batch.worker import GenerateFailed

    (r,) = _items({"id": "r"})
    slot = _slot("worker-0")
    loop, written = _loop([slot], [])
    loop.retry = collections.deque([r])
    loop.failures = {"r": [records.error_dict(records.INTERNAL, "first", "worker-0", 0)]}
    loop._fill()
    (ref,) = slot.calls
    loop.ray.results[ref] = GenerateFailed([], [(r, records.error_dict(records.INTERNAL, "again", "worker-0", 0))])
    loop._finished(ref, slot)
    assert loop.alone == set() and [x["id"] for x in written] == ["r"] and not written[0]["ok"]


# ----------------------------------------------------------------------------- the cause a request is filed under


def _worker_whose_generate_raises(exc: Exception) -> BatchWorker:
    """A BatchWorker's own _generate with a backend that raises ``exc`` (nothing loaded: no model needed)."""
    worker = object.__new__(BatchWorker)
    worker.spec, worker.npu, worker.gen = WorkerSpec(), 0, None
    worker.target = SimpleNamespace(resolved=SimpleNamespace(max_seq_len=64))

    def run_batch(*args: Any, **kwargs: Any) -> Any:
        raise exc

    worker.backend = SimpleNamespace(run_batch=run_batch)
    return worker


@pytest.mark.parametrize(
    ("message", "cause"),
    [
        ("request p: prompt of 60 tokens + --max-new-tokens 8 = 68 exceeds the compiled max_seq_len 64", "too-long"),
        ("clip.mp4: not a readable video (Invalid data found when processing input)", "corrupt-media"),
    ],
)
def test_a_refusal_found_only_at_generate_is_filed_under_its_own_cause(message, cause):
    worker = _worker_whose_generate_raises(InputError(message, "fix it"))
    (item,) = _items({"id": "p"})
    (record,) = worker._generate([_Ready(item, request=None, vision=[])])
    assert not record["ok"] and record["error"]["cause"] == cause, record["error"]


def test_a_request_with_one_missing_image_of_several_is_missing_media(tmp_path):
    from PIL import Image

    from qwenvl_rbln.inference.requests import from_object, validate_request

    Image.new("RGB", (32, 32)).save(tmp_path / "here.png")
    req = from_object("b.jsonl:1", {"prompt": "x", "images": ["here.png", "gone.png"]}, tmp_path, "1")
    with pytest.raises(InputError) as exc:
        validate_request(req)
    assert _probe_cause(req, exc.value) == records.MISSING_MEDIA


# ----------------------------------------------------------------------------- the batch file


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_system_is_the_default_a_lines_own_system_prompt_wins(tmp_path):
    """docs/many-npus.md: `--system` fills only lines without their own "system" (as in the in-memory run)."""
    from qwenvl_rbln.inference.requests import parse_batch_file

    rows = [{"id": "own", "prompt": "x", "system": "Be a pirate."}, {"id": "none", "prompt": "y"}]
    batch = _write(tmp_path / "b.jsonl", rows)
    job = {i.id: i.raw.get("system") for i in source.iter_items(batch, default_system="Be brief.")}
    assert job == {"own": "Be a pirate.", "none": "Be brief."}
    in_memory = {r.id: r.system for r in parse_batch_file(batch, default_system="Be brief.")}
    assert in_memory == job


def test_a_refused_files_bad_lines_are_listed_in_line_order(tmp_path):
    """A parse error (line 4) is found in the first pass, the duplicate ids (lines 1 and 2) only in the second:
    the list reads in the file's order all the same."""
    rows = [{"id": "a"}, {"id": "b"}, {"id": "a"}, "not json", {"id": "b"}, "[1]"]
    batch = _write(tmp_path / "b.jsonl", rows)
    with pytest.raises(InputErrors) as exc:
        source.check_unique_ids(batch)
    at = [int(line.split(f"{batch}:", 1)[1].split(":", 1)[0]) for line in exc.value.detail_lines()]
    assert at == [1, 2, 4, 6], exc.value.detail_lines()


def test_a_results_file_and_a_symlink_to_it_are_one_job(tmp_path):
    """Two jobs on one results file, one through a symlink: the second is refused at once, naming the first."""
    target = tmp_path / "r.jsonl"
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    with (
        results.results_lock(target),
        pytest.raises(BusyError, match="being written by pid"),
        results.results_lock(link),
    ):
        pass
    with results.results_lock(link):  # free again once the first job ends
        pass
