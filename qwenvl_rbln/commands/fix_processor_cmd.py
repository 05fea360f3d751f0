"""`qvl fix-processor DIR`: rewrite an artifact's processor files to its compiled ViT buckets.

For artifacts saved outside qvl (plain optimum-rbln, the product document's scripts), whose processor files carry
the checkpoint's caps; ``qvl load-check`` warns about them and names this command. The work is in
``qwenvl_rbln/jobs/processor_fix.py`` (staged, then moved into place; backups ``NAME.orig`` beside the files; the
manifest rehashed). Exit codes: 0 rewritten or nothing to change; 2 not an NPU artifact or not writable; 6 another
qvl process is writing the directory.
"""

from __future__ import annotations

from pathlib import Path

import typer

from qwenvl_rbln.commands.common import JsonOpt


def register(app: typer.Typer) -> None:
    @app.command(
        "fix-processor",
        help="Cap an artifact's processor files at its compiled ViT buckets (the old files kept as NAME.orig).\n\n"
        "Images get size.longest_edge = largest bucket x 16^2; videos get qvl_max_frame_pixels, the per-frame cap that "
        "qvl infer and qvl serve apply. A qvl-manifest.json is rehashed, so `qvl load-check DIR` is clean after.",
    )
    def fix_processor(
        directory: Path = typer.Argument(
            ..., metavar="DIR", help="Artifact directory (an NPU artifact).", show_default=False
        ),
        dry_run: bool = typer.Option(
            False, "--dry-run", help="Show the keys that would change and the backup names; write nothing."
        ),
        as_json: bool = JsonOpt,
    ) -> None:
        from qwenvl_rbln.jobs.processor_fix import fix_processor as run_fix
        from qwenvl_rbln.views import load_check as load_check_view
        from qwenvl_rbln.views import render

        render.emit(run_fix(directory, dry_run=dry_run), as_json=as_json, human=load_check_view.fix_processor_human)
