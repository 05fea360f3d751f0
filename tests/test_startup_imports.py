"""What keeps `qvl --help` and a dry run quick, checked by what they import (never by a clock; the timings are
benchmarks/bench_startup.py's): a run imports only its own command's module, pydantic only when a value needs
parsing, and help never the rich modules it does not use. And that none of it changes what a command gets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers_cli import REPO

DRY_RUN = ["compile", "--preset", "rebel100-1npu", "--dry-run", "--json"]
# what neither `qvl --help` nor the dry run may import: typer's value adapters (pydantic), the rich modules help
# never uses (markdown, tracebacks), the heavy libraries
NEVER = (
    "pydantic",
    "pydantic_core",
    "markdown_it",
    "rich.markdown",
    "rich.traceback",
    "rich.pretty",
    "torch",
    "transformers",
    "optimum",
    "numpy",
)


def _modules_after(argv: list[str]) -> set[str]:
    """The modules a fresh ``qvl ARGV`` (the console script's entry.main) has imported when it exits."""
    code = (
        "import json, sys\n"
        f"sys.argv = {['qvl', *argv]!r}\n"
        "from qwenvl_rbln import entry\n"
        "try:\n    entry.main()\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write('\\nMODULES ' + json.dumps(sorted(sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES ")][-1]
    return set(json.loads(line[len("MODULES ") :]))


def _command_modules(modules: set[str]) -> set[str]:
    return {m.rsplit(".", 1)[1] for m in modules if m.startswith("qwenvl_rbln.commands.") and m.endswith("_cmd")}


@pytest.mark.parametrize("argv", [["--help"], DRY_RUN], ids=" ".join)
def test_help_and_the_dry_run_import_none_of_the_heavy_modules(argv):
    modules = _modules_after(argv)
    assert not sorted(m for m in NEVER if m in modules)


def test_the_dry_run_imports_only_its_own_command_module_and_no_terminal():
    """``qvl compile ...`` registers compile_cmd alone; with --json nothing is drawn, so rich is never loaded, and
    a dry run shows no compile progress."""
    modules = _modules_after(DRY_RUN)
    assert _command_modules(modules) == {"compile_cmd"}
    assert not sorted(m for m in modules if m in ("rich.console", "typer.rich_utils", "qwenvl_rbln.views.live"))


def test_help_imports_no_planner_and_no_preset_reader():
    modules = _modules_after(["--help"])
    assert not sorted(m for m in modules if m.startswith(("qwenvl_rbln.planning", "qwenvl_rbln.memory", "yaml")))


def test_every_command_module_is_found_by_the_command_it_is_named_after():
    """The naming rule ``module_for`` relies on: a module added to COMMAND_MODULES the ordinary way (``eval_cmd``
    registering ``eval``) is loaded alone for its own command; a module breaking the rule would load them all."""
    from qwenvl_rbln import cli
    from qwenvl_rbln.commands import COMMAND_MODULES, module_for

    for module in COMMAND_MODULES:
        command = module.removesuffix("_cmd").replace("_", "-")
        assert module_for(command) == module
        app = cli.app_for([command, "--help"])
        assert app is not cli.full_app(), f"{module} does not register `{command}`"
    assert module_for("nope") is None and module_for("bench-serve") == "bench_serve_cmd"


def test_each_command_alone_is_the_command_of_the_whole_app():
    """Registered alone, every command (and group) has the same parameters, help and subcommands as in the app
    with every command; a name no module is named after (a typo) gets the whole app."""
    import typer.main

    from qwenvl_rbln import cli

    def shape(command) -> list:
        params = [(p.name, tuple(p.opts), p.required, p.multiple, p.nargs, repr(p.default)) for p in command.params]
        subs = getattr(command, "commands", {})
        return [command.help, params, {name: shape(sub) for name, sub in subs.items()}]

    full = typer.main.get_command(cli.full_app())
    for name, command in full.commands.items():
        alone = typer.main.get_command(cli.app_for([name]))
        assert shape(alone.commands[name]) == shape(command), name
        assert shape(alone)[1] == shape(full)[1]  # the root's own options (--version)
    assert cli.app_for(["bench-srve"]) is cli.full_app()
    assert cli.app_for(["--help"]) is cli.full_app() and cli.app_for([]) is cli.full_app()


def _sample_values(descriptor) -> list:
    import typing

    annotation = descriptor.annotation
    if annotation is str:
        return ["", "abc", "rebel100-1npu", "x\udcff", "[1, 2]", " spaced "]
    if typing.get_origin(annotation) is list:
        return [(), ("a",), ("a=1", "b=[2]"), ["x", ""]]
    if annotation is Path:
        return ["", ".", "a/b/", "/nonexistent/x", str(REPO / "README.md"), str(REPO / "configs")]
    if annotation in (int, float):
        return [annotation(0), annotation(3), annotation(-1), annotation(70000)]
    return []


def test_plain_values_are_what_typers_own_adapters_return():
    """For every parameter of every command: where ``plain_value`` answers, Typer's pydantic adapter gives the
    same value of the same type; everywhere else the adapter itself is used."""
    import typer.main
    from typer._coercion import build_runtime_param

    from qwenvl_rbln import cli
    from qwenvl_rbln.commands.startup import _UNSET, plain_value

    checked = 0

    def walk(command) -> None:
        nonlocal checked
        for param in command.params:
            descriptor = param.type_descriptor
            for value in _sample_values(descriptor):
                plain = plain_value(descriptor, value)
                if plain is _UNSET:
                    continue
                typer_own = build_runtime_param(descriptor)._coerce_value(value, param=param, ctx=None)
                assert (type(plain), plain) == (type(typer_own), typer_own), (command.name, param.name, value)
                checked += 1
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(cli.full_app()))
    assert checked > 200, "too few parameters were compared to be looking at the app"


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_help_stand_ins_hand_over_to_the_real_rich_classes():
    """After help drew with the stand-ins, the renderer's Markdown and Traceback still work (they load the real
    classes), and an ``import rich.markdown`` anywhere gets the real module."""
    code = (
        "import io, sys\n"
        "sys.argv = ['qvl', '--help']\n"
        "sys.stdout = io.StringIO()\n"
        "from qwenvl_rbln import cli\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "sys.stdout = sys.__stdout__\n"
        "assert 'rich.markdown' not in sys.modules and 'markdown_it' not in sys.modules\n"
        "import typer.rich_utils as ru\n"
        "md = ru.Markdown('# hi')\n"
        "import rich.markdown\n"
        "assert type(md) is rich.markdown.Markdown and isinstance(md, ru.Markdown)\n"
        "try:\n    raise ValueError('x')\nexcept ValueError as exc:\n"
        "    tb = ru.Traceback.from_exception(type(exc), exc, exc.__traceback__)\n"
        "import rich.traceback\n"
        "assert type(tb) is rich.traceback.Traceback\n"
        "print('ok')\n"
    )
    proc = _run_python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_a_command_runs_with_the_garbage_collector_on():
    """entry.main pauses the collector while the CLI starts and turns it on once the app is built."""
    code = (
        "import gc, sys\n"
        "import qwenvl_rbln.planning.presets as presets\n"
        "real = presets.describe_presets\n"
        "def spy():\n    print('gc on in the command:', gc.isenabled())\n    return real()\n"
        "presets.describe_presets = spy\n"
        "sys.argv = ['qvl', 'presets', 'list', '--json']\n"
        "from qwenvl_rbln import entry\n"
        "try:\n    entry.main()\nexcept SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n"
        "print('gc on after:', gc.isenabled())\n"
    )
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("gc on")]
    assert lines == ["gc on in the command: True", "gc on after: True"]
