"""Tuning: from a workload and its needs to the configuration that fits and costs least (``qvl tune``).

- ``roofline``: the cost model, a roofline bound from the NPU's published figures (not measured), per ViT call,
  prefill chunk and decode step; ``measured`` reads timings.json (``qvl profile``), ``fit`` the fits over context
  in it, and ``measured_roofline`` replaces the bound graph by graph with a label for each figure's source.
- ``workload``: the workload and batch trace read once, the ViT buckets and decoder graphs chosen as
  ``bucket-plan --optimize`` / ``--optimize-decoder`` choose them; ``estimate``: one configuration's figures.
- ``search``: configurations checked by the memory planner (the same ``estimate_plan`` as ``compile --dry-run``),
  binary searches on batch and context (memory is monotone in both); ``neighbours``: why the others lost, and the
  nearest configurations when nothing meets the needs.
- ``result``: the tuned preset YAML and the compile and serve commands; ``tune``: the run, as the document
  ``--json`` prints.
"""
