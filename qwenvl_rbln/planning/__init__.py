"""Planning: from a YAML preset to a validated Plan, before anything compiles. Pure Python, no torch.

- ``presets``: shipped and user presets (YAML ``safe_load``, ``--set`` overrides, closest-name hints).
- ``plan``: the validated Plan with the exact optimum-rbln ``rbln_config`` dicts (compile time and load time).
- ``lm/``: the LM's resolved settings, one derivation from a preset or from a compiled ``rbln_config.json``.
- ``catalogue/``: what the plan is checked against: ``devices`` (NPU specs: DRAM, chiplets, byte sizes) and
  ``modelinfo`` (the model geometry, built-in or read from a local or cached ``config.json``).
"""
