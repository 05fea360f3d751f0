"""`qvl tiny-model`: write the tiny random-weight Qwen3-VL used for offline tests and dry runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console


def _human(console: Console, data: dict[str, Any]) -> None:
    from qwenvl_rbln.views import render

    verb = "wrote" if data["created"] else "already present:"
    size = render.fmt_bytes(data["total_bytes"])
    kind = "Qwen3-VL-MoE" if data.get("moe") else "Qwen3-VL, 8B shape" if data.get("shape") == "8b" else "Qwen3-VL"
    console.print(f"{verb} tiny {kind} (seed {data['seed']}, {size}) at {data['path']}", markup=False)
    console.print(f"note: {data['note']}", markup=False)
    if not data["created"]:
        console.print("pass --force to rebuild it", markup=False)


def tiny_model(
    directory: Path | None = typer.Argument(
        None,
        metavar="DIR",
        help="Where to write it (default: $QVL_HOME/tiny-qwen3-vl, or tiny-qwen3-vl-moe with --moe, tiny-qwen3-vl-8b "
        "with --shape 8b; QVL_HOME defaults to ~/.cache/qvl).",
        show_default=False,
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for the random weights (same seed, same bytes)."),
    force: bool = typer.Option(False, "--force", help="Replace DIR if it already exists and is not empty."),
    moe: bool = typer.Option(
        False, "--moe", help="A tiny Qwen3-VL-MoE instead (4 experts, top 2, layer 1 dense): model id qvl:tiny-moe."
    ),
    shape: str = typer.Option(
        "2b",
        "--shape",
        help="2b: tied head, ViT hidden = text hidden (qvl:tiny). 8b: the 8B/32B's shape, an untied lm_head and a "
        "ViT hidden (48) below the text hidden (64): model id qvl:tiny-8b.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Write a tiny Qwen3-VL (real architecture, random weights, full processor) for offline use.

    Its generated text is meaningless; it exists so every code path runs on a CPU in seconds.
    """
    from qwenvl_rbln.backends.tiny.model import build_or_reuse
    from qwenvl_rbln.views import render

    data = build_or_reuse(
        directory, seed=seed, force=force, notify=None if as_json else render.info, moe=moe, shape=shape
    )
    render.emit(data, as_json=as_json, human=_human)


def register(app: typer.Typer) -> None:
    app.command("tiny-model")(tiny_model)
