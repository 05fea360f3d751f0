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


def _click_classes(name: str) -> tuple[type, ...]:
    """``name`` from click and from the copy of click that newer Typer releases carry inside themselves."""
    classes: list[type] = []
    for module in ("click.exceptions", "typer._click.exceptions"):
        try:
            classes.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            continue
    return tuple(classes)


def _is_abort(exc: Exception) -> bool:
    return isinstance(exc, (typer.Abort, *_click_classes("Abort")))


def _is_click_error(exc: Exception) -> bool:
    return isinstance(exc, _click_classes("ClickException"))


def _usage_line(exc: Exception) -> str:
    """A usage error in one line: click's message, then where the right flags are listed."""
    message = " ".join(str(exc.format_message() if hasattr(exc, "format_message") else exc).split())
    ctx = getattr(exc, "ctx", None)
    command = getattr(ctx, "command_path", None) or "qvl"
    return f"{message.rstrip('. ')}; fix: see `{command} --help`"


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
        if _is_abort(exc):
            render.err().print("qvl: interrupted", markup=False)
            sys.exit(EXIT_INTERRUPTED)
        if _is_click_error(exc) and not str(exc.format_message()).strip():
            sys.exit(0)  # `qvl` or `qvl presets` alone: the help was printed, and help is what was asked for
        if _is_click_error(exc):
            render.err().print(f"qvl: error: {_usage_line(exc)}", markup=False, highlight=False)
            sys.exit(getattr(exc, "exit_code", 2) or 2)
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
