"""`qvl compile`: preset -> exact rbln_config -> (dry run | real compile into artifacts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from qwenvl_rbln.commands.common import JsonOpt, ModelOpt, PlotOpt, PresetOpt, SetOpt


def plan_summary(console: Any, plan: dict[str, Any]) -> None:
    """Human view of a resolved plan (shared by compile --dry-run and compile)."""
    import json

    from rich.table import Table

    from qwenvl_rbln.views.render import markup

    r = plan["resolved"]
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("preset", markup("{}  ({})", plan["preset"], plan["description"]))
    table.add_row("model", markup("{}  [dim]{}[/dim]", plan["model_id"], plan["model_geometry"]["source"]))
    table.add_row("backend / npu", f"{plan['backend']} / {plan['npu']} ({plan['device_spec']['product']})")
    table.add_row("ViT buckets", ", ".join(str(b) for b in r["vit_buckets"]) + " patches")
    table.add_row(
        "LM",
        f"batch {r['batch_size']}, max_seq_len {r['max_seq_len']}, {r['attn_impl']}"
        + (f" (partition {r['kvcache_partition_len']})" if r["kvcache_partition_len"] else "")
        + f", prefill chunk {r['prefill_chunk_size']}",
    )
    table.add_row("graphs", ", ".join(r["graph_names"]) + ", visual/compiled_model")
    blocks = "auto" if not r["kvcache_num_blocks"] else str(r["kvcache_num_blocks"])
    table.add_row("KV blocks", f"{blocks} (full {r['num_full_blocks']}, minimum {r['num_min_blocks']})")
    p = plan["processor"]
    table.add_row("processor", f"min_pixels {p['min_pixels']}, max_pixels {p['max_pixels']}")
    table.add_row(
        "placement", f"LM on device {plan['placement']['device']}, visual on {plan['placement']['visual_device']}"
    )
    table.add_row("output", markup("{}", plan["output_dir"]))
    console.print(table)
    console.print("[bold]compile rbln_config[/bold] (from_pretrained(export=True))")
    console.print(json.dumps(plan["rbln_config"], indent=2), markup=False, highlight=False)
    console.print("[bold]load rbln_config[/bold] (from_pretrained(export=False))")
    console.print(json.dumps(plan["load_rbln_config"], indent=2), markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("compile")
    def compile_cmd(
        preset: str = PresetOpt,
        sets: list[str] = SetOpt,
        model: str = ModelOpt,
        output: str = typer.Option(None, "--output", "-o", help="Artifact directory (default: the preset's)."),
        dry_run: bool = typer.Option(
            False, "--dry-run", help="Resolve, validate and estimate memory; compile nothing."
        ),
        force: bool = typer.Option(
            False,
            "--force",
            help="Replace an existing artifact (never a directory of other files, the working dir or home); "
            "compile even if the planner says it won't fit, or num_devices > 1 on a Rebel100.",
        ),
        cache_dir: Path = typer.Option(None, "--cache-dir", help="Compile cache (default: $QVL_HOME/compile-cache)."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the compile cache."),
        device_memory: str = typer.Option(
            None, "--device-memory", help="Usable bytes per NPU you measured, e.g. 120GiB."
        ),
        uncertain_ok: bool = typer.Option(
            False,
            "--uncertain-ok",
            help="Accept a memory verdict of 'uncertain' (the margin lies inside the modelled items' range): "
            "exit 0 instead of 4.",
        ),
        emulate: bool = typer.Option(
            False,
            "--emulate",
            help="rbln presets: run optimum-rbln's real compile on the CPU against qvl's emulated rebel (also "
            "QVL_EMULATE_NPU=1); the artifact is marked emulated: it proves glue and host logic, never NPU "
            "numerics, memory or compile errors.",
        ),
        plot: Path = PlotOpt,
        as_json: bool = JsonOpt,
    ) -> None:
        """Compile Qwen3-VL with a preset (optimum-rbln on an RBLN host, transformers for backend torch)."""
        from qwenvl_rbln.commands.common import check_plot, plotted, print_warnings
        from qwenvl_rbln.jobs.compile_request import (
            compile_for_real,
            dry_run_gate,
            plan_for_compile,
            refuse_before_compile,
            refuse_multi_device,
        )
        from qwenvl_rbln.memory.planner import estimate_plan
        from qwenvl_rbln.views import render
        from qwenvl_rbln.views.memory import print_memory

        plot = check_plot(plot)
        plan = plan_for_compile(preset, sets, model, output)
        print_warnings(plan.warnings)
        refuse_multi_device(plan, force)
        memory = estimate_plan(plan, device_memory=device_memory)
        data = {**plan.to_dict(), "memory": memory.to_dict()}
        if plot is not None:  # the planner's picture: of the dry run, or of what is about to be compiled
            from qwenvl_rbln.views.plots.memory import draw_memory

            draw_memory(data["memory"], plot, title=plan.preset, sets=sets)
            plotted(plot)
        if dry_run:
            # what the real run refuses, a dry run does; an occupied output directory is only a warning there
            occupied = refuse_before_compile(plan, emulate=emulate, force=force, dry_run=True)
            print_warnings(occupied)
            data["warnings"] = [*data.get("warnings", []), *occupied]

            def human(console: Any, d: dict[str, Any]) -> None:
                plan_summary(console, d)
                print_memory(console, d["memory"])
                console.print("[dim]dry run: nothing was compiled[/dim]")

            gate = dry_run_gate(data["memory"], uncertain_ok, as_json)
            render.emit({**data, "dry_run": True}, as_json=as_json, human=human, error=gate)
            if gate is not None:
                raise gate
            return
        from qwenvl_rbln.views import live  # the real compile's progress view: a dry run draws none

        result = compile_for_real(
            plan,
            memory,
            emulate=emulate,
            uncertain_ok=uncertain_ok,
            force=force,
            cache_dir=cache_dir,
            use_cache=not no_cache,
            as_json=as_json,
            info=render.info,
            warn=render.warn,
            watch=live.compile_watch if live.allowed(as_json) else None,
        )

        def human_done(console: Any, d: dict[str, Any]) -> None:
            console.print(d["result"]["summary"], markup=False)

        render.emit({**data, "dry_run": False, "result": result}, as_json=as_json, human=human_done)
