"""The console script: Ctrl-C while the CLI is still importing (Typer, rich) is one line, not a traceback."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from qwenvl_rbln.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("qvl: interrupted before it started; nothing was done\n")
        sys.exit(130)
    cli_main()
