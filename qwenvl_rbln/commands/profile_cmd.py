"""`qvl profile`: time every compiled graph of an artifact on its devices, beside the roofline; record timings.json.

Options only: ``qwenvl_rbln/profiling/`` runs and fits, ``qwenvl_rbln/views/profile.py`` renders. ``--check TOL``
exits 7 (EXIT_DIVERGED, as ``qvl compare`` does when two runs differ: here the measurement and the estimate)
when a graph's measured / roofline ratio leaves 1 +- TOL; under --emulate the check runs on the emulated figures
and says so (it proves the CI path on a CPU, not the cost model).
"""

from __future__ import annotations

from pathlib import Path

import typer

from qwenvl_rbln.commands.common import JsonOpt


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile_cmd(
        directory: Path = typer.Argument(
            None, help="Artifact directory. Default: the directory the last `qvl compile` from here wrote."
        ),
        repeats: int = typer.Option(10, "--repeats", min=1, help="Timed calls per graph and context."),
        warmup: int = typer.Option(2, "--warmup", min=0, help="Untimed calls first, per graph and context."),
        points: int = typer.Option(5, "--points", min=1, help="Context positions per prefill/decoder graph (fit)."),
        only: list[str] = typer.Option(
            None, "--only", help="Time only these: vit, prefill, decoder, or a graph key (repeatable)."
        ),
        check: float = typer.Option(
            None,
            "--check",
            min=0.0,
            help="Exit 7 when any graph's measured/roofline ratio is outside 1 +- TOL (0.5 = +-50 %), for CI.",
        ),
        save: bool = typer.Option(True, "--save/--no-save", help="Record the entry in $QVL_HOME/timings.json."),
        emulate: bool = typer.Option(
            False,
            "--emulate",
            help="Run an artifact compiled with `qvl compile --emulate` on qvl's CPU emulator (also "
            "QVL_EMULATE_NPU=1): CPU times, recorded apart as emulated, never used for an NPU.",
        ),
        as_json: bool = JsonOpt,
    ) -> None:
        """Time each ViT bucket, the prefill chunk and each decoder batch at several contexts, on the devices of
        the artifact's placement; print each beside the roofline bound and record it for `qvl tune`."""
        from qwenvl_rbln.backends import emulator
        from qwenvl_rbln.errors import EXIT_DIVERGED, InputError, QvlError
        from qwenvl_rbln.profiling.run import ProfileOptions, run_profile
        from qwenvl_rbln.views import render
        from qwenvl_rbln.views.profile import print_human

        if directory is None:
            from qwenvl_rbln.artifacts.last_compile import last_compile

            last = last_compile(require_dir=True)
            if last is None:
                raise InputError("no artifact directory given, and no `qvl compile` from here", "pass DIR")
            directory = Path(last["output_dir"])
        opts = ProfileOptions(
            directory=directory,
            emulate=emulator.requested(emulate),
            warmup=warmup,
            repeats=repeats,
            points=points,
            check=check,
            save=save,
            only=tuple(only or ()),
        )
        data = run_profile(opts)
        error = None
        if data["check"]["ok"] is False:
            what = "emulated" if data["emulated"] else "measured"
            error = QvlError(
                f"{what} times of {', '.join(data['check']['failing'])} differ from the roofline bound by more "
                f"than +-{check:.0%}",
                "see the ratio column; a bound is a floor, so a ratio above 1 is expected: widen --check or "
                "correct the cost model (docs/profiling.md)",
                exit_code=EXIT_DIVERGED,
            )
        render.emit(data, as_json=as_json, human=print_human, error=error)
        if error is not None:
            raise error
