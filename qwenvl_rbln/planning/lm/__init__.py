"""The LM's resolved settings: one derivation from a preset or from a compiled ``rbln_config.json``.

- ``resolved``: ``ResolvedLM`` and its two constructors, sharing one derivation.
- ``rules``: optimum-rbln 0.12's shared limits and defaults, and the KV block counts.
- ``checks``: the preset's validation steps (buckets, sizes, attention, KV blocks, quantization, budget).
- ``saved``: reading a compiled ``rbln_config.json`` back.
"""
