"""``RayExecutor``: one Ray actor per NPU (or NPU pair), each a ``BatchWorker`` that loads the artifact once.

Why a hand-written pool and not Ray Data's ``map_batches``: qvl owns the exactly-once bookkeeping (which request
ran where, which failed on two workers) and writes each result line itself as it completes; an actor pool whose
retries happen inside Ray would hide that. So Ray's own retries are off (``max_restarts=0``,
``max_task_retries=0``) and this module re-queues and restarts:

- requests go to whichever actor has room (``ray.wait`` on every call in flight), at most ``depth`` calls per
  actor (backpressure: the input is pulled only when an actor has room, so a million-line file stays streamed);
- an actor that dies (NPU error, killed process, OOM) or whose call raises (``GenerateFailed``: requests that
  raised alone with nothing else of the call run; or any other exception) is restarted in its slot (killed, and a
  fresh actor loads on the same kind of NPUs), never dropped for one failure; the requests it held go back to the
  queue and run alone (nothing else in flight on their actor: a call that finished just before an actor died may
  never reach the driver, so only a lone call can be blamed for the death); a request that failed on two worker
  processes is written as failed with both errors;
  a slot that fails ``executor.MAX_RESTARTS`` times in a row without a call that finished, or whose actor cannot
  load, is given up; with no live worker left the job stops at once with a clear error (the rest stay undone, so
  ``--resume`` picks them up);
- ``close()`` (also on Ctrl-C) kills every actor and stops a Ray that qvl started.

Device numbering (``RBLN_DEVICES``): Ray 2.60's ``ray/_private/accelerators/rbln.py`` gives each actor that asks
for ``{"RBLN": k}`` its NPUs by setting ``RBLN_DEVICES`` to their host ids (``"2"``, or ``"2,3"``), the way
``CUDA_VISIBLE_DEVICES`` works; when the process that started Ray had ``RBLN_DEVICES`` set (``--devices``), the
ids handed out are taken from that list. optimum-rbln 0.12 does not read the variable: it passes the ``device``
ids of ``rbln_config`` unchanged to ``rebel.Runtime(device=...)`` and checks them with ``rebel.get_npu_name(i)``
and ``rebel.device_count()`` (``optimum/rbln/utils/runtime_utils.py``, ``tp_and_devices_are_ok``); the rebel
runtime numbers the devices listed in ``RBLN_DEVICES`` from 0 inside the process (an ASSUMPTION, as for CUDA:
rebel is closed source; docs/many-npus-ray.md gives the command that checks it on a node). So a worker SEES its
NPUs renumbered from 0 (``WorkerNpus.seen``, ordered as the artifact's recorded placement); the records name the
host ids (``npu``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qwenvl_rbln.batch import records
from qwenvl_rbln.batch.executor import MAX_RESTARTS, Emit, Event, given_up, one_line
from qwenvl_rbln.batch.npus import WorkerNpus, host_label, visible_ids
from qwenvl_rbln.batch.ray_cluster import (
    RBLN,
    VISIBLE_ENV,
    check_artifact_on_nodes,
    check_cluster,
    check_devices_exist,
    ensure_ray,
    forwarded_env,
    start_or_connect,
)
from qwenvl_rbln.batch.source import WorkItem
from qwenvl_rbln.errors import BackendError, InputError

DEPTH = 2  # calls in flight per actor: one running, one queued behind it so the NPU never waits on the driver
WAIT_S = 0.5  # how often the loop wakes without a result (Ctrl-C stays prompt)


class WorkerHost:
    """The actor body: activates the emulator when asked, then builds the worker ONCE on the NPUs as it sees them."""

    def __init__(self, spec: Any, worker_cls: Any, seen: WorkerNpus | None):
        opts = spec.opts
        if getattr(opts, "emulate", False):
            from qwenvl_rbln.backends import emulator

            emulator.activate()
        if seen is not None:  # the artifact's placement, renumbered as RBLN_DEVICES presents this actor's NPUs
            opts = dataclasses.replace(opts, device=seen.device, visual_device=seen.visual_device)
        npu = host_label(visible_ids(os.environ.get(VISIBLE_ENV)))
        self.spec = dataclasses.replace(spec, opts=opts, npu=npu)
        if worker_cls is None:
            from qwenvl_rbln.batch.worker import BatchWorker

            worker_cls = BatchWorker
        self.worker: Any = None
        self.load_error: str | None = None
        try:
            self.worker = worker_cls(self.spec)
        except Exception as exc:  # said by info(): Ray's own report of a failed __init__ is a traceback
            self.load_error = one_line(exc)

    def info(self) -> dict[str, Any]:
        import socket

        host = socket.gethostname()
        if self.load_error is not None:
            return {"npu": self.spec.npu, "host": host, "pid": os.getpid(), "error": self.load_error}
        notes = list(dict.fromkeys(getattr(self.worker, "warnings", [])))  # the tiny-model notice, "emulated"
        return {"npu": self.spec.npu, "host": host, "pid": os.getpid(), "max_batch": self.max_batch(), "notes": notes}

    def max_batch(self) -> int:
        return max(1, int(getattr(self.worker, "max_batch", 1)))

    def run(self, items: list[WorkItem]) -> list[dict[str, Any]]:
        return self.worker.run(items)


@dataclasses.dataclass
class _Slot:
    """One actor as the driver sees it (a restart puts a fresh actor in the same slot, under the same name)."""

    name: str
    handle: Any
    npu: Any = None
    host: str | None = None
    pid: int | None = None
    max_batch: int = 1
    state: str = "loading"
    calls: dict[Any, list[WorkItem]] = dataclasses.field(default_factory=dict)
    requests: int = 0
    tokens: int = 0
    restarts: int = 0  # in a row, without a call that finished


class RayExecutor:
    """The Executor protocol over a pool of Ray actors (see the module docstring)."""

    def __init__(
        self,
        spec: Any,
        workers: int | None = None,
        devices: list[int] | None = None,
        ray_address: str | None = None,
        npus: WorkerNpus | None = None,
        *,
        worker_cls: Any = None,
        depth: int = DEPTH,
        all_loaded_first: bool = False,
        max_restarts: int = MAX_RESTARTS,
    ):
        self.spec = spec
        # the NPUs of one worker (driver._target_check: the artifact's placement; None: one NPU, placed by the worker)
        self.seen = npus.seen() if npus is not None else None
        self.per_worker = (npus or WorkerNpus()).count
        if devices is not None and len(devices) % self.per_worker:
            raise InputError(
                f"--devices {','.join(map(str, devices))} lists {len(devices)} NPUs, but each worker of this artifact "
                f"takes {self.per_worker} (its ViT is on its own NPU)",
                f"list a multiple of {self.per_worker} NPUs",
            )
        fit = None if devices is None else len(devices) // self.per_worker
        if workers is not None and fit is not None and workers > fit:
            raise InputError(f"--workers {workers} is more than --devices gives ({fit})", f"use --workers {fit}")
        if devices is not None and ray_address is None:
            check_devices_exist(devices)  # before the results file is opened, not when Ray starts
        self.workers = workers if workers is not None else fit
        self.devices = devices
        self.address = ray_address
        self.worker_cls = worker_cls
        self.depth = max(1, int(depth))
        self.all_loaded_first = all_loaded_first  # a benchmark's steady state: no request before every worker loaded
        self.max_restarts = max_restarts
        self.slots: list[_Slot] = []
        self.started = False
        self.ray: Any = None
        self._actor: Any = None

    # ----------------------------------------------------------------------------------------- set-up

    def _start(self) -> int:
        self.ray = ensure_ray()
        opts = self.spec.opts
        self.started = start_or_connect(self.address, emulate=bool(opts.emulate), devices=self.devices)
        count, nodes = check_cluster(self.ray, self.workers, self.per_worker)
        if opts.directory:
            check_artifact_on_nodes(self.ray, Path(opts.directory).absolute(), nodes)
        return count

    def _spawn(self, count: int, event: Event) -> dict[Any, _Slot]:
        self._actor = self.ray.remote(WorkerHost).options(
            num_cpus=0,
            resources={RBLN: self.per_worker},
            max_restarts=0,
            max_task_retries=0,
            runtime_env={"env_vars": forwarded_env()},
        )
        loading = {}
        for i in range(count):
            slot = _Slot(name=f"worker-{i}", handle=None)
            self.slots.append(slot)
            loading[self.launch(slot)] = slot
            event("worker.state", {"worker": slot.name, "npu": None, "state": "loading"})
        return loading

    def launch(self, slot: _Slot) -> Any:
        """Start the slot's actor (again, after a restart); the ref of its ``info()``, which answers once loaded."""
        spec = dataclasses.replace(self.spec, name=slot.name)
        slot.handle = self._actor.remote(spec, self.worker_cls, self.seen)
        return slot.handle.info.remote()

    # ------------------------------------------------------------------------------------------- run

    def run(self, items: Iterator[WorkItem], emit: Emit, event: Event) -> None:
        try:
            loading = self._spawn(self._start(), event)
            _Loop(self, iter(items), emit, event, loading).drive()
        finally:
            self.close()

    def close(self) -> None:
        """Kill every actor (no restart) and stop a Ray that qvl started; safe to call twice."""
        ray, slots, self.slots = self.ray, self.slots, []
        if ray is None:
            return
        for slot in slots:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(slot.handle, no_restart=True)
        if self.started:
            self.started = False
            ray.shutdown()


class _Loop:
    """The dispatch loop of one ``run``: fill free actors, wait for any call, account for what came back."""

    def __init__(self, pool: RayExecutor, source: Iterator[WorkItem], emit: Emit, event: Event, loading: dict):
        self.pool, self.ray, self.source, self.emit, self.event = pool, pool.ray, source, emit, event
        self.loading: dict[Any, _Slot] = loading
        self.retry: collections.deque[WorkItem] = collections.deque()
        # the calls of retried requests: alone on their actor, so an actor that dies while one runs can only be
        # blamed on it (a call finished just before may not have reached the driver when its actor died)
        self.alone: set[Any] = set()
        self.failures: dict[str, list[dict[str, Any]]] = {}
        self.exhausted = False
        self.deaths: list[str] = []

    def _take(self, n: int) -> list[WorkItem]:
        if self.retry:  # alone: a request that shared a call with the one that failed a worker must not fail twice
            return [self.retry.popleft()]
        batch: list[WorkItem] = []
        while len(batch) < n and not self.exhausted:
            try:
                batch.append(next(self.source))
            except StopIteration:
                self.exhausted = True
        return batch

    def _fill(self) -> None:
        if self.pool.all_loaded_first and self.loading:
            return
        for slot in self.pool.slots:
            while slot.state in ("idle", "busy") and len(slot.calls) < self.pool.depth:
                if self.alone.intersection(slot.calls) or (self.retry and slot.calls):
                    break  # a retried request runs with nothing else in flight on its actor, before or behind it
                retried = bool(self.retry)
                batch = self._take(slot.max_batch)
                if not batch:
                    return
                ref = slot.handle.run.remote(batch)
                slot.calls[ref] = batch
                if retried:
                    self.alone.add(ref)
                self._state(slot, "busy")

    def _state(self, slot: _Slot, state: str) -> None:
        if slot.state != state:
            slot.state = state
            self.event("worker.state", {"worker": slot.name, "npu": slot.npu, "state": state})

    def drive(self) -> None:
        while True:
            self._fill()
            calls = {ref: slot for slot in self.pool.slots for ref in slot.calls}
            if not calls:
                if self.exhausted and not self.retry:
                    return  # every request has its line (an actor still loading after a restart is not waited for)
                if not self.loading:
                    self._no_worker_left()
            refs = list(calls) + list(self.loading)
            done, _ = self.ray.wait(refs, num_returns=1, timeout=WAIT_S)
            for ref in done:
                if ref in self.loading:
                    self._loaded(ref, self.loading.pop(ref))
                elif ref in calls[ref].calls:  # still held: not re-queued by a restart of its slot meanwhile
                    self._finished(ref, calls[ref])

    def _loaded(self, ref: Any, slot: _Slot) -> None:
        try:
            info = self.ray.get(ref)
        except Exception as exc:
            self._dead(slot, f"could not load: {_short(exc)}")
            return
        slot.npu, slot.host, slot.pid = info["npu"], info["host"], info["pid"]
        if info.get("error"):
            self._dead(slot, f"could not load: {info['error']}")
            return
        slot.max_batch = info["max_batch"]
        for line in info.get("notes") or []:
            self.event("worker.note", {"worker": slot.name, "message": line})
        self._state(slot, "idle")

    def _finished(self, ref: Any, slot: _Slot) -> None:
        from qwenvl_rbln.batch.worker import GenerateFailed

        try:
            out = self.ray.get(ref)
        except Exception as exc:
            failed = _cause(exc, GenerateFailed)
            if failed is None:  # the actor died, or its call raised out of run: each request of it is a suspect
                self._restart(slot, _short(exc), charged=None)
                return
            slot.calls.pop(ref)
            self.alone.discard(ref)
            self._write(failed.records, slot)
            self._restart(slot, str(failed), charged=failed.failed)
            return
        slot.calls.pop(ref)
        self.alone.discard(ref)
        slot.restarts = 0
        self._write(out, slot)
        if not slot.calls:
            self._state(slot, "idle")

    def _write(self, out: list[dict[str, Any]], slot: _Slot) -> None:
        for record in out:
            self.failures.pop(record.get("id"), None)  # a request that failed once and then ran: forget the attempt
            self.emit(record)
            slot.requests += 1
            slot.tokens += int(record.get("num_tokens") or 0)
        self.event("worker.done", {"worker": slot.name, "requests": slot.requests, "tokens": slot.tokens})

    def _failed(self, item: WorkItem, error: dict[str, Any]) -> None:
        """A request its worker failed on: re-queue it, or write it as failed once two worker processes did."""
        errors = self.failures.setdefault(item.id, [])
        errors.append(error)
        if len(errors) >= 2:
            del self.failures[item.id]
            self.emit(records.failed_twice(item, errors))
        else:
            self.retry.append(item)

    def _release(self, slot: _Slot, why: str, charged: list[tuple[WorkItem, dict[str, Any]]] | None) -> None:
        """Kill the slot's actor (it may be alive but broken) and re-queue what it still held. ``charged``: the
        requests blamed for this failure, with their errors; None: the call it was running (an actor runs its
        calls in order: the oldest) counts as an attempt of each of its requests. The calls queued behind it do
        not count."""
        self._harvest(slot)
        with contextlib.suppress(Exception):
            self.ray.kill(slot.handle, no_restart=True)
        self.alone.difference_update(slot.calls)
        for n, batch in enumerate(slot.calls.values()):
            for item in batch:
                if n == 0 and charged is None:
                    self._failed(item, records.error_dict(records.WORKER_FAILED, why, slot.name, slot.npu))
                else:
                    self.retry.append(item)
        for item, error in charged or []:
            self._failed(item, error)
        slot.calls.clear()

    def _harvest(self, slot: _Slot) -> None:
        """Write the calls of ``slot`` that finished before it failed (``ray.wait`` may hand the failed call back
        first): the oldest call still held is then the one that was running, and no finished request is charged
        or run twice. An actor runs its calls in order, so nothing behind an unfinished or failed call finished."""
        for ref in list(slot.calls):
            if not self.ray.wait([ref], num_returns=1, timeout=0)[0]:
                return
            try:
                out = self.ray.get(ref)
            except Exception:
                return
            slot.calls.pop(ref)
            self.alone.discard(ref)
            self._write(out, slot)

    def _restart(self, slot: _Slot, why: str, charged: list[tuple[WorkItem, dict[str, Any]]] | None) -> None:
        """Release the slot (``_release``) and load a fresh actor in it; given up after too many in a row."""
        self._release(slot, why, charged)
        slot.restarts += 1
        if slot.restarts > self.pool.max_restarts:
            self._give_up(slot, given_up(slot.name, slot.npu, slot.restarts, why).message)
            return
        self.event("worker.note", {"worker": slot.name, "message": f"{slot.name} restarted after: {why}"})
        self._state(slot, "loading")
        self.loading[self.pool.launch(slot)] = slot

    def _dead(self, slot: _Slot, why: str) -> None:
        """A slot whose actor could not load: given up (a load failure is not a request's fault)."""
        self._release(slot, why, None)
        self._give_up(slot, why)

    def _give_up(self, slot: _Slot, why: str) -> None:
        if slot.state == "dead":
            return
        self.deaths.append(f"{slot.name} (NPU {slot.npu}, {slot.host or 'not started'}): {why}")
        self._state(slot, "dead")

    def _no_worker_left(self) -> None:
        raise BackendError(
            f"no live worker left (each died or could not load); {len(self.retry)} started request(s) and the rest "
            "of the batch are not done: " + "; ".join(self.deaths[-4:]),
            "fix the cause above, then rerun with --resume (completed lines are kept)",
        )


def _cause(exc: BaseException, kind: type) -> Any:
    """The worker's own exception of type ``kind`` behind Ray's wrapper (``RayTaskError.cause``), or None."""
    if isinstance(exc, kind):
        return exc
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, kind) else None


def _short(exc: BaseException) -> str:
    """One line for a record: the worker's own exception when Ray wraps it, without Ray's traceback."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, type(exc)):
        exc = cause
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    text = text.split(" Some common causes include")[0]  # Ray's generic advice after a worker process died
    return f"{type(exc).__name__}: {text or 'no message'}"[:400]
