"""``vllm bench serve`` against ``qvl serve``: vLLM's own load test, its images sized to the compiled ViT buckets.

Its own module because it checks a different thing than serve: which image sizes land in which compiled bucket
and fit the context, and which flags the benchmark owns.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.serving import emulated
from qwenvl_rbln.serving.command import resolve_directory, served_name
from qwenvl_rbln.serving.flags import refuse_owned
from qwenvl_rbln.serving.options import (
    API_KEY_ENV,
    BENCH_KEY_ENV,
    REDACTED,
    Artifact,
    BenchOptions,
    Launch,
    api_key,
)
from qwenvl_rbln.serving.preflight import ok, preflight

PROMPT_MARGIN = 64  # chat template and special tokens around a benchmark prompt


def bench_images(art: Artifact, input_len: int, output_len: int) -> tuple[list[tuple[int, int, int]], list[str]]:
    """One square image size per compiled ViT bucket that lands in that bucket and whose prompt fits the context
    (the compiled max_seq_len, the --max-model-len qvl serve passes): [(side px, bucket, LM tokens)], and notes on
    the buckets left out."""
    from qwenvl_rbln.vision.buckets import select_bucket
    from qwenvl_rbln.vision.geometry import IMAGE_MIN_PIXELS, image_geometry

    sizes: list[tuple[int, int, int]] = []
    notes: list[str] = []
    context = art.cfg["max_seq_len"]
    length = f"max_seq_len {context}"
    unit = art.merge_size  # a side of p patches must be a multiple of the merge size (factor patch*merge px)
    for bucket in art.buckets:
        side_patches = (math.isqrt(bucket) // unit) * unit
        if side_patches < unit:
            notes.append(f"bucket {bucket}: too small for any image")
            continue
        side = side_patches * art.patch_size
        geo = image_geometry(
            side,
            side,
            min_pixels=IMAGE_MIN_PIXELS,
            max_pixels=art.max_pixels,
            patch_size=art.patch_size,
            merge_size=art.merge_size,
        )
        landed = select_bucket(geo.patches, art.buckets)
        if landed != bucket:
            notes.append(f"bucket {bucket}: the processor's minimum size puts every image in bucket {landed}")
            continue
        if geo.lm_tokens + input_len + output_len + PROMPT_MARGIN > context:
            notes.append(f"bucket {bucket}: {geo.lm_tokens} image tokens + the text do not fit {length}")
            continue
        sizes.append((side, bucket, geo.lm_tokens))
    return sizes, notes


BENCH_OWNED = {
    "--host": "qvl bench-serve --host",
    "--port": "qvl bench-serve --port",
    "--model": "qvl bench-serve --served-model-name",
    "--max-concurrency": "the compiled batch_size, times --workers for a fleet (qvl sets it)",
    "--backend": "nothing (qvl benchmarks the chat endpoint)",
    "--endpoint": "nothing (qvl benchmarks the chat endpoint)",
    "--dataset-name": "nothing (qvl benchmarks random-mm)",
    "--tokenizer": "nothing (the tokenizer is DIR's)",
    "--num-prompts": "qvl bench-serve --num-prompts",
    "--random-input-len": "qvl bench-serve --input-len",
    "--random-output-len": "qvl bench-serve --output-len",
    "--seed": "qvl bench-serve --seed",
    "--random-mm-bucket-config": "nothing (qvl sizes the images to the compiled ViT buckets)",
}


def bench_command(opts: BenchOptions, environ: Mapping[str, str] | None = None) -> tuple[Launch, list[str]]:
    """``vllm bench serve`` (vLLM's own load test) against ``qvl serve``, images sized to the compiled buckets; the
    server's API key (``--api-key-file``, else ``$VLLM_API_KEY``) goes in the environment as ``$OPENAI_API_KEY``,
    which vLLM's benchmark sends as "Authorization: Bearer KEY". ``--emulate``: against ``qvl serve --emulate``
    (loopback only; the command adds the emulated environment, ``emulated.apply``)."""
    environ = environ if environ is not None else {}
    if opts.emulate:
        emulated.check_host(opts.host, opts.port)
    directory, warnings = resolve_directory(opts.directory, opts.preset, "bench-serve")
    art = preflight(directory, verify_hashes=False, emulated=opts.emulate, command="bench-serve")
    checks = list(art.checks)
    refuse_owned(opts.extra, BENCH_OWNED, by="qvl bench-serve", fix="use {}")
    sizes, notes = bench_images(art, opts.input_len, opts.output_len)
    if not sizes:
        raise InputError(
            f"no compiled ViT bucket takes a benchmark image with --input-len {opts.input_len} and --output-len "
            f"{opts.output_len} within the context ({'; '.join(notes)})",
            "lower --input-len / --output-len",
        )
    share = round(1.0 / len(sizes), 6)
    bucket_config = "{" + ", ".join(f"({side}, {side}, 1): {share}" for side, _, _ in sizes) + "}"
    ok(
        checks,
        "image sizes",
        "; ".join(f"{side}x{side} -> bucket {bucket} ({tokens} tokens)" for side, bucket, tokens in sizes)
        + (f"; left out: {'; '.join(notes)}" if notes else ""),
    )
    replicas = opts.workers or 1
    concurrency = replicas * art.cfg["batch_size"]
    ok(
        checks,
        "max_concurrency",
        f"{concurrency} (the compiled batch_size {art.cfg['batch_size']}"
        + (f" x {replicas} engines behind the router: the fleet as one service)" if replicas > 1 else ")"),
    )
    pairs = [
        ("--backend", "openai-chat"),
        ("--endpoint", "/v1/chat/completions"),
        ("--dataset-name", "random-mm"),
        ("--host", opts.host),
        ("--port", str(opts.port)),
        ("--model", opts.served_model_name or served_name(art)),
        ("--tokenizer", str(art.root)),
        ("--max-concurrency", str(concurrency)),
        ("--num-prompts", str(opts.num_prompts)),
        ("--random-input-len", str(opts.input_len)),
        ("--random-output-len", str(opts.output_len)),
        ("--random-mm-base-items-per-request", "1"),
        ("--random-mm-num-mm-items-range-ratio", "0"),
        ("--random-mm-limit-mm-per-prompt", json.dumps({"image": 1, "video": 0})),
        ("--random-mm-bucket-config", bucket_config),
        ("--seed", str(opts.seed)),
    ]
    argv = ["vllm", "bench", "serve", *(word for pair in pairs for word in pair), *opts.extra]
    launch = Launch(argv=argv, env={}, checks=checks)
    key, source = api_key(opts.api_key_file, environ)
    if key is None:
        ok(checks, "auth", f"no API key (none in --api-key-file or ${API_KEY_ENV}): requests carry no Authorization")
    else:
        ok(checks, "auth", f"API key from {source} ({REDACTED}) sent as 'Authorization: Bearer' (${BENCH_KEY_ENV})")
        launch.env[BENCH_KEY_ENV] = key
        launch.secret = frozenset({BENCH_KEY_ENV})
    return launch, warnings


@dataclass
class Outcome:
    """What ``vllm bench serve`` says it got (its summary's "Successful requests:" and "Failed requests:" lines):
    its own exit code is 0 however many requests failed, so qvl reads them (audit 2026-12-06 M3)."""

    successful: int | None = None
    failed: int | None = None

    def see(self, line: bytes) -> None:
        words = line.decode("utf-8", "replace").split()
        if len(words) == 3 and words[1] == "requests:" and words[2].isdigit():
            if words[0] == "Successful":
                self.successful = int(words[2])
            elif words[0] == "Failed":
                self.failed = int(words[2])

    def problem(self) -> str | None:
        """Why the run is no benchmark (every request, or some, failed), or None."""
        if self.successful is None or self.failed is None or (self.failed == 0 and self.successful > 0):
            return None
        if self.successful + self.failed == 0:
            return "no request was sent"
        return f"{self.failed} of {self.successful + self.failed} requests failed"
