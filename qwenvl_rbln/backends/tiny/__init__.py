"""The offline tiny Qwen3-VL: real architecture, random weights, a locally trained tokenizer."""
