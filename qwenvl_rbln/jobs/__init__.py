"""Jobs: the orchestration that calls backends, returning data for a view.

- ``compile_request``: what ``qvl compile`` asks for (the dry-run gate, the refusals) before any work.
- ``compile_job``: the compile itself: lock, cache, staging directory, backend compile, manifest, rename.
- ``load_check``: the load-check steps (layout, placement, memory, calibration, runtime, diagnosis).
- ``bucket_plan_job``: bucket-plan composed: the plan, the memory planner's figures handed to ``vision.bucket_plan``.
"""
