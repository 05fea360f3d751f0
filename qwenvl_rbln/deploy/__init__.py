"""qvl deploy: Kubernetes / llm-d manifests derived from a compiled artifact and the serve hand-off."""
