"""Command modules. Each exposes ``register(app)``; heavy imports stay inside the command bodies."""

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
    "deploy_cmd",
    "presets_cmd",
    "cache_cmd",
    "tiny_model_cmd",
]


def register_all(app: typer.Typer) -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(f"qwenvl_rbln.commands.{name}").register(app)
