"""What keeps qvl's start-up short around Typer; none of it changes what a command does or prints.

* Typer coerces every non-flag value through a pydantic ``TypeAdapter``, built for each parameter before its
  value is looked at: even an unset option or a plain string imports pydantic (~60 ms, more than the bare
  imports of typer, rich and yaml). Here the adapter is built on the first value that needs parsing (an
  integer typed by the user, a file, a choice); a value Typer's adapter would hand back unchanged (a string,
  a list of strings, a plain path, a default of the declared type) is handed back without it.
* Typer's help renderer (``typer.rich_utils``) imports ``rich.markdown`` (markdown-it) and ``rich.traceback``
  at its top (~35 ms), for ``rich_markup_mode="markdown"`` and pretty tracebacks, both off in qvl. Help
  imports it with stand-ins for those two classes, which load the real class if anything ever uses them.
* Typer reads a command's annotations four times while it builds the command, and under
  ``from __future__ import annotations`` each read evaluates every annotation string again (~10 ms for the
  root help's 17 commands): ``resolve_annotations`` evaluates them once, the way Typer does.

Each patch leaves Typer as it is when the Typer in use lacks what it replaces.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin

_UNSET = object()


def plain_value(descriptor: Any, value: Any) -> Any:
    """What Typer's adapter returns for ``value`` where that needs no parsing (the same object or an equal
    one), else ``_UNSET``: the adapter then decides, its errors included."""
    annotation, info = descriptor.annotation, descriptor.parameter_info
    if descriptor.file_annotation is not None or info.parser is not None:
        return _UNSET
    if annotation is str and type(value) is str:
        return value
    if get_origin(annotation) is list and get_args(annotation) == (str,) and type(value) in (list, tuple):
        return list(value) if all(type(item) is str for item in value) else _UNSET
    if annotation in (int, float) and type(value) is annotation:  # a default: within its bounds, as it is
        inside = (info.min is None or value >= info.min) and (info.max is None or value <= info.max)
        return value if inside else _UNSET
    if annotation is Path and type(value) is str and _plain_path(info):
        path = Path(value)  # what pydantic makes of a string; then Typer's one check a plain path gets:
        readable = not info.readable or not os.path.exists(path) or os.access(path, os.R_OK)
        return path if readable else _UNSET  # an unreadable file: Typer's own error message
    return _UNSET


def _plain_path(info: Any) -> bool:
    """A ``Path`` option that asks for no check but Typer's default one (readable when it exists)."""
    return (
        not info.exists
        and info.file_okay
        and info.dir_okay
        and not info.writable
        and not info.resolve_path
        and not info.allow_dash
        and info.path_type is None
    )


def defer_value_adapters() -> None:
    """Typer's parameters coerce through ``_FirstNeed``: pydantic is imported by the first value that needs it."""
    try:
        from typer._coercion import RuntimeParam, build_runtime_param
        from typer.core import _TyperParameter
    except ImportError:  # pragma: no cover - another Typer: it coerces as it always did
        return
    original = getattr(_TyperParameter, "get_runtime_param", None)
    if original is None or getattr(original, "_qvl", False):
        return

    @dataclass(frozen=True)
    class _FirstNeed(RuntimeParam):  # type: ignore[misc, valid-type]
        """Typer's own ``coerce`` (unset values, lists), a plain value as is, the adapter built on first need."""

        descriptor: Any = None
        built: list = field(default_factory=list)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            plain = plain_value(self.descriptor, value)
            if plain is not _UNSET:
                return plain
            if not self.built:
                self.built.append(build_runtime_param(self.descriptor))
            return self.built[0]._coerce_value(value, param=param, ctx=ctx)

    def get_runtime_param(self: Any) -> Any:
        if self._runtime_param is None:
            d = self.type_descriptor
            self._runtime_param = _FirstNeed(parameter_info=d.parameter_info, annotation=d.annotation, descriptor=d)
        return self._runtime_param

    get_runtime_param._qvl = True  # type: ignore[attr-defined]
    _TyperParameter.get_runtime_param = get_runtime_param  # type: ignore[method-assign]


# the rich modules typer.rich_utils imports at its top and qvl's help never uses, with the class it takes
HELP_NEVER_USES = {"rich.markdown": "Markdown", "rich.traceback": "Traceback"}


class _OnFirstUse(type):
    """A stand-in class: calling it, or reading what it does not define, imports the real class and hands over."""

    def real(cls) -> Any:
        return getattr(importlib.import_module(cls.__module__), cls.__name__)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.real()(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:
        return getattr(cls.real(), name)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls.real())


def load_help_renderer() -> None:
    """Import ``typer.rich_utils`` with stand-ins for ``HELP_NEVER_USES``, then take the stand-in modules out of
    ``sys.modules`` again: a later ``import rich.markdown`` anywhere loads the real module."""
    if "typer.rich_utils" in sys.modules:
        return
    stand_ins = {}
    for module, name in HELP_NEVER_USES.items():
        if module not in sys.modules:
            stand_in = types.ModuleType(module)
            setattr(stand_in, name, _OnFirstUse(name, (), {"__module__": module}))
            stand_ins[module] = stand_in
    sys.modules.update(stand_ins)
    try:
        importlib.import_module("typer.rich_utils")
    except ImportError:  # pragma: no cover - a Typer that takes more from them: it imports the real ones itself
        pass
    finally:
        for module, stand_in in stand_ins.items():
            if sys.modules.get(module) is stand_in:
                del sys.modules[module]


def defer_help_imports() -> None:
    """Help, of the app or of a command, loads its renderer through ``load_help_renderer``."""
    try:
        from typer.core import TyperCommand, TyperGroup
    except ImportError:  # pragma: no cover
        return
    for cls in (TyperCommand, TyperGroup):
        original = cls.__dict__.get("format_help")
        if original is None or getattr(original, "_qvl", False):
            continue

        def format_help(self: Any, ctx: Any, formatter: Any, _original: Any = original) -> Any:
            load_help_renderer()
            return _original(self, ctx, formatter)

        format_help._qvl = True  # type: ignore[attr-defined]
        cls.format_help = format_help  # type: ignore[method-assign]


def resolve_annotations(app: Any) -> None:
    """The string annotations of ``app``'s commands and callbacks (its groups' too), evaluated once with
    ``inspect.get_annotations(eval_str=True)``, as Typer's ``inspect.signature(eval_str=True)`` does; one that
    does not evaluate is left as it is, for Typer to report as it always did."""
    callbacks = [info.callback for info in app.registered_commands]
    if app.registered_callback is not None:
        callbacks.append(app.registered_callback.callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            resolve_annotations(group.typer_instance)
    for func in callbacks:
        if func is None or not any(isinstance(a, str) for a in getattr(func, "__annotations__", {}).values()):
            continue
        try:
            func.__annotations__ = inspect.get_annotations(func, eval_str=True)
        except Exception:  # Typer evaluates it again and reports it
            continue
