"""``rebel`` for the processes of ``qvl serve --emulate``: qvl's CPU emulator, nothing of an NPU.

``qvl serve --emulate`` puts the folder above this one first on vLLM's ``PYTHONPATH``, so every process vLLM starts
(API server, engine core, the benchmark) finds this package when vllm-rbln imports ``rebel``. Importing it replaces
itself in ``sys.modules`` with the emulator (``qwenvl_rbln.backends.emulator.serve_as_rebel``). Imported under any
other name (a tool walking qvl's packages) it does nothing.
"""

if __name__ == "rebel":
    import os as _os

    from qwenvl_rbln.backends.emulator import serve_as_rebel

    serve_as_rebel(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
