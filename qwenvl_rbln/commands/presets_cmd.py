"""`qvl presets list` and `qvl presets show NAME`."""

from __future__ import annotations

from typing import Any

import typer

from qwenvl_rbln.commands.common import JsonOpt, SetOpt


def register(app: typer.Typer) -> None:
    presets = typer.Typer(help="List and inspect presets (configs/*.yaml).", no_args_is_help=True)

    @presets.command("list")
    def list_cmd(as_json: bool = JsonOpt) -> None:
        """List the shipped presets with their one-line descriptions."""
        from qwenvl_rbln.planning.presets import describe_presets
        from qwenvl_rbln.views import render

        items = describe_presets()

        def human(console: Any, data: dict) -> None:
            from rich.table import Table

            from qwenvl_rbln.views.render import markup

            table = Table("preset", "description", box=None, pad_edge=False)
            for item in data["presets"]:
                table.add_row(markup("{}", item["name"]), markup("{}", item["description"]))
            console.print(table)

        render.emit({"presets": items}, as_json=as_json, human=human)

    @presets.command("show")
    def show_cmd(
        name: str = typer.Argument(..., help="Preset name or path."),
        sets: list[str] = SetOpt,
        as_json: bool = JsonOpt,
    ) -> None:
        """Show a preset merged with what it extends, and the rbln_config it resolves to."""
        from qwenvl_rbln.commands.common import print_warnings
        from qwenvl_rbln.planning.plan import plan_from_loaded
        from qwenvl_rbln.planning.presets import load_preset
        from qwenvl_rbln.views import render

        loaded = load_preset(name, sets)
        plan = plan_from_loaded(loaded)
        print_warnings(plan.warnings)
        data = {
            "name": loaded.name,
            "path": str(loaded.path),
            "chain": loaded.chain,
            "preset": loaded.data,
            "rbln_config": plan.rbln_config,
            "load_rbln_config": plan.load_rbln_config,
        }

        def human(console: Any, d: dict) -> None:
            import yaml

            from qwenvl_rbln.views.render import markup

            console.print(markup("[bold]{}[/bold]  ({})", d["name"], " -> ".join(d["chain"])))
            console.print(yaml.safe_dump(d["preset"], sort_keys=False).rstrip(), markup=False)

        render.emit(data, as_json=as_json, human=human)

    app.add_typer(presets, name="presets")
