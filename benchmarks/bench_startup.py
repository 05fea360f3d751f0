"""Wall time of `qvl --help` and `qvl compile --dry-run` next to a bare `python -c "import typer, rich, yaml"`
and `python -c "import torch"`.

Why: qvl's planning commands must answer in well under a second, which only holds while they never
import torch/transformers/optimum, and a dry run imports only the modules it uses. The ratio to the bare
import of the CLI's own libraries (measured in the same run, so a slower machine moves both) is what a change
inside qvl can move. Median of N runs, each a fresh process.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

RUNS = 7
BARE = 'python -c "import typer, rich, yaml"'
CASES = {
    BARE: [sys.executable, "-c", "import typer, rich, yaml"],
    "qvl --help": [sys.executable, "-m", "qwenvl_rbln", "--help"],
    "qvl compile --dry-run --json": [sys.executable, "-m", "qwenvl_rbln", "compile", "--dry-run", "--json"],
    "qvl bucket-plan --size 1920x1080": [sys.executable, "-m", "qwenvl_rbln", "bucket-plan", "--size", "1920x1080"],
    'python -c "import torch"': [sys.executable, "-c", "import torch"],
    'python -c "import transformers, torch"': [sys.executable, "-c", "import torch, transformers"],
}


def median_wall(cmd: list[str]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    results = {name: round(median_wall(cmd), 3) for name, cmd in CASES.items()}
    ratios = {name: round(wall / results[BARE], 2) for name, wall in results.items() if name != BARE}
    print(json.dumps({"runs_each": RUNS, "median_wall_s": results, "ratio_to_bare_cli_imports": ratios}, indent=2))


if __name__ == "__main__":
    main()
