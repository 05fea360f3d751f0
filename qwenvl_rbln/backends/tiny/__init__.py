"""The offline tiny Qwen3-VL used by the demo and the tests: real architecture, random weights.

- ``model``: the directory (marker, atomic write, ``create`` / ``ensure`` / ``describe`` / ``build_or_reuse``).
- ``tokenizer``: the BPE tokenizer trained locally on an embedded corpus, and the chat template.
- ``weights``: the config, processor and seeded weights.
"""
