"""``--plot FILE``: pictures of the reports the commands already build (bucket-plan, memory, tune).

Each module turns a report dict (the ``--json`` document's own numbers) into a small data structure first
(``*_data``, plain data the tests compare with the report), then draws it (``draw_*``). matplotlib is an
optional extra and is imported only while drawing (``figure.py``); nothing here changes a command's output.
"""
