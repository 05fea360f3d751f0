"""The offline tiny Qwen3-VL used by the demo and the tests: real architecture, random weights.

- ``model``: the directory (marker, atomic write, ``create`` / ``ensure`` / ``describe`` / ``build_or_reuse``).
- ``tokenizer``: the BPE tokenizer trained locally on an embedded corpus, and the chat template.
- ``weights``: the config, processor and seeded weights.
- ``moe``: the tiny Qwen3-VL-MoE's text dims (experts, router, one dense layer).
- ``untied``: the tiny variant shaped like the 8B / 32B (untied lm_head, a ViT narrower than the text).
- ``derive``: a variant's config, the dense tiny config with the dims it changes.
"""
