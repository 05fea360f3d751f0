"""`qvl bucket-plan`: where each image / video frame lands in the ViT buckets, what it wastes, and
which bucket list (and decoder_batch_sizes) would serve a real workload best.

Options only: ``qwenvl_rbln/jobs/bucket_plan_job.py`` builds the report (header reads and arithmetic: no torch,
no model, no NPU) and ``qwenvl_rbln/views/bucket_plan.py`` renders it.
"""

from __future__ import annotations

from pathlib import Path

import typer

from qwenvl_rbln.commands.common import JsonOpt, ModelOpt, PlotOpt, PresetOpt, SetOpt


def register(app: typer.Typer) -> None:
    @app.command("bucket-plan")
    def bucket_plan_cmd(
        inputs: list[str] = typer.Argument(None, help="Image/video files or directories (searched recursively)."),
        preset: str = PresetOpt,
        sets: list[str] = SetOpt,
        model: str = ModelOpt,
        sizes: list[str] = typer.Option(None, "--size", help="An image size WIDTHxHEIGHT, e.g. 1920x1080. Repeatable."),
        workload: Path = typer.Option(
            None,
            "--workload",
            "-w",
            help='Sizes from logs: JSONL {"width","height","count"} (+ "frames","fps" for videos) or CSV '
            "width,height[,count]; a misspelt key is an error, other keys (ids, timestamps) are ignored and listed.",
        ),
        optimize: int = typer.Option(
            None, "--optimize", "-k", help="Find the K ViT buckets minimising the ViT compute executed."
        ),
        max_bucket: int = typer.Option(None, "--max-bucket", help="Cap for the largest optimised bucket (patches)."),
        batch_trace: Path = typer.Option(
            None, "--batch-trace", help="Observed running-batch sizes: a JSON list or one integer per line."
        ),
        optimize_decoder: int = typer.Option(
            None, "--optimize-decoder", help="Find the K decoder_batch_sizes minimising padded rows over --batch-trace."
        ),
        rows: int = typer.Option(
            50, "--rows", min=0, help="Table rows to print (0 = all); --json always has every item."
        ),
        no_vit_packing: bool = typer.Option(
            False,
            "--no-vit-packing",
            help="One ViT call per image / temporal patch (today's optimum-rbln); default: each request's segments "
            "packed into shared calls, unless the preset says runtime.vit_packing: false.",
        ),
        on_oversize: str = typer.Option(
            None,
            "--on-oversize",
            help="An input above the largest ViT bucket: resize (plan it resized into that bucket, as infer and serve "
            "run it) or error (list it, exit 2). Default: the preset's runtime.on_oversize, else resize.",
        ),
        uncertain_ok: bool = typer.Option(
            False,
            "--uncertain-ok",
            help="Accept a memory verdict of 'uncertain' for the plan (exit 0 instead of 4), as compile --dry-run.",
        ),
        plot: Path = PlotOpt,
        as_json: bool = JsonOpt,
    ) -> None:
        """Where each image / video frame lands in the ViT buckets: padding, compute, the best buckets for a workload.

        Header reads only: no model, no NPU."""
        from qwenvl_rbln.commands.common import check_plot, plotted, print_warnings
        from qwenvl_rbln.jobs.bucket_plan_job import memory_gate, run_bucket_plan
        from qwenvl_rbln.views import render
        from qwenvl_rbln.views.bucket_plan import print_human
        from qwenvl_rbln.vision.bucket_plan.report import final_error

        plot = check_plot(plot)
        data, warnings = run_bucket_plan(
            preset=preset,
            sets=sets,
            model=model,
            inputs=inputs,
            sizes=sizes,
            workload=workload,
            optimize=optimize,
            max_bucket=max_bucket,
            batch_trace=batch_trace,
            optimize_decoder=optimize_decoder,
            vit_packing=not no_vit_packing,
            notify=render.warn,
            on_oversize=on_oversize,
        )
        print_warnings(warnings)
        # a failing document carries the error object docs/reference.md promises; its line closes stderr
        failed = final_error(data, as_json)
        error = failed or memory_gate(data["summary"], uncertain_ok)
        render.emit(data, as_json=as_json, human=lambda console, d: print_human(console, d, rows), error=error)
        if plot is not None:
            from qwenvl_rbln.views.plots.bucket_plan import draw_bucket_plan

            draw_bucket_plan(data, plot)
            plotted(plot)
        if failed is not None:  # the items carry each problem: close stderr with the one line, exit 2
            render.err().print(f"qvl: error: {failed.one_line()}", markup=False, highlight=False)
            raise SystemExit(failed.exit_code)
        if error is not None:
            raise error
