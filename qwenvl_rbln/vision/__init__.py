"""Vision: where images and video frames land in the compiled ViT buckets. Header reads and arithmetic only.

- ``geometry``: the Qwen3-VL processor's resize rule and patch counts (``smart_resize``, factor 32).
- ``buckets``: bucket choice for a segment and the exact bucket optimiser (FLOPs).
- ``packing``: several segments of one ``visual()`` call in one bucket (block-diagonal mask).
- ``media``: header-only probing of images and videos.
- ``workload``: JSONL / CSV workloads of sizes with counts.
- ``bucket_plan/``: the ``qvl bucket-plan`` report as data (items, per-bucket costs, optimised lists).
"""
