"""Smaller images as a trade: when nothing meets the needs with the buckets the workload chose, a lower largest
ViT bucket (and so a lower processor.max_pixels: images above it are resized for their request) may be what fits.

The search proper keeps bucket-plan's buckets (the workload decides them, memory does not); this runs only when
nothing meets the needs, one largest bucket at a time, each with the workload planned again under its cap and its
own bucket DP, so the row offered is what ``qvl compile --set visual.max_seq_len=[...]`` would build and its
estimate is of the resized images. A shipped example: rebel100-30b-a3b, buckets [1024, 4096], images at ~1 MP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import QvlError
from qwenvl_rbln.tuning.search import BASE_PRESET, Checker, Config, largest_batches, need_len, partitions_for
from qwenvl_rbln.tuning.workload import min_pixels_bucket, read_work

LARGEST = (8192, 4096, 2048, 1024)  # the largest buckets tried, in patches: 2, 1, 0.5 and 0.25 MP images


def _checker(checker: Checker, top: int, p: int) -> Checker | None:
    """A checker whose base plan caps images at the ``top``-patch bucket, with the workload planned under it."""
    from qwenvl_rbln.planning.plan import build_plan

    needs, work = checker.needs, checker.work
    sets = [f"kvcache_partition_len={p}", f"max_seq_len={need_len(needs.context, p)}", f"visual.max_seq_len=[{top}]"]
    try:
        base = build_plan(BASE_PRESET, sets, model=needs.model)
        small = read_work(
            base,
            Path(work.path),
            needs.max_buckets,
            Path(work.trace_path) if work.trace_path else None,
            prompt_tokens=work.prompt_tokens,
            output_tokens=work.output_tokens,
        )
    except QvlError:
        return None
    return Checker(needs, small, checker.roof, base, (checker.host, checker.host_measured))


def _best(chk: Checker) -> Config | None:
    """The largest batch that fits at the needed context, on the NPUs the needs allow (fewest first)."""
    best: Config | None = None
    for top in largest_batches(chk):
        if top.batch >= 1 and (best is None or top.batch > best.batch):
            best = top
    return best


def smaller_images(checker: Checker) -> list[dict[str, Any]]:
    """Rows for lower largest buckets that meet every need but the image size: the first (largest images) that
    does, and the next one down when it runs a larger batch. Each row says what it costs: the pixel cap."""
    needs = checker.needs
    top = checker.work.vit_buckets[-1]
    p = partitions_for(needs, checker.max_position)[0]
    floor = min_pixels_bucket(checker.base)
    candidates = [b for b in LARGEST if floor <= b < top]
    tried: dict[int, tuple[Checker | None, Config | None]] = {}

    def attempt(bucket: int) -> tuple[Checker | None, Config | None]:
        if bucket not in tried:  # each re-plans the whole workload: once per bucket
            chk = _checker(checker, bucket, p)
            cfg = _best(chk) if chk is not None else None
            checker.calls += chk.calls if chk is not None else 0
            tried[bucket] = (chk, cfg)
        return tried[bucket]

    # the smallest images first: a lower bucket never needs more memory or context, so when even it does not meet
    # the needs, no larger one will, and the workload is not planned again for each
    if not candidates or _short(attempt(candidates[-1])[1], needs.min_batch):
        return []
    out: list[dict[str, Any]] = []
    for bucket in candidates:
        chk, cfg = attempt(bucket)
        if chk is None:
            continue
        if _short(cfg, needs.min_batch) or (out and cfg.batch <= out[-1]["batch_size"]):
            if out:
                break
            continue
        pixels = chk.vit(cfg)[-1] * chk.base.geometry.vision.patch_size**2
        row = chk.describe(cfg, longest_max_seq_len_that_fits=chk.longest(cfg, cfg.max_seq_len))
        row["images_max_pixels"] = pixels
        row["gives_up"] = [
            f"image size: images resized to at most {pixels:,} px (~{pixels / 1e6:.1f} MP), largest ViT bucket "
            f"{chk.vit(cfg)[-1]}"
        ]
        out.append(row)
        if len(out) == 2:
            break
    return out


def _short(cfg: Config | None, min_batch: int) -> bool:
    """No configuration, or one below the batch the needs ask for."""
    return cfg is None or cfg.batch < min_batch
