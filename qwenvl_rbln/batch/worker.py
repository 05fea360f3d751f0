"""One model replica of a batch job: load the artifact once, then run batch after batch of ``WorkItem``s.

A ``BatchWorker`` owns one NPU (or an NPU pair: LM and ViT on their own devices, ``batch/npus.py``). It reuses
``qvl infer``'s own pieces (``inference/runner.py``: ``_plan_run`` for the target, placement and every check made
before a model loads, then the backend; ``inference/requests.py``: a line's request; ``vision_report``: ViT
buckets; ``generation``: the length check), so a request gives the same tokens in a batch job as in ``qvl infer``.

``run(items)`` returns exactly one record per item. A request that cannot run (a missing image, a corrupt video,
a prompt too long for the context, a vision placeholder typed into its prompt, a bad key) becomes an error record
naming the cause. Isolation is the rule, not a list of cases: when a batched generate raises, whatever the cause,
each request of the batch runs again alone before any is blamed, so only the request that raises alone fails:

- alone, with a batch-mate that ran in the same call (the worker is sound): that request's error line;
- alone, with nothing of the call run (a one-request call, or every request raising): the worker may be what is
  broken, so ``run`` raises ``GenerateFailed`` with the records it has; the executor restarts the worker and runs
  each such request once more, alone, on the fresh one, and writes it as failed only if it raises there too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.batch import records
from qwenvl_rbln.batch.npus import WorkerNpus
from qwenvl_rbln.batch.source import WorkItem
from qwenvl_rbln.errors import InputError, QvlError
from qwenvl_rbln.inference.runner import InferOptions


@dataclass
class WorkerSpec:
    """What a worker needs to load and run (picklable: it travels to Ray actors): ``qvl infer``'s own options
    (artifact, preset, generation, placement: no request of its own), and what its records say."""

    opts: InferOptions = field(default_factory=InferOptions)
    name: str = "worker-0"
    npu: Any = None  # the NPU(s) as the host numbers them, for the records (None: the placement's)
    batch_file: str | None = None  # relative media paths resolve against its folder; error lines name it
    media_base: str | None = None  # absolute folder for relative media paths (default: batch_file's folder)


class GenerateFailed(Exception):  # noqa: N818 - a report to the executor, not an error the user sees
    """Requests whose generate raised alone while nothing else of the call ran, so the worker itself may be broken.

    ``records``: the call's other records (checks that failed, requests that ran); ``failed``: ``(item, error)``
    for each suspect (``records.error_dict``). Picklable (a Ray actor raises it to the driver)."""

    def __init__(self, done: list[dict[str, Any]], failed: list[tuple[WorkItem, dict[str, Any]]]):
        super().__init__(done, failed)
        self.records = done
        self.failed = failed

    def __str__(self) -> str:
        return "; ".join(f"{item.id}: {err.get('message')}" for item, err in self.failed)[:400]


@dataclass
class _Ready:
    """A request that passed every per-request check, with its vision plan."""

    item: WorkItem
    request: Any
    vision: list[Any]


@dataclass
class _Suspect:
    """A request whose generate raised alone, with nothing of its call run: the executor retries it."""

    item: WorkItem
    error: dict[str, Any]


class BatchWorker:
    """The artifact loaded once (``__init__``); ``run`` generates for up to ``max_batch`` items at a time."""

    def __init__(self, spec: WorkerSpec, *, model_cls: Any = None):
        from qwenvl_rbln.inference import runner
        from qwenvl_rbln.inference.inputs import load_processor

        self.spec = spec
        self.opts = spec.opts
        plan = runner._plan_run(self.opts, requests=[])  # qvl infer's checks before a load: target, flags, placement
        self.gen, self.target, self.emulated, self.placement = plan.gen, plan.target, plan.emulated, plan.placement
        self.bucket_memory = plan.bucket_memory  # one memory answer per bucket, for every request
        self.warnings: list[str] = list(dict.fromkeys(plan.warnings))
        caps = plan.vplan.caps
        self.processor = load_processor(self.target.directory, caps)  # counts prompts (no weights)
        self.backend = runner.load_backend(self.opts, self.target, caps, self.placement, plan.torch_dev, model_cls)
        self.max_batch = int(self.target.resolved.batch_size)
        if self.target.tiny:
            self.warnings.insert(0, runner.TINY_NOTICE)
        if self.emulated:
            self.warnings.append(
                "emulated: qvl's CPU emulator of rebel ran these requests, no NPU; timings say nothing about one"
            )
        if spec.npu is not None:
            self.npu = spec.npu
        else:
            self.npu = WorkerNpus.of(self.placement["requested"]).label if self.placement is not None else None
        base = spec.media_base or (Path(spec.batch_file).parent if spec.batch_file else Path.cwd())
        self.base = Path(base).absolute()

    def _where(self, item: WorkItem) -> str:
        return f"{self.spec.batch_file or 'batch'}:{item.line}"

    def _error(self, item: WorkItem, cause: str, exc: BaseException, why: str = "") -> dict[str, Any]:
        return records.error_record(item, self._error_dict(cause, exc, why))

    def _error_dict(self, cause: str, exc: BaseException, why: str = "") -> dict[str, Any]:
        message = exc.one_line() if isinstance(exc, QvlError) else f"{type(exc).__name__}: {exc}"
        return records.error_dict(cause, why + message, self.spec.name, self.npu)

    def _check(self, item: WorkItem) -> _Ready | dict[str, Any]:
        """One request through ``qvl infer``'s checks, alone: ready to run, or its error record. Nothing here
        touches the device, so even an unexpected exception is that request's problem (``internal``)."""
        try:
            return self._checked(item)
        except Exception as exc:  # noqa: BLE001 - one odd request must not stop a million-request job
            return self._error(item, records.INTERNAL, exc)

    def _checked(self, item: WorkItem) -> _Ready | dict[str, Any]:
        from qwenvl_rbln.inference import runner
        from qwenvl_rbln.inference.inputs import check_media, check_prompt_text
        from qwenvl_rbln.inference.requests import from_object, validate_request

        try:
            req = from_object(self._where(item), item.raw, self.base, item.id)
        except InputError as exc:
            return self._error(item, records.BAD_REQUEST, exc)
        try:
            validate_request(req)
        except InputError as exc:
            return self._error(item, _probe_cause(req, exc), exc)
        try:
            check_prompt_text(self.processor, req)  # a vision placeholder typed into the text breaks generate
        except InputError as exc:
            return self._error(item, records.BAD_REQUEST, exc)
        try:
            vplan = runner.vision_plan(self.opts, self.target, [req], self.bucket_memory)
        except InputError as exc:
            return self._error(item, records.OVERSIZE, exc)
        req.caps = vplan.request_caps[req.id]
        try:
            check_media([req], vplan.caps)
        except InputError as exc:
            return self._error(item, records.CORRUPT_MEDIA, exc)
        try:
            runner.check_prompt_room(
                [req], vplan, self.gen.max_new_tokens, self.target.resolved.max_seq_len, self.processor
            )
        except InputError as exc:
            return self._error(item, records.TOO_LONG, exc)
        return _Ready(item, req, vplan.items[req.id])

    def run(self, items: list[WorkItem]) -> list[dict[str, Any]]:
        """Exactly one record per item, in item order; ``GenerateFailed`` (with the others' records) when requests
        raised alone and nothing else of the call ran (see the module docstring)."""
        if len(items) > self.max_batch:
            out: list[dict[str, Any]] = []
            for start in range(0, len(items), self.max_batch):
                out.extend(self.run(items[start : start + self.max_batch]))
            return out
        checked = [self._check(item) for item in items]
        ready = [c for c in checked if isinstance(c, _Ready)]
        done = {id(r): rec for r, rec in zip(ready, self._generate(ready), strict=True)} if ready else {}
        out = [done[id(c)] if isinstance(c, _Ready) else c for c in checked]
        suspects = [x for x in out if isinstance(x, _Suspect)]
        if suspects:
            raise GenerateFailed([x for x in out if isinstance(x, dict)], [(x.item, x.error) for x in suspects])
        return out

    def _generate(self, ready: list[_Ready]) -> list[dict[str, Any] | _Suspect]:
        """One outcome per ready request: generated together; if that raises (any exception), each alone."""
        together = self._attempt(ready)
        if isinstance(together, list):
            return together
        alone = [together] if len(ready) == 1 else [self._attempt([r]) for r in ready]
        sound = any(isinstance(o, list) for o in alone)  # a request of this call ran: the worker works
        out: list[dict[str, Any] | _Suspect] = []
        for r, outcome in zip(ready, alone, strict=True):
            if isinstance(outcome, list):
                out.extend(outcome)
            elif isinstance(outcome, InputError):  # found only at generate (the processor refusing an input)
                cause = records.TOO_LONG if "max_seq_len" in outcome.message else records.CORRUPT_MEDIA
                out.append(self._error(r.item, cause, outcome))
            elif sound:
                why = "generate raised for this request alone (its batch-mates ran): "
                out.append(self._error(r.item, records.INTERNAL, outcome, why))
            else:
                out.append(_Suspect(r.item, self._error_dict(records.INTERNAL, outcome, "generate raised: ")))
        return out

    def _attempt(self, ready: list[_Ready]) -> list[dict[str, Any]] | Exception:
        """The records of ``ready`` generated together, or the exception generate raised."""
        t0 = time.perf_counter()
        try:
            result = self.backend.run_batch(
                [r.request for r in ready], self.gen, sink=None, max_seq_len=self.target.resolved.max_seq_len
            )
        except Exception as exc:  # noqa: BLE001 - any cause: the batch is split, each request tried alone
            return exc
        from qwenvl_rbln.inference.runner import decoder_info

        dec = decoder_info(len(ready), self.target.resolved)
        timings = dict(result.timings, batch_s=round(time.perf_counter() - t0, 4), batch_rows=len(ready))
        return [
            records.ok_record(
                r.item,
                text=row.text,
                token_ids=row.token_ids,
                finish_reason=row.finish_reason,
                vision=[v.to_dict() for v in r.vision],
                decoder_graph=dec["decoder_graph"],
                prompt_tokens=row.prompt_tokens,
                timings=timings,
                worker=self.spec.name,
                npu=self.npu,
            )
            for r, row in zip(ready, result.rows, strict=True)
        ]

    def close(self) -> None:
        backend, self.backend = self.backend, None
        if backend is not None:
            backend.close()


def _probe_cause(req: Any, exc: InputError) -> str:
    """A header probe's refusal: a file that is not there, one given as the wrong kind, or one that is damaged."""
    if any(not Path(p).exists() for p in [*req.images, *req.videos]):
        return records.MISSING_MEDIA
    text = exc.message
    if "looks like" in text or "nothing to run" in text:
        return records.BAD_REQUEST
    return records.CORRUPT_MEDIA
