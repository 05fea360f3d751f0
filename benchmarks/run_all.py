"""Run every benchmark script in this folder, one after another (make bench).

Targets each script checks (results in README.md's table): bench_batch_scaling.py: Ray pool throughput on
emulated NPUs (QVL_EMULATE_CALL_MS=200), 4 workers >= 3.6x one worker and 8 >= 7x; bench_fleet.py: `qvl serve
--workers 2` over emulated NPUs (QVL_EMULATE_CALL_MS=1000), two replicas >= 1.8x one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    failed = 0
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"== {script.name}", flush=True)
        failed += subprocess.run([sys.executable, str(script)], check=False).returncode != 0
    sys.exit(1 if failed else 0)
