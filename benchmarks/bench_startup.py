"""Start-up time of `qvl --help` and `qvl compile --dry-run --json` next to a bare
`python -c "import typer, rich, yaml"` (targets: at most 1.6x and 2.0x the bare imports).

Why: qvl's planning commands must answer at once, which only holds while the CLI imports what the command
it runs needs and nothing else (never torch/transformers). The ratio to the bare import of the CLI's own
libraries is what a change inside qvl can move; on a shared machine the load moves both, so each qvl run is
paired with a bare run right before it (bare, qvl, bare, qvl, ...) and the figure is the median of the
per-pair ratios, each run a fresh process. One warm-up pair per case is not counted.

qvl is run through its console script (`qvl`, next to this Python) when there is one, as a user runs it;
PYTHONPATH set to a checkout makes it run that checkout's package. typer, rich and yaml load the .pyc files their
install wrote; qvl gets the same: every process reads and writes bytecode under one temporary PYTHONPYCACHEPREFIX
(the warm-up fills it), as for an installed package or an editable one run without PYTHONDONTWRITEBYTECODE.
--from-source keeps the caller's settings: with PYTHONDONTWRITEBYTECODE=1 and an editable install, every qvl
module is compiled from source on every run, a cost the bare imports never pay.

Usage: python benchmarks/bench_startup.py [--pairs N] [--from-source] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BARE_NAME = 'python -c "import typer, rich, yaml"'
BARE = [sys.executable, "-c", "import typer, rich, yaml"]
TARGETS = {
    "qvl --help": (["--help"], 1.6),
    "qvl compile --preset rebel100-1npu --dry-run --json": (
        ["compile", "--preset", "rebel100-1npu", "--dry-run", "--json"],
        2.0,
    ),
}


def qvl_command() -> list[str]:
    """The console script next to this interpreter, else ``python -m qwenvl_rbln``."""
    script = Path(sys.executable).with_name("qvl")
    return [sys.executable, str(script)] if script.is_file() else [sys.executable, "-m", "qwenvl_rbln"]


ENV = dict(os.environ)


def wall(cmd: list[str]) -> float:
    """Seconds one fresh process takes; a non-zero exit is an error (a broken run would look fast)."""
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False, env=ENV)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return elapsed


def paired(cmd: list[str], pairs: int) -> dict[str, object]:
    """bare, cmd, bare, cmd, ... : the median of cmd/bare over the pairs, and both medians in ms."""
    wall(BARE), wall(cmd)  # warm-up: file cache, .pyc files
    bare_s, cmd_s = [], []
    for _ in range(pairs):
        bare_s.append(wall(BARE))
        cmd_s.append(wall(cmd))
    ratios = [c / b for b, c in zip(bare_s, cmd_s, strict=True)]
    return {
        "median_ratio": round(statistics.median(ratios), 2),
        "ratios": [round(r, 2) for r in ratios],
        "median_bare_ms": round(statistics.median(bare_s) * 1000, 1),
        "median_ms": round(statistics.median(cmd_s) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15, help="paired runs per case (at least 9)")
    parser.add_argument("--from-source", action="store_true", help="keep the caller's bytecode settings")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    if args.pairs < 9:
        parser.error("--pairs: at least 9 pairs")
    with tempfile.TemporaryDirectory(prefix="qvl-bench-pyc-") as pyc:
        if not args.from_source:
            ENV.pop("PYTHONDONTWRITEBYTECODE", None)
            ENV["PYTHONPYCACHEPREFIX"] = pyc
        report(args)


def report(args: argparse.Namespace) -> None:
    """Run the cases, print the figures, exit 1 when a target is missed."""
    qvl = qvl_command()
    results = {}
    for name, (argv, target) in TARGETS.items():
        results[name] = {**paired([*qvl, *argv], args.pairs), "target": target}
        results[name]["met"] = results[name]["median_ratio"] <= target
    machine = f"{platform.machine()}, {os.cpu_count()} CPU, Python {platform.python_version()}"
    bytecode = "from source" if args.from_source else "cached"
    if args.json:
        doc = {"baseline": BARE_NAME, "pairs": args.pairs, "bytecode": bytecode, "machine": machine}
        print(json.dumps({**doc, "cases": results}, indent=2))
    else:
        print(f"baseline: {BARE_NAME}; {args.pairs} pairs each; bytecode {bytecode}; {machine}")
        for name, r in results.items():
            verdict = "met" if r["met"] else "NOT met"
            print(
                f"{name}: {r['median_ratio']}x (target {r['target']}x, {verdict}); medians {r['median_ms']} ms "
                f"vs bare {r['median_bare_ms']} ms; ratios {r['ratios']}"
            )
    sys.exit(0 if all(r["met"] for r in results.values()) else 1)


if __name__ == "__main__":
    main()
