"""The Typer app. Thin on purpose: each command module registers itself and holds no
heavy imports at module level, so ``qvl --help`` never imports torch or transformers.

A run registers only the module of the command it names (``qvl compile ...``: ``commands/compile_cmd.py``);
help, an unknown name and ``from qwenvl_rbln.cli import app`` get every command."""

from __future__ import annotations

import os
import sys
from typing import Any

import typer

from qwenvl_rbln import __version__
from qwenvl_rbln.commands import module_for, register_all, register_module
from qwenvl_rbln.commands.startup import defer_help_imports, defer_value_adapters, resolve_annotations
from qwenvl_rbln.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, QvlError


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"qvl {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """qvl: Qwen3-VL on Rebel100, with the answers before the compile."""


def new_app() -> typer.Typer:
    """The app with its options and no command yet."""
    app = typer.Typer(
        name="qvl",
        help="Compile and run Qwen3-VL on Rebellions Rebel100 NPUs (optimum-rbln), with bucket "
        "and memory answers before the compile.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        rich_markup_mode="rich",
    )
    app.callback()(_root)
    return app


_full_app: typer.Typer | None = None


def full_app() -> typer.Typer:
    """The app with every command, built once."""
    global _full_app
    if _full_app is None:
        app = new_app()
        register_all(app)
        resolve_annotations(app)
        _full_app = app
    return _full_app


def _registered_names(app: typer.Typer) -> set[str]:
    from typer.main import get_command_name

    names = {info.name or get_command_name(info.callback.__name__) for info in app.registered_commands if info.callback}
    return names | {info.name for info in app.registered_groups if info.name}


def app_for(argv: list[str]) -> typer.Typer:
    """The app ``argv`` needs: when its first word is a command (no root option before it), an app with only
    the module that registers it (``commands.module_for``); otherwise (help, --version, a typo) every command."""
    module = module_for(argv[0]) if argv and not argv[0].startswith("-") else None
    if module is None:
        return full_app()
    app = new_app()
    register_module(app, module)
    if argv[0] not in _registered_names(app):
        return full_app()
    resolve_annotations(app)
    return app


def __getattr__(name: str) -> Any:
    """``from qwenvl_rbln.cli import app``: the app with every command (tests, scripts)."""
    if name == "app":
        return full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


def _flag_names(exc: Exception) -> list[str]:
    """The flags a "does not take a value" error is about (``--dry-run=true``: a flag given a value)."""
    message = str(exc.format_message() if hasattr(exc, "format_message") else exc)
    if "does not take a value" not in message:
        return []
    return [word.strip("'\"") for word in message.split() if word.strip("'\"").startswith("--")][:1]


def command_path(argv: list[str], app: typer.Typer | None = None) -> str:
    """``qvl compile`` for ``compile --dry-run=true``: the (sub)command the arguments name, for the help pointer.

    click does not attach a context to an error its parser raises, so the path is read from the arguments."""
    import typer.main

    path = ["qvl"]
    command = typer.main.get_command(app or full_app())
    for arg in argv:
        if arg.startswith("-"):
            continue
        sub = getattr(command, "commands", {}).get(arg)
        if sub is None:
            break
        path.append(arg)
        command = sub
    return " ".join(path)


def _usage_line(exc: Exception, argv: list[str] | None = None, app: typer.Typer | None = None) -> tuple[str, str]:
    """A usage error as (message, hint): click's message in one line, then where the right flags are listed."""
    message = " ".join(str(exc.format_message() if hasattr(exc, "format_message") else exc).split())
    names = []
    ctx = getattr(exc, "ctx", None)
    while ctx is not None and getattr(ctx, "parent", None) is not None:  # the root's name is how Python was run
        names.insert(0, ctx.info_name)
        ctx = ctx.parent
    args = list(argv if argv is not None else sys.argv[1:])
    command = " ".join(["qvl", *names]) if names else command_path(args, app)
    hint = f"see `{command} --help`"
    flags = _flag_names(exc)
    if flags:
        hint = f"{flags[0]} is a flag: give it alone (no =value) or leave it out; {hint}"
    return message.rstrip(". "), hint


def wants_json(argv: list[str]) -> bool:
    """``--json`` among the arguments (before a ``--``): errors then also go to stdout as one JSON document."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def _fail(message: str, hint: str | None, code: int, *, as_json: bool, prefix: str = "qvl: error: ") -> None:
    """One line on stderr and, with --json (unless the command already printed its document), the error on stdout."""
    from qwenvl_rbln.views import render

    joiner = "; fix: " if prefix.endswith("error: ") else "; "
    line = message if hint is None else f"{message.rstrip('. ')}{joiner}{hint}"
    render.err().print(prefix + " ".join(line.split()), markup=False, highlight=False)
    if as_json:
        render.emit_error(message, hint, code)
    sys.exit(code)


def _hide_bool_metavar() -> None:
    """Boolean flags take no value, so help shows no ``<bool>`` type for them (newer Typer prints one)."""
    try:
        from typer.core import TyperOption
    except ImportError:  # pragma: no cover - an older Typer: no type column at all
        return
    original = getattr(TyperOption, "display_type_rich", None)
    if original is None or getattr(original, "_qvl", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        if getattr(self, "is_bool_flag", False) or getattr(self, "is_flag", False):
            return None
        return original(self, ctx)

    display_type_rich._qvl = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


def _single_brackets() -> None:
    """An optional argument written ``metavar="[DIR]"`` shows as ``[DIR]`` in the usage line, not ``[[DIR]]``."""
    try:
        from typer.core import TyperArgument
    except ImportError:  # pragma: no cover
        return
    original = getattr(TyperArgument, "_usage_display_name", None)
    if original is None or getattr(original, "_qvl", False):
        return

    def usage_display_name(self: Any) -> str:
        import re

        return re.sub(r"^\[\[(.*)\]\](\.\.\.)?$", r"[\1]\2", original(self))

    usage_display_name._qvl = True  # type: ignore[attr-defined]
    TyperArgument._usage_display_name = usage_display_name  # type: ignore[method-assign]


_hide_bool_metavar()
_single_brackets()
defer_value_adapters()
defer_help_imports()


EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what `cmd | head` reports for a tool the closed pipe ended


def _stdout_was_closed() -> bool:
    """Typer turns EPIPE on stdout into exit 1 (qvl's "internal error"), wrapping stdout to silence the flush:
    that wrapper is the sign the reader of stdout left (``qvl ... | head -n1``)."""
    return type(sys.stdout).__name__ == "PacifyFlushWrapper"


def _closed_pipe() -> None:
    """The reader of stdout left: nothing to report and nobody to report it to. As Python's documentation
    recommends for SIGPIPE, point stdout at devnull so the final flush cannot fail, then exit quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno())
    except (OSError, ValueError, AttributeError):  # no real stdout (a test's capture): nothing to flush
        pass
    sys.exit(EXIT_CLOSED_PIPE)


def main(app: typer.Typer | None = None) -> None:
    """Entry point: one line per error, a documented exit code, no traceback; with --json, also the error as JSON.

    ``app``: what ``app_for(sys.argv[1:])`` gave (entry.main builds it while it still reports a Ctrl-C as one
    line); by default it is built here."""
    from qwenvl_rbln.views import render

    argv = sys.argv[1:]
    as_json = wants_json(argv)
    render.reset_emitted()
    app = app or app_for(argv)
    try:
        code = app(standalone_mode=False)
    except QvlError as exc:
        render.err().print(f"qvl: error: {exc.one_line()}", markup=False, highlight=False)
        for extra in exc.detail_lines():
            render.err().print(f"  {extra}", markup=False, highlight=False)
        if as_json:
            render.emit_error(exc.message, exc.hint, exc.exit_code, problems=exc.problems_dicts())
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _fail(
            "interrupted; nothing half-written was left behind", None, EXIT_INTERRUPTED, as_json=as_json, prefix="qvl: "
        )
    except SystemExit:
        if _stdout_was_closed():
            _closed_pipe()
        raise
    except BrokenPipeError:
        _closed_pipe()
    except Exception as exc:  # click usage errors and genuine bugs
        if _is_abort(exc):
            _fail("interrupted", None, EXIT_INTERRUPTED, as_json=as_json, prefix="qvl: ")
        if _is_click_error(exc) and not str(exc.format_message()).strip():
            sys.exit(0)  # `qvl` or `qvl presets` alone: the help was printed, and help is what was asked for
        if _is_click_error(exc):
            message, hint = _usage_line(exc, argv, app)
            _fail(message, hint, getattr(exc, "exit_code", 2) or 2, as_json=as_json)
        if os.environ.get("QVL_DEBUG"):
            raise
        _fail(
            f"internal error: {type(exc).__name__}: {exc}",
            "rerun with QVL_DEBUG=1 for the traceback",
            EXIT_INTERNAL,
            as_json=as_json,
            prefix="qvl: ",
        )
    if code == EXIT_INTERRUPTED:  # typer turns Ctrl-C inside a command into Exit(130)
        render.err().print("qvl: interrupted; nothing half-written was left behind", markup=False)
        if as_json:
            render.emit_error("interrupted; nothing half-written was left behind", None, EXIT_INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)
