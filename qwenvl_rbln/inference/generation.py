"""Generation options, the streamer that also times prefill and decode, and output extraction.

Shared by the reference backend and the rbln backend, so both report the same fields the same way.

Timings of one batch (seconds; ``time.perf_counter``):

* ``preprocess_s``: media decoding + processor call (tokenize, resize, patchify);
* ``vision_s``: the visual encoder's forward calls (a forward hook on the torch model; a timing proxy
  around optimum-rbln's ``visual`` submodule);
* ``ttft_s``: from calling ``generate`` to the first generated token (vision + LM prefill + first sample);
* ``prefill_s``: ``ttft_s - vision_s``;
* ``decode_s``: from the first to the last generated token; ``decode_tokens_per_s`` = decode steps /
  ``decode_s`` per sequence (the batch's rows run in lockstep);
* ``generate_s``: the whole ``generate`` call.
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from typing import IO, Any

from qwenvl_rbln.errors import BackendError, InputError, QvlError


@dataclass
class GenerationOptions:
    """Greedy unless ``temperature`` > 0; ``seed`` makes sampling reproducible (default 0)."""

    max_new_tokens: int = 64
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise InputError(
                f"--max-new-tokens {self.max_new_tokens!r} must be a positive integer", "e.g. --max-new-tokens 64"
            )
        _finite("--temperature", self.temperature, "use 0 (greedy, the default) or a positive value such as 0.7")
        _finite("--top-p", self.top_p, "e.g. --top-p 0.8")
        if self.temperature is not None and self.temperature < 0:
            raise InputError(
                f"--temperature {self.temperature} is negative",
                "use 0 (greedy, the default) or a positive value such as 0.7",
            )
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise InputError(f"--top-p {self.top_p} is outside (0, 1]", "e.g. --top-p 0.8")

    @property
    def do_sample(self) -> bool:
        return bool(self.temperature and self.temperature > 0)

    def warnings(self) -> list[str]:
        if not self.do_sample and self.top_p is not None:
            return ["--top-p only applies when sampling (--temperature > 0); decoding is greedy"]
        return []

    def generate_kwargs(self) -> dict[str, Any]:
        """kwargs for ``generate``: explicit greedy, or sampling with the given values."""
        kw: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "do_sample": self.do_sample}
        if self.do_sample:
            kw["temperature"] = float(self.temperature)
            if self.top_p is not None:
                kw["top_p"] = float(self.top_p)
        else:
            # the shipped generation_config samples (temperature 0.7, top_p 0.8, top_k 20): neutralise it
            kw.update(temperature=None, top_p=None, top_k=None)
        return kw

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["do_sample"] = self.do_sample
        d["mode"] = "sampling" if self.do_sample else "greedy"
        if self.do_sample and self.seed is None:
            d["seed"] = 0
        return d


def _finite(flag: str, value: float | None, hint: str) -> None:
    """nan would silently mean greedy and inf uniform sampling (and neither is valid JSON): refuse both."""
    if value is not None and not math.isfinite(value):
        raise InputError(f"{flag} {value} is not a finite number", hint)


def seed_everything(seed: int) -> None:
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


class TimingStreamer:
    """A transformers streamer (``put``/``end``) that times tokens and streams one row's text to ``sink``.

    ``generate`` first puts the prompt ids, then one ``[batch]`` tensor per step. Text is streamed for
    ``stream_row`` only (None: no streaming), decoded incrementally; a trailing incomplete UTF-8
    sequence (U+FFFD) is held back until the next token completes it.
    """

    def __init__(
        self,
        tokenizer: Any = None,
        sink: IO[str] | None = None,
        stream_row: int | None = 0,
        prefix: str = "",
        skip_special_tokens: bool = True,
    ):
        self.tokenizer = tokenizer
        self.sink = sink if tokenizer is not None else None
        self.stream_row = stream_row
        self.prefix = prefix
        self.skip_special_tokens = skip_special_tokens
        self.prompt_seen = False
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.steps = 0
        self._tokens: list[int] = []
        self._printed = 0  # tokens already written
        self._started = False
        self._closed = False
        self.streamed = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        now = time.perf_counter()
        if self.t_first is None:
            self.t_first = now
        self.t_last = now
        self.steps += 1
        if self.sink is None or self.stream_row is None:
            return
        flat = value.reshape(-1).tolist() if hasattr(value, "reshape") else list(value)
        if self.stream_row >= len(flat):
            return
        self._tokens.append(int(flat[self.stream_row]))
        self._write(final=False)

    def _write(self, final: bool) -> None:
        # Byte-level BPE decodes by concatenation, so only the tokens not yet printed are decoded. A trailing
        # U+FFFD is a character still missing bytes: at most its last 3 tokens are held back (a UTF-8 character
        # has at most 4 bytes), so invalid byte runs cannot make the pending list, and each decode, grow.
        pending = self._tokens[self._printed :]
        text = self._decode(pending)
        if not final and text.endswith("\ufffd"):
            if len(pending) <= 3:
                return
            pending = pending[:-3]
            text = self._decode(pending)
        self._printed += len(pending)
        if text:
            if not self._started:
                self.sink.write(self.prefix)
                self._started = True
            self.sink.write(text)
            self.sink.flush()
            self.streamed = True

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def end(self) -> None:
        if self.sink is None or self.stream_row is None:
            return
        self._write(final=True)
        self.close_line()

    def close_line(self) -> None:
        """End the streamed line, once: also on Ctrl-C or an error, so what is printed next starts a line."""
        if self._started and not self._closed:
            self._closed = True
            self.sink.write("\n")
            self.sink.flush()


class VisionTimer:
    """Accumulates the wall time of the visual encoder's calls."""

    def __init__(self, sync: Any = None):
        self.seconds = 0.0
        self.calls = 0
        self._t0: float | None = None
        self._sync = sync
        self._handles: list[Any] = []

    def start(self) -> None:
        if self._sync:
            self._sync()
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self._sync:
            self._sync()
        if self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
            self.calls += 1
            self._t0 = None

    def reset(self) -> None:
        self.seconds, self.calls, self._t0 = 0.0, 0, None

    def hook_module(self, module: Any) -> None:
        """torch: forward pre-hook and hook on ``module`` (removed by :meth:`remove`)."""
        self._handles.append(module.register_forward_pre_hook(lambda *_: self.start()))
        self._handles.append(module.register_forward_hook(lambda *_: self.stop()))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


class TimedProxy:
    """Wraps a callable submodule (optimum-rbln's ``visual``) to time its calls; attributes pass through."""

    def __init__(self, inner: Any, timer: VisionTimer):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_timer", timer)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._timer.start()
        try:
            return self._inner(*args, **kwargs)
        finally:
            self._timer.stop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


def eos_ids(generation_config: Any, tokenizer: Any) -> set[int]:
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])}


def split_rows(sequences: Any, prompt_len: int, rows: int, eos: set[int]) -> list[tuple[list[int], str]]:
    """Per row: generated token ids up to and including the first EOS, and 'stop' or 'length'."""
    out = []
    new = sequences[:rows, prompt_len:].tolist()
    for ids in new:
        cut = next((i for i, t in enumerate(ids) if t in eos), None)
        if cut is None:
            out.append(([int(t) for t in ids], "length"))
        else:
            out.append(([int(t) for t in ids[: cut + 1]], "stop"))
    return out


def batch_timings(
    t_pre: float, t_gen0: float, t_gen1: float, streamer: TimingStreamer, vision: VisionTimer, real_rows: int
) -> dict[str, Any]:
    ttft = (streamer.t_first - t_gen0) if streamer.t_first is not None else None
    decode = (streamer.t_last - streamer.t_first) if streamer.t_first is not None else None
    steps = max(streamer.steps - 1, 0)
    per_seq = (steps / decode) if decode and steps else None
    return {
        "preprocess_s": round(t_pre, 4),
        "vision_s": round(vision.seconds, 4),
        "vision_calls": vision.calls,
        "ttft_s": None if ttft is None else round(ttft, 4),
        "prefill_s": None if ttft is None else round(max(ttft - vision.seconds, 0.0), 4),
        "decode_s": None if decode is None else round(decode, 4),
        "decode_steps": streamer.steps,
        "decode_tokens_per_s": None if per_seq is None else round(per_seq, 2),
        "decode_tokens_per_s_batch": None if per_seq is None else round(per_seq * real_rows, 2),
        "generate_s": round(t_gen1 - t_gen0, 4),
    }


@dataclass
class RowResult:
    request_id: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS) or "length" (max_new_tokens)
    text: str
    prompt_tokens: int
    streamed: bool = False


@dataclass
class BatchResult:
    rows: list[RowResult]  # real rows only, in request order
    real_rows: int
    input_rows: int  # rows handed to generate (real + padding copies)
    timings: dict[str, Any]
    vision_grids: dict[str, list[list[int]]]
    warnings: list[str]


def check_lengths(
    requests: list[Any], prompt_tokens: list[int], gen: GenerationOptions, max_seq_len: int | None, strict: bool
) -> list[str]:
    """Prompt + ``max_new_tokens`` against the compiled ``max_seq_len``: InputError when ``strict``, else warnings.

    Checked before ``generate``: on the NPU such a request cannot run, and on the reference it would run for
    minutes past what the compiled model can hold.
    """
    warnings: list[str] = []
    if max_seq_len is None:
        return warnings
    for req, n in zip(requests, prompt_tokens, strict=False):
        if n + gen.max_new_tokens <= max_seq_len:
            continue
        exc = length_error(req, n, gen.max_new_tokens, max_seq_len)
        if strict:
            raise exc
        warnings.append(exc.message + " (the NPU would refuse it)")
    return warnings


def length_error(
    request: Any, prompt_tokens: int, max_new_tokens: int, max_seq_len: int, media_tokens: int = 0
) -> InputError:
    """The refusal of a prompt of ``prompt_tokens`` + ``max_new_tokens`` past ``max_seq_len``, naming the request
    and, for a batch file, its ``file:line`` (``media_tokens``: how many of the prompt's tokens are images/videos)."""
    from qwenvl_rbln.inference.requests import FLAGS_SOURCE
    from qwenvl_rbln.vision.context import LENGTH_FIX, length_message

    source = getattr(request, "source", FLAGS_SOURCE)
    where = "" if source == FLAGS_SOURCE else f" ({source})"
    room = max_seq_len - prompt_tokens
    return InputError(
        length_message(f"request {request.id}{where}", prompt_tokens, max_new_tokens, max_seq_len, media_tokens),
        f"lower --max-new-tokens to at most {room}, {LENGTH_FIX}"
        if room >= 1
        else f"the prompt alone fills it: {LENGTH_FIX}",
    )


def _run_generate(model: Any, inputs: Any, streamer: TimingStreamer, kwargs: dict[str, Any], ids: str) -> Any:
    """``model.generate``; any failure ends the streamed line first, and backend failures become BackendError."""
    import torch

    try:
        with torch.inference_mode():
            return model.generate(**inputs, streamer=streamer, **kwargs)
    except (KeyboardInterrupt, SystemExit, QvlError):
        streamer.close_line()
        raise
    except Exception as exc:
        streamer.close_line()
        if os.environ.get("QVL_DEBUG"):
            traceback.print_exc(file=sys.stderr)
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise BackendError(
            f"{type(model).__name__}.generate failed for request(s) {ids}: {type(exc).__name__}: {first}",
            "rerun with QVL_DEBUG=1 for the traceback; `qvl load-check DIR` checks the artifact and the NPUs",
        ) from exc


def padding_row(requests: list[Any]) -> Any:
    """The row that pads a batch to the compiled batch size: text only (no image, no video, so it costs no ViT call),
    the shortest real prompt, so it is never longer than a real row and the real rows' left padding is unchanged."""
    import dataclasses

    shortest = min(requests, key=lambda r: (len(r.prompt), len(r.videos), len(r.images)))
    return dataclasses.replace(
        shortest, id=f"{shortest.id}#padding", images=[], videos=[], image_info=[], video_info=[], caps=None
    )


def generate_batch(
    model: Any,
    processor: Any,
    requests: list[Any],
    gen: GenerationOptions,
    *,
    pad_to: int | None = None,
    timer: VisionTimer | None = None,
    sink: IO[str] | None = None,
    device: Any = None,
    max_seq_len: int | None = None,
    strict_length: bool = True,
    stream_prefix: str = "",
    caps: Any = None,
) -> BatchResult:
    """Preprocess ``requests``, optionally pad the batch to ``pad_to`` rows with text-only rows (``padding_row``:
    no ViT work), run ``model.generate`` with a timing streamer, and return the real rows only.

    ``sink`` receives the streamed text when the batch has exactly one real request. ``max_seq_len``: a
    request whose prompt + ``max_new_tokens`` exceeds it raises InputError before generate when
    ``strict_length`` (both backends), else adds a warning. ``caps``: the processor caps of requests that
    carry none of their own (``Request.caps``).
    """
    from qwenvl_rbln.inference.inputs import build_inputs

    timer = timer or VisionTimer()
    timer.reset()
    real = len(requests)
    rows = list(requests)
    if pad_to is not None and pad_to > real:
        rows += [padding_row(requests)] * (pad_to - real)
    t0 = time.perf_counter()
    inputs, info = build_inputs(processor, rows, caps)
    warnings = check_lengths(requests, info["prompt_tokens"][:real], gen, max_seq_len, strict_length)
    if device is not None:
        inputs = inputs.to(device)
    t_pre = time.perf_counter() - t0
    tokenizer = processor.tokenizer
    streamer = TimingStreamer(
        tokenizer, sink=sink, stream_row=0 if real == 1 and sink is not None else None, prefix=stream_prefix
    )
    if gen.do_sample:
        seed_everything(gen.seed if gen.seed is not None else 0)
    kwargs = gen.generate_kwargs()
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is not None:
        kwargs["pad_token_id"] = pad_id
    t_gen0 = time.perf_counter()
    sequences = _run_generate(model, inputs, streamer, kwargs, ", ".join(r.id for r in requests))
    t_gen1 = time.perf_counter()
    streamer.end()
    if not hasattr(sequences, "shape"):  # GenerateOutput when return_dict_in_generate is set in the config
        sequences = sequences.sequences
    prompt_len = int(inputs["input_ids"].shape[1])
    eos = eos_ids(getattr(model, "generation_config", None), tokenizer)
    split = split_rows(sequences, prompt_len, real, eos)
    out_rows = []
    for req, (ids, reason), n in zip(requests, split, info["prompt_tokens"][:real], strict=True):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        out_rows.append(RowResult(req.id, ids, reason, text, n, streamed=streamer.streamed and real == 1))
    timings = batch_timings(t_pre, t_gen0, t_gen1, streamer, timer, real)
    return BatchResult(
        rows=out_rows,
        real_rows=real,
        input_rows=len(rows),
        timings=timings,
        vision_grids={"image": info["image_grids"], "video": info["video_grids"]},
        warnings=warnings,
    )
