"""Views: the one renderer (human or ``--json``) and every rich view; only commands and the CLI use them.

- ``render``: consoles, tables, the JSON document, literal text (never markup).
- ``memory``: the memory table of a dry run and of load-check.
- ``bucket_plan``: the bucket-plan report.
- ``load_check``: the load-check report.
- ``live``: live progress on a terminal (compile stages, batch requests, video decoding).
- ``plots``: ``--plot FILE`` pictures (matplotlib, optional, imported only while drawing).
"""
