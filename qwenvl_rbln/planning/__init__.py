"""Planning: presets, the validated plan, the resolved LM, model geometry and the NPU catalogue."""
