"""The result line of a batch job: one JSON object per request, ok or failed, the same keys either way.

Keys (``docs/many-npus.md`` explains each): ``id``, ``line`` (the request's line in the batch file), ``ok``,
``text``, ``token_ids``, ``num_tokens``, ``finish_reason``, ``vision`` (each image/video: its ViT bucket),
``vit_buckets`` (the buckets this request's ViT calls used), ``decoder_graph``, ``prompt_tokens``, ``timings``,
``worker``, ``npu`` and ``error`` (None, or ``{"cause", "message", "worker", "npu"}``; a request that failed on
two workers carries ``attempts``: both errors).
"""

from __future__ import annotations

from typing import Any

# causes of a request that could not run (the slugs scripts and the summary count by)
MISSING_MEDIA = "missing-media"  # an image or video file that does not exist / cannot be opened
CORRUPT_MEDIA = "corrupt-media"  # a file that exists but does not decode (a cut or damaged image or video)
TOO_LONG = "too-long"  # prompt + --max-new-tokens over the compiled max_seq_len
OVERSIZE = "oversize"  # an input over the largest ViT bucket with --on-oversize error
BAD_REQUEST = "bad-request"  # the line's keys or values (unknown key, empty request, a video given as an image)
WORKER_FAILED = "worker-failed"  # the worker running it died (twice, on two different workers)
INTERNAL = "internal"  # anything else: a bug; the message says what


def _base(item: Any, worker: str | None, npu: Any) -> dict[str, Any]:
    return {"id": item.id, "line": item.line, "worker": worker, "npu": npu}


def ok_record(
    item: Any,
    *,
    text: str,
    token_ids: list[int],
    finish_reason: str | None,
    vision: list[dict[str, Any]],
    decoder_graph: str | None,
    prompt_tokens: int | None,
    timings: dict[str, Any],
    worker: str | None,
    npu: Any,
) -> dict[str, Any]:
    """The line of a request that ran."""
    return {
        **_base(item, worker, npu),
        "ok": True,
        "text": text,
        "token_ids": list(token_ids),
        "num_tokens": len(token_ids),
        "finish_reason": finish_reason,
        "vision": vision,
        "vit_buckets": sorted({v["bucket"] for v in vision if v.get("bucket") is not None}),
        "decoder_graph": decoder_graph,
        "prompt_tokens": prompt_tokens,
        "timings": timings,
        "error": None,
    }


def error_dict(cause: str, message: str, worker: str | None = None, npu: Any = None) -> dict[str, Any]:
    """``{"cause", "message", "worker", "npu"}``: one failure of one request."""
    return {"cause": cause, "message": message, "worker": worker, "npu": npu}


def error_record(item: Any, error: dict[str, Any], worker: str | None = None, npu: Any = None) -> dict[str, Any]:
    """The line of a request that could not run: the same keys as ``ok_record``'s, empty, and ``error``."""
    return {
        **_base(
            item, worker if worker is not None else error.get("worker"), npu if npu is not None else error.get("npu")
        ),
        "ok": False,
        "text": None,
        "token_ids": [],
        "num_tokens": 0,
        "finish_reason": None,
        "vision": [],
        "vit_buckets": [],
        "decoder_graph": None,
        "prompt_tokens": None,
        "timings": {},
        "error": dict(error),
    }


def failed_twice(item: Any, errors: list[dict[str, Any]]) -> dict[str, Any]:
    """A request that failed on two different workers: written as failed with both errors (``attempts``)."""
    last = errors[-1]
    error = {"cause": last.get("cause", WORKER_FAILED), "message": last.get("message", ""), "attempts": list(errors)}
    return error_record(item, error, last.get("worker"), last.get("npu"))


def is_complete(record: Any) -> bool:
    """A line ``--resume`` counts as done: an object with an id that ran or failed for good."""
    return isinstance(record, dict) and isinstance(record.get("id"), str) and "ok" in record
