"""Command modules. Each exposes ``register(app)``; heavy imports stay inside the command bodies.

A module is named after the command it registers (``bucket-plan``: ``bucket_plan_cmd``), so a run imports only
the module of its command (``module_for``); a module listed here the same way is loaded that way too."""

from __future__ import annotations

import importlib

import typer

# Order here is the order in `qvl --help`.
COMMAND_MODULES = [
    "compile_cmd",
    "load_check_cmd",
    "fix_processor_cmd",
    "infer_cmd",
    "bucket_plan_cmd",
    "tune_cmd",
    "profile_cmd",
    "compare_cmd",
    "eval_cmd",
    "serve_cmd",
    "bench_serve_cmd",
    "deploy_cmd",
    "presets_cmd",
    "cache_cmd",
    "tiny_model_cmd",
]


def register_module(app: typer.Typer, name: str) -> None:
    importlib.import_module(f"qwenvl_rbln.commands.{name}").register(app)


def register_all(app: typer.Typer) -> None:
    for name in COMMAND_MODULES:
        register_module(app, name)


def module_for(command: str) -> str | None:
    """The listed module named after ``command`` (``bucket-plan``: ``bucket_plan_cmd``), or None: a typo (or a
    command registered under another name) then loads every module."""
    name = command.replace("-", "_") + "_cmd"
    return name if name in COMMAND_MODULES else None
