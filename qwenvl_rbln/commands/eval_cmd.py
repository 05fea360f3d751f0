"""`qvl eval [DIR] --data FILE.jsonl|easy-vqa`: does the artifact still answer correctly? Accuracy with honest error
bars, paired against a baseline, as a CI gate (docs/eval.md).

The questions run through the batch job of `qvl infer --batch-file F --output R` (``infer_batch.prepare_job`` /
``execute``: the same workers, Ray pool, progress and exactly-once results file), then ``evaluation/`` scores them
and ``views/eval.py`` prints the report. `--score R.jsonl` scores a results file again without running anything.
Exit codes: 0; 2 bad input; 8 accuracy below --min-accuracy; 9 a significant drop larger than --max-drop (the
report is printed first, then one error line); the batch job's own (3, 5, 130) while it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from qwenvl_rbln.commands import infer_batch
from qwenvl_rbln.commands.common import JsonOpt, PlotOpt, SetOpt, check_plot, plotted
from qwenvl_rbln.commands.infer_batch import DevicesOpt, RayAddressOpt, WorkersOpt

DEFAULT_NEW_TOKENS = 16  # lmms-eval's VQAv2 template (max_new_tokens: 16)
ResumeOpt = typer.Option(
    False,
    "--resume",
    help="Finish an interrupted run into the same --output: questions already answered (R.batch.jsonl) are "
    "skipped, a torn last line is redone; needs the same --data and --limit.",
)


def _refuse_run_flags(flags: dict[str, Any]) -> None:
    """``--score`` runs nothing: flags that only a run uses are refused rather than silently ignored."""
    from qwenvl_rbln.errors import InputError

    given = [name for name, value in flags.items() if value not in (None, False, [])]
    if given:
        verb = "only applies" if len(given) == 1 else "only apply"
        raise InputError(
            f"--score scores a results file again without running anything; {', '.join(given)} {verb} to a run",
            f"drop {', '.join(given)}, or drop --score to run the questions",
        )


def _metric(metric: str | None, lines: list[dict[str, Any]] | None = None) -> str:
    from qwenvl_rbln.errors import InputError
    from qwenvl_rbln.evaluation.scoring import METRICS

    if metric is None:
        recorded = {x.get("metric") for x in lines or []}
        return recorded.pop() if len(recorded) == 1 and next(iter(recorded)) in METRICS else METRICS[0]
    if metric not in METRICS:
        raise InputError(
            f"--metric {metric!r} is not one of {', '.join(METRICS)}", "e.g. --metric anls for text answers"
        )
    return metric


def _run(opts: Any, data: str, limit: int | None, metric: str, job: dict[str, Any], as_json: bool) -> tuple:
    """Run the questions through the batch job; (eval lines, results path, the job's notes)."""
    from qwenvl_rbln.evaluation import results
    from qwenvl_rbln.evaluation.dataset import load
    from qwenvl_rbln.evaluation.length import check_lengths
    from qwenvl_rbln.inference import runner
    from qwenvl_rbln.inference.target import resolve_target

    dataset = load(data, limit)
    target = resolve_target(opts.directory, opts.preset, opts.sets)  # a wrong DIR fails before anything is written
    emulated = runner.emulation(opts, target)  # so does --emulate on a torch artifact, or an emulated one without it
    check_lengths(dataset.items, target.resolved.max_seq_len, Path(target.directory))  # before any tokenizing
    output = job.pop("output")
    if output is None:
        output = results.default_output(dataset.name, limit, Path(target.directory))
        output.parent.mkdir(parents=True, exist_ok=True)
    files = results.files_for(output)
    results.check_before_run(files, job["resume"])
    opts.batch_file = files.requests
    prepared = infer_batch.prepare_job(opts, output=files.batch, **job)
    results.write_requests(files, dataset.items, job["resume"])
    summary = infer_batch.execute(prepared, as_json=as_json)
    run = {
        "data": dataset.name,
        "backend": target.backend,
        "artifact": str(Path(target.directory).absolute()),
        "emulated": emulated,  # this run's, as the batch job's workers ran it
    }
    lines = results.eval_lines(dataset.items, files.batch, metric, run)
    results.write_jsonl_atomic(files.output, lines)
    return lines, str(files.output), list(summary.get("notes", []))


DirArg = typer.Argument(
    None,
    metavar="DIR",
    help="The artifact to evaluate, as for `qvl infer` (a torch artifact or the tiny model directory is the "
    "reference backend; default: the directory the last `qvl compile` here wrote).",
    show_default=False,
)
DataOpt = typer.Option(
    None,
    "--data",
    help='Questions: a JSONL file ({"id", "image"|"images"|"video", "question", "answers", "choices"?, '
    '"category"?} a line, media relative to it) or easy-vqa (the easy-VQA test set, from its package).',
)
OutputOpt = typer.Option(
    None,
    "--output",
    "-o",
    help="The results file (one line per question); its batch job's files go beside it (R.requests.jsonl, "
    "R.batch.jsonl). Never overwritten: see --resume. Default: qvl-out/eval/<data>[-N]-<artifact>.jsonl.",
)
MaxDropOpt = typer.Option(
    None,
    "--max-drop",
    help="Gate (needs --baseline): exit 9 when the accuracy fell by more than these percentage points AND "
    "the fall is significant (exact McNemar p < 0.05).",
)


def _rescore(score: Path, metric: str | None, run_flags: dict[str, Any]) -> tuple:
    """``--score``: the results file's lines scored again under today's rules; (lines, metric, where, notes, data)."""
    from qwenvl_rbln.evaluation import report, results

    _refuse_run_flags(run_flags)
    lines = results.load_results(score, "--score")
    chosen = _metric(metric, lines)
    lines = [results.score_line(x, chosen) for x in lines]
    return lines, chosen, str(score), [], report.run_value(lines, "data")


def _infer_options(directory: Path | None, preset: str | None, sets: list[str], run: dict[str, Any]) -> Any:
    """``qvl infer``'s options for the batch job (greedy: an evaluation never samples)."""
    from qwenvl_rbln.inference.runner import InferOptions
    from qwenvl_rbln.memory.placement import parse_device

    return InferOptions(
        directory=directory,
        preset=preset,
        sets=list(sets or []),
        max_new_tokens=run["max_new_tokens"],
        device=parse_device(run["device"], "--device"),
        visual_device=parse_device(run["visual_device"], "--visual-device"),
        torch_device=run["torch_device"],
        emulate=run["emulate"],
        vit_packing=not run["no_vit_packing"],
    )


def _report(lines: list, chosen: str, where: str, notes: list, name: Any, baseline: tuple, gate: tuple) -> tuple:
    """The report, the baseline's lines (path, lines) scored under the same rules, and the gates' verdict (report,
    error or None)."""
    from qwenvl_rbln.evaluation import gates, report, results

    path, base = baseline
    if base is not None:
        base = [results.score_line(x, chosen) for x in base]
    doc = report.build(
        lines, data=name, results=where, metric=chosen, baseline=base, baseline_path=path and str(path),
        notes=notes,
    )  # fmt: skip
    return doc, gates.check(doc, *gate)


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_(
        directory: Path = DirArg,
        data: str = DataOpt,
        limit: int = typer.Option(None, "--limit", help="Only the first N questions (the set's own order)."),
        output: Path = OutputOpt,
        resume: bool = ResumeOpt,
        workers: int = WorkersOpt,
        devices: str = DevicesOpt,
        ray_address: str = RayAddressOpt,
        preset: str = typer.Option(None, "--preset", "-p", help="Preset, as for `qvl infer` (e.g. cpu-tiny)."),
        sets: list[str] = SetOpt,
        max_new_tokens: int = typer.Option(
            None,
            "--max-new-tokens",
            help="Tokens per answer at most (default 16, as lmms-eval's VQA tasks); greedy decoding.",
            show_default=False,
        ),
        device: str = typer.Option(None, "--device", help="rbln: NPU id for the LM graphs (one-NPU run)."),
        visual_device: str = typer.Option(None, "--visual-device", help="rbln: NPU id for the ViT (one-NPU run)."),
        torch_device: str = typer.Option(None, "--torch-device", help="torch backend: cpu, cuda or cuda:N."),
        emulate: bool = typer.Option(
            False, "--emulate", help="Run an artifact compiled with `qvl compile --emulate` on qvl's CPU emulator."
        ),
        no_vit_packing: bool = typer.Option(
            False, "--no-vit-packing", help="rbln: one ViT call per image/temporal patch."
        ),
        metric: str = typer.Option(
            None,
            "--metric",
            help="Open questions: vqa (default: the official VQA accuracy where a line lists annotators' answers, "
            "exact match after VQA normalization otherwise), exact (exact match against any answer) or anls.",
        ),
        baseline: Path = typer.Option(
            None, "--baseline", help="An earlier qvl eval results file: paired comparison on the shared ids."
        ),
        min_accuracy: float = typer.Option(
            None, "--min-accuracy", help="Gate: exit 8 when the accuracy is below this fraction (e.g. 0.85)."
        ),
        max_drop: float = MaxDropOpt,
        score: Path = typer.Option(
            None, "--score", metavar="R.jsonl", help="Score this results file again (today's rules); runs nothing."
        ),
        plot: Path = PlotOpt,
        as_json: bool = JsonOpt,
    ) -> None:
        """Run a visual question set through the batch job and score it: accuracy with a 95 % interval, per
        category, and against --baseline the paired difference and exact McNemar test; gates for CI."""
        from qwenvl_rbln.errors import InputError
        from qwenvl_rbln.evaluation import gates, results
        from qwenvl_rbln.views import eval as view
        from qwenvl_rbln.views import render

        gates.check_thresholds(min_accuracy, max_drop, baseline)
        plot = check_plot(plot)
        base = results.load_results(baseline, "--baseline") if baseline is not None else None  # before any work
        job = {"output": output, "resume": resume, "workers": workers, "devices": devices, "ray_address": ray_address}
        if score is not None:
            flags = {"DIR": directory, "--data": data, "--limit": limit, "--preset": preset, "--set": sets}
            flags |= {f"--{k.replace('_', '-')}": v for k, v in job.items()} | {"--emulate": emulate}
            flags |= {"--max-new-tokens": max_new_tokens, "--device": device, "--visual-device": visual_device}
            flags |= {"--torch-device": torch_device, "--no-vit-packing": no_vit_packing}
            lines, chosen, where, notes, name = _rescore(score, metric, flags)
        elif data is None:
            raise InputError("qvl eval needs --data", "pass --data FILE.jsonl or --data easy-vqa, or --score R.jsonl")
        else:
            chosen, name = _metric(metric), data
            tokens = DEFAULT_NEW_TOKENS if max_new_tokens is None else max_new_tokens
            run = {"max_new_tokens": tokens, "device": device, "visual_device": visual_device}
            run |= {"torch_device": torch_device, "emulate": emulate, "no_vit_packing": no_vit_packing}
            opts = _infer_options(directory, preset, sets, run)
            lines, where, notes = _run(opts, data, limit, chosen, job, as_json)
        doc, error = _report(lines, chosen, where, notes, name, (baseline, base), (min_accuracy, max_drop))
        render.emit(doc, as_json=as_json, human=view.human, error=error)
        if plot is not None:
            from qwenvl_rbln.views.plots.eval import plot_eval

            plotted(plot_eval(doc, plot))
        if error is not None:
            raise error
