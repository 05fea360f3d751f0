"""One model replica of a batch job: load the artifact once, then run batch after batch of ``WorkItem``s.

A ``BatchWorker`` owns one NPU (or an NPU pair: LM and ViT on their own devices). It reuses ``qvl infer``'s own
pieces (``inference/runner.py``: target, placement, backend; ``inference/requests.py``: a line's request;
``vision_report``: ViT buckets; ``generation``: the length check), so a request gives the same tokens in a batch
job as in ``qvl infer``.

``run(items)`` returns exactly one record per item. A request that cannot run (a missing image, a corrupt video,
a prompt too long for the context, a bad key) becomes an error record naming the cause; only a failure of the
process or the device (the runtime died) raises, so the pool can re-queue the batch on another worker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.batch import records
from qwenvl_rbln.batch.source import WorkItem
from qwenvl_rbln.errors import InputError


@dataclass
class WorkerSpec:
    """What a worker needs to load and run (picklable: it travels to Ray actors)."""

    directory: str | None = None  # the artifact (or HF) directory; None: qvl infer's default
    preset: str | None = None
    sets: list[str] = field(default_factory=list)
    emulate: bool = False
    max_new_tokens: int = 64
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    on_oversize: str | None = None
    vit_packing: bool = True
    torch_device: str | None = None
    devices: list[int] = field(default_factory=list)  # as the worker SEES them (after RBLN_DEVICES remapping)
    name: str = "worker-0"
    npu: Any = None  # the NPU(s) as the host numbers them, for the records (None: the placement's device)
    batch_file: str | None = None  # relative media paths resolve against its folder; error lines name it
    media_base: str | None = None  # absolute folder for relative media paths (default: batch_file's folder)
    device: Any = None  # one-NPU job: --device / --visual-device as given (used when ``devices`` is empty)
    visual_device: Any = None

    def infer_options(self) -> Any:
        from qwenvl_rbln.inference.runner import InferOptions

        device, visual = self.device, self.visual_device
        if self.devices:  # a pool's worker: its NPUs as it sees them; the second (if any) runs the ViT
            device = self.devices[0]
            visual = self.devices[1] if len(self.devices) > 1 else device
        return InferOptions(
            directory=Path(self.directory) if self.directory else None,
            preset=self.preset,
            sets=list(self.sets),
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            device=device,
            visual_device=visual,
            on_oversize=self.on_oversize,
            torch_device=self.torch_device,
            emulate=self.emulate,
            vit_packing=self.vit_packing,
        )


@dataclass
class _Ready:
    """A request that passed every per-request check, with its vision plan."""

    item: WorkItem
    request: Any
    vision: list[Any]


class BatchWorker:
    """The artifact loaded once (``__init__``); ``run`` generates for up to ``max_batch`` items at a time."""

    def __init__(self, spec: WorkerSpec, *, model_cls: Any = None):
        from qwenvl_rbln.inference import runner
        from qwenvl_rbln.inference.generation import GenerationOptions
        from qwenvl_rbln.inference.inputs import load_processor
        from qwenvl_rbln.inference.reference import device_spelling
        from qwenvl_rbln.inference.target import resolve_target
        from qwenvl_rbln.inference.vision_report import bucket_memory_check

        self.spec = spec
        self.opts = spec.infer_options()
        self.gen = GenerationOptions(spec.max_new_tokens, spec.temperature, spec.top_p, spec.seed)
        device_spelling(self.opts.torch_device)
        self.target = resolve_target(self.opts.directory, self.opts.preset, self.opts.sets)
        self.emulated = runner.emulation(self.opts, self.target)
        self.warnings: list[str] = list(self.target.warnings) + self.gen.warnings()
        self.placement, torch_dev = runner.place(self.opts, self.target, self.warnings)
        self.bucket_memory = bucket_memory_check(self.target.plan)  # one memory answer per bucket, for every request
        runner.vision_plan(self.opts, self.target, [], self.bucket_memory)  # a bad --on-oversize fails the job
        caps = self.target.plan.processor
        self.processor = load_processor(self.target.directory, caps)  # counts prompts (no weights)
        self.backend = runner.load_backend(self.opts, self.target, caps, self.placement, torch_dev, model_cls)
        self.max_batch = int(self.target.resolved.batch_size)
        if self.target.tiny:
            self.warnings.insert(0, runner.TINY_NOTICE)
        if self.emulated:
            self.warnings.append(
                "emulated: qvl's CPU emulator of rebel ran these requests, no NPU; timings say nothing about one"
            )
        self.npu = spec.npu if spec.npu is not None else self._placed_npu()
        base = spec.media_base or (Path(spec.batch_file).parent if spec.batch_file else Path.cwd())
        self.base = Path(base).absolute()

    def _placed_npu(self) -> Any:
        if self.placement is None:
            return None
        req = self.placement["requested"]
        return req["device"] if req["device"] == req["visual_device"] else [req["device"], req["visual_device"]]

    def _where(self, item: WorkItem) -> str:
        return f"{self.spec.batch_file or 'batch'}:{item.line}"

    def _error(self, item: WorkItem, cause: str, exc: BaseException) -> dict[str, Any]:
        message = exc.one_line() if isinstance(exc, InputError) else f"{type(exc).__name__}: {exc}"
        err = records.error_dict(cause, message, self.spec.name, self.npu)
        return records.error_record(item, err)

    def _check(self, item: WorkItem) -> _Ready | dict[str, Any]:
        """One request through ``qvl infer``'s checks, alone: ready to run, or its error record. Nothing here
        touches the device, so even an unexpected exception is that request's problem (``internal``)."""
        try:
            return self._checked(item)
        except Exception as exc:  # noqa: BLE001 - one odd request must not stop a million-request job
            return self._error(item, records.INTERNAL, exc)

    def _checked(self, item: WorkItem) -> _Ready | dict[str, Any]:
        from qwenvl_rbln.inference import runner
        from qwenvl_rbln.inference.inputs import check_media
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
        """Exactly one record per item, in item order."""
        if len(items) > self.max_batch:
            out: list[dict[str, Any]] = []
            for start in range(0, len(items), self.max_batch):
                out.extend(self.run(items[start : start + self.max_batch]))
            return out
        checked = [self._check(item) for item in items]
        ready = [c for c in checked if isinstance(c, _Ready)]
        done = {id(r): rec for r, rec in zip(ready, self._generate(ready), strict=True)} if ready else {}
        return [done[id(c)] if isinstance(c, _Ready) else c for c in checked]

    def _generate(self, ready: list[_Ready]) -> list[dict[str, Any]]:
        """Records of requests that passed their checks, generated together; a request-level problem found only
        at generate (the processor refusing an input) splits the batch so it fails alone."""
        t0 = time.perf_counter()
        try:
            result = self.backend.run_batch(
                [r.request for r in ready], self.gen, sink=None, max_seq_len=self.target.resolved.max_seq_len
            )
        except InputError as exc:
            if len(ready) > 1:
                return [rec for r in ready for rec in self._generate([r])]
            cause = records.TOO_LONG if "max_seq_len" in exc.message else records.CORRUPT_MEDIA
            return [self._error(ready[0].item, cause, exc)]
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
