"""`qvl load-check DIR`: will this artifact load, where, and does it fit? Then create the runtimes.

The steps (layout, target, placement, memory per device, runtime) live in ``qwenvl_rbln/jobs/load_check.py``, which
returns the report as data; ``qwenvl_rbln/views/load_check.py`` renders it. Exit codes: 0 ok (processor-file
warnings included); 2 layout or placement problems, or processor-file warnings with --strict; 3 optimum-rbln/torch
missing for the runtime step; 4 does not fit, or an uncertain estimate without --uncertain-ok; 5 the backend failed
otherwise. The full report is printed first (stdout, also with --json), then one ``qvl: error:`` line on stderr.
"""

from __future__ import annotations

from pathlib import Path

import typer

from qwenvl_rbln.commands.common import JsonOpt, PlotOpt

DEFAULT_PRESET = "rebel100-1npu"


def register(app: typer.Typer) -> None:
    @app.command("load-check")
    def load_check(
        directory: Path = typer.Argument(
            None,
            metavar="DIR",
            help="Artifact directory. Default, as for `qvl infer`: with --preset P, P's output_dir; else the "
            "directory the last `qvl compile` run from this working directory wrote (if deleted: its preset's "
            f"output_dir); with no compile recorded here, {DEFAULT_PRESET}'s output_dir.",
            show_default=False,
        ),
        preset: str = typer.Option(
            None,
            "--preset",
            "-p",
            help="Preset whose output_dir is checked when DIR is omitted, and whose placement is the fallback "
            "when the artifact records none.",
        ),
        device: str = typer.Option(
            None,
            "--device",
            help="NPU id for the LM graphs, e.g. 0 (or 0,1); default: the placement recorded at compile.",
        ),
        visual_device: str = typer.Option(
            None, "--visual-device", help="NPU id for the ViT; default: the recorded placement, else --device."
        ),
        calibrate: bool = typer.Option(
            False,
            "--calibrate",
            help="Record the compiled graphs' exact workspaces (needs rebel) into $QVL_HOME/calibration.json "
            "so later estimates use measured numbers.",
        ),
        no_runtime: bool = typer.Option(
            False, "--no-runtime", help="Check layout, placement and memory; create no runtimes (no NPU needed)."
        ),
        device_memory: str = typer.Option(
            None, "--device-memory", help="Usable bytes per NPU for the estimate, e.g. 120GiB (default: the NPU spec)."
        ),
        emulate: bool = typer.Option(
            False,
            "--emulate",
            help="Load an artifact compiled with `qvl compile --emulate` through qvl's CPU emulator of rebel "
            "(also QVL_EMULATE_NPU=1); sizes are labelled emulated.",
        ),
        uncertain_ok: bool = typer.Option(
            False,
            "--uncertain-ok",
            help="Accept a memory verdict of 'uncertain' at the estimate (exit 0 instead of 4), as compile --dry-run.",
        ),
        strict: bool = typer.Option(
            False,
            "--strict",
            help="Fail (exit 2) on warnings too: processor files whose caps let inputs past the largest ViT bucket "
            "(`qvl fix-processor DIR` rewrites them).",
        ),
        plot: Path = PlotOpt,
        as_json: bool = JsonOpt,
    ) -> None:
        """Check a compiled artifact: files, target NPU, placement, memory per device, then create the runtimes."""
        from qwenvl_rbln.commands.common import check_plot, plotted
        from qwenvl_rbln.jobs.load_check import resolve_request, run_load_check
        from qwenvl_rbln.memory.placement import parse_device
        from qwenvl_rbln.views import load_check as load_check_view
        from qwenvl_rbln.views import render

        plot = check_plot(plot)
        directory, fallback = resolve_request(directory, preset, notify=render.warn)
        report, error = run_load_check(
            directory,
            device=parse_device(device, "--device"),
            visual_device=parse_device(visual_device, "--visual-device"),
            no_runtime=no_runtime,
            calibrate=calibrate,
            device_memory=device_memory,
            fallback=fallback,
            emulate=emulate,
            uncertain_ok=uncertain_ok,
            strict=strict,
            progress=lambda files, size: render.info(load_check_view.verifying_line(files, size)),
        )
        render.emit(report, as_json=as_json, human=load_check_view.human, error=error)
        if plot is not None and report["memory"].get("devices"):
            from qwenvl_rbln.views.plots.memory import draw_memory

            draw_memory(report["memory"], plot, title=directory.name)
            plotted(plot)
        elif plot is not None:
            render.warn(f"--plot: no memory figures to draw ({report['memory'].get('reason') or 'no devices'})")
        if error is not None:
            raise error
