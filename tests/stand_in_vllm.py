"""A stand-in ``vllm`` executable for tests: records its argv and environment, starts nothing.

``install_stand_in(bin_dir)`` writes it as ``bin_dir/vllm`` (run by this Python); each run writes
``{"argv": sys.argv, "env": dict(os.environ)}`` to the file named by ``$QVL_STAND_IN_RECORD``.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

RECORD_ENV = "QVL_STAND_IN_RECORD"

_BODY = """
import json, os, sys
with open(os.environ["{record}"], "w", encoding="utf-8") as f:
    json.dump({{"argv": sys.argv, "env": dict(os.environ)}}, f)
"""


def install_stand_in(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "vllm"
    path.write_text(f"#!{sys.executable}\n" + _BODY.format(record=RECORD_ENV), encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def read_record(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))
