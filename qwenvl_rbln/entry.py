"""The console script: Ctrl-C while the CLI is still importing (Typer, rich) is one line, not a traceback, and
a Ctrl-C after the command has finished and reported does not turn its exit code into 130.

The garbage collector waits while the CLI starts: the imports and the app's construction make objects that
live as long as the process, so collections there find nothing to free (~4 % of ``qvl --help``'s work). It is
turned back on here, once the app is built, before the command line is parsed and any command runs."""

from __future__ import annotations

import gc
import signal
import sys


def main() -> None:
    gc.disable()
    try:
        from qwenvl_rbln.cli import app_for
        from qwenvl_rbln.cli import main as cli_main

        app = app_for(sys.argv[1:])  # imports the command's module: still starting
    except KeyboardInterrupt:
        sys.stderr.write("qvl: interrupted before it started; nothing was done\n")
        sys.exit(130)
    finally:
        gc.enable()  # started: a command's own work runs with the collector
    try:
        cli_main(app)
    finally:  # the process is about to exit: the work is done (or its error printed)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
