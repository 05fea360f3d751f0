"""Artifact directories: hashing, the qvl manifest, atomic writes, locks, the compile cache, layout checks.

Everything here is plain Python (hashlib, json, os, fcntl): no torch, transformers or optimum import,
so ``qvl load-check --no-runtime`` and the cache logic work on any host.

- ``manifest``: file names, sha256 and the file listing, the model fingerprint, versions, qvl-manifest.json.
- ``staging``: atomic output directories and what ``--force`` may replace.
- ``locks``: one writer per output directory.
- ``cache``: the compile cache.
- ``layout``: reading an artifact's config back, its compile target, graphs and the files it must hold.
- ``emulated``: whether an artifact was produced by qvl's CPU emulator (manifest record, graph-file marker).
- ``last_compile``: where the last compile from this working directory went.
"""
