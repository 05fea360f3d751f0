"""Tuning: from a workload and its needs to the configuration that fits and costs least (``qvl tune``).

- ``roofline``: the cost model, a roofline bound from the NPU's published figures (not measured), per ViT call,
  prefill chunk and decode step; ``measured`` lets recorded timings replace it graph by graph.
- ``workload``: the workload and batch trace read once, the ViT buckets and decoder graphs chosen as
  ``bucket-plan --optimize`` / ``--optimize-decoder`` choose them.
- ``search``: candidates checked by the memory planner (the same ``estimate_plan`` as ``compile --dry-run``),
  binary searches on batch and context (memory is monotone in both), the ranking, the rejected neighbours.
- ``result``: the tuned preset YAML, the compile and serve commands, the document ``--json`` prints.
"""
