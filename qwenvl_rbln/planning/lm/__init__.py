"""The LM's resolved settings: one derivation from a preset or a compiled rbln_config.json."""
