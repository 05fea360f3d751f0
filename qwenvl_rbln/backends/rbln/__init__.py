"""The rbln backend: optimum-rbln 0.12.0 and rebel-compiler, imported inside functions only.

- ``optimum``: dependencies, the emulator switch and guard, compile and load through optimum-rbln.
- ``progress``: compile stage lines from optimum-rbln's own log.
- ``device_memory``: exact device allocations of compiled graphs and the ``Lack of device memory`` diagnosis.
"""
