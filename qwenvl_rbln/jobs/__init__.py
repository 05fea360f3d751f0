"""Jobs: the orchestration that calls backends (compile job and request, the load-check steps)."""
