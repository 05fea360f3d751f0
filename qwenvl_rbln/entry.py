"""The console script: Ctrl-C while the CLI is still importing (Typer, rich) is one line, not a traceback, and
a Ctrl-C after the command has finished and reported does not turn its exit code into 130."""

from __future__ import annotations

import signal
import sys


def main() -> None:
    try:
        from qwenvl_rbln.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("qvl: interrupted before it started; nothing was done\n")
        sys.exit(130)
    try:
        cli_main()
    finally:  # the process is about to exit: the work is done (or its error printed)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
