"""qvl: compile and run Qwen3-VL on Rebellions Rebel100 NPUs through optimum-rbln.

Importing this package must stay cheap: no torch, transformers or optimum.rbln here.
"""

__version__ = "0.1.0"
