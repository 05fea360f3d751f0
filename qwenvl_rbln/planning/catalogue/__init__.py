"""The catalogue a plan is checked against. It imports nothing else of planning, so ``lm/`` and ``plan`` both use it.

- ``devices``: NPU specs (DRAM, chiplets, usable bytes per chiplet) and byte sizes.
- ``modelinfo``: Qwen3-VL geometry, built-in (with sources) or read from a local or cached ``config.json``.
"""
