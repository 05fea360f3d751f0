"""Inference: requests, what the static-shape hardware does with them, and the two generate paths.

- ``requests``: the Request model, parsed from flags or a ``--batch-file`` JSONL, media checked up front.
- ``vision_report``: per image / per video ViT bucket, padding and oversize handling (pure Python).
- ``reference``: the torch backend (transformers ``Qwen3VLForConditionalGeneration``), the accuracy reference.
- ``rbln_generate``: optimum-rbln's own ``generate`` on compiled artifacts (batch padded to the compiled size).
- ``compare``: token agreement between two ``qvl infer --json`` outputs.

Importing this package imports nothing heavy; torch and transformers are imported inside functions.
"""

from __future__ import annotations
