"""The Typer app. Thin on purpose: each command module registers itself and holds no
heavy imports at module level, so ``qvl --help`` never imports torch or transformers."""

from __future__ import annotations

import os
import sys

import typer

from qwenvl_rbln import __version__
from qwenvl_rbln.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, QvlError

app = typer.Typer(
    name="qvl",
    help="Compile and run Qwen3-VL on Rebellions Rebel100 NPUs (optimum-rbln), with bucket "
    "and memory answers before the compile.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"qvl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """qvl: Qwen3-VL on Rebel100, with the answers before the compile."""


def _register_all() -> None:
    from qwenvl_rbln.commands import register_all

    register_all(app)


_register_all()


def main() -> None:
    """Entry point: one line per error, a documented exit code, no traceback."""
    from qwenvl_rbln import render

    try:
        code = app(standalone_mode=False)
    except QvlError as exc:
        render.err().print(f"qvl: error: {exc.one_line()}", markup=False, highlight=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        render.err().print("qvl: interrupted; nothing half-written was left behind", markup=False)
        sys.exit(EXIT_INTERRUPTED)
    except SystemExit:
        raise
    except Exception as exc:  # click usage errors and genuine bugs
        import click

        if isinstance(exc, click.exceptions.Abort):
            render.err().print("qvl: interrupted", markup=False)
            sys.exit(EXIT_INTERRUPTED)
        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if os.environ.get("QVL_DEBUG"):
            raise
        render.err().print(
            f"qvl: internal error: {type(exc).__name__}: {exc}; rerun with QVL_DEBUG=1 for the traceback",
            markup=False,
            highlight=False,
        )
        sys.exit(EXIT_INTERNAL)
    if code == EXIT_INTERRUPTED:  # typer turns Ctrl-C inside a command into Exit(130)
        render.err().print("qvl: interrupted; nothing half-written was left behind", markup=False)
    sys.exit(code if isinstance(code, int) else 0)
