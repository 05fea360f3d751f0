"""qvl profile: time every compiled graph, fit it over context, and write timings.json beside the roofline.

- ``graphs``: the compiled graphs of an artifact (from rbln_config.json) and synthetic inputs of their shapes;
- ``timer``: device time from ``rebel.capture_reports()`` or wall time, warm-up, repeats, median and p10-p90;
- ``compare``: each figure beside the roofline bound, the ratio, and the ``--check`` verdict;
- ``run``: the run, as the document ``--json`` prints, and its entry in timings.json (``tuning.measured``).
"""
