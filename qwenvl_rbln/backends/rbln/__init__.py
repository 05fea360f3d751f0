"""The rbln backend: optimum-rbln 0.12 and rebel-compiler (compile, load, stage progress, device memory)."""
