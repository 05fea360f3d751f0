"""The walk of a command over an artifact: how often it enters the artifact-reading code and opens each file.

Why: serve's path once re-read ``rbln_config.json`` and ``qvl-manifest.json`` at each check (about 11 entries into
``artifacts/layout.py``); ``artifacts.checked.read_artifact`` reads them once and every check takes the object.
This prints, for each command, the calls made from outside ``artifacts/`` into ``artifacts/layout.py`` and into any
``artifacts/`` module ("rooms entered", counted with ``sys.setprofile``), and every ``open`` of a file under the
artifact directory (an audit hook: Python's own "open" event, so reads through ``Path.read_text`` and hashing
count too).

Each case runs ``qvl`` in a fresh process (``python benchmarks/artifact_walk.py --one ...``): ``serve --dry-run``,
``load-check --no-runtime``, ``bench-serve --dry-run`` and ``deploy --dry-run`` on a fake optimum-rbln 0.12 artifact
with a manifest, made in a temporary directory (``tests/fakes_rbln.py``), and with ``--emulated DIR`` also
``serve --emulate --dry-run`` on an artifact that ``qvl compile --preset cpu-tiny-rbln --emulate -o DIR`` wrote.

Usage: python benchmarks/artifact_walk.py [--emulated DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _measure(root: Path, argv: list[str]) -> dict:
    """Run ``qvl ARGV`` in this process and count the walk over ``root``."""
    import qwenvl_rbln

    package = Path(qwenvl_rbln.__file__).resolve().parent
    artifacts = str(package / "artifacts") + os.sep
    layout = str(package / "artifacts" / "layout.py")
    root = root.resolve()
    opens: Counter[str] = Counter()
    rooms: Counter[str] = Counter()
    layout_rooms: Counter[str] = Counter()
    asks: Counter[str] = Counter()  # a CheckedArtifact's methods: answers from what was read once, not rooms

    def audit(event: str, args: tuple) -> None:
        if event != "open" or not isinstance(args[0], str | bytes | os.PathLike):
            return
        try:
            path = Path(os.fsdecode(args[0])).resolve()
        except (OSError, ValueError):
            return
        if path.is_relative_to(root) and not path.is_dir():
            opens[path.relative_to(root).as_posix()] += 1

    def profile(frame, event: str, _arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        if not code.co_filename.startswith(artifacts) or code.co_name.startswith("<"):
            return
        caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
        name = f"{Path(code.co_filename).stem}.{code.co_name}"
        if not caller.startswith(artifacts):
            method = code.co_qualname.startswith("CheckedArtifact.")
            (asks if method else rooms)[name if not method else f"checked.{code.co_qualname}"] += 1
        if code.co_filename == layout and not caller.startswith(artifacts):
            layout_rooms[name] += 1

    from qwenvl_rbln import cli

    sys.argv = ["qvl", *argv]
    sys.addaudithook(audit)
    sys.setprofile(profile)
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.setprofile(None)
    return {
        "exit": code,
        "layout_entries": sum(layout_rooms.values()),
        "artifacts_entries": sum(rooms.values()),
        "checked_asks": sum(asks.values()),
        "files_opened": sum(opens.values()),
        "opens": dict(sorted(opens.items())),
        "layout_rooms": dict(sorted(layout_rooms.items())),
        "rooms": dict(sorted(rooms.items())),
    }


def _fake_artifact(path: Path) -> Path:
    """An optimum-rbln 0.12 artifact in the real layout with a manifest, as tests/test_serve.py makes one."""
    sys.path.insert(0, str(REPO))
    from qwenvl_rbln.artifacts.manifest import write_manifest
    from qwenvl_rbln.planning.plan import build_plan
    from tests.fakes_rbln import write_artifact

    plan = build_plan("rebel100-1npu")
    root = write_artifact(path, plan)
    write_manifest(
        root,
        {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "Qwen/Qwen3-VL-2B-Instruct"}},
    )
    return root


def _run_case(root: Path, argv: list[str], env: dict[str, str]) -> dict:
    cmd = [sys.executable, __file__, "--one", str(root), "--", *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: the measuring process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emulated", type=Path, help="an artifact `qvl compile --emulate` wrote")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        result = _measure(args.one, args.rest)
        sys.stdout.flush()
        print(json.dumps(result), file=sys.__stdout__)
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="qvl-walk-") as tmp:
        env.setdefault("QVL_HOME", str(Path(tmp) / "home"))
        fake = _fake_artifact(Path(tmp) / "fake")
        cases = [(fake, ["serve", str(fake), "--dry-run", "--json"])]
        cases.append((fake, ["load-check", str(fake), "--no-runtime", "--json"]))
        cases.append((fake, ["bench-serve", str(fake), "--dry-run", "--json"]))
        deploy = ["--artifact", "pvc:models", "--image", "reg.example/vllm-rbln:1", "--dry-run", "--json"]
        cases.append((fake, ["deploy", str(fake), *deploy]))
        if args.emulated is not None:
            emu = args.emulated.resolve()
            cases.insert(0, (emu, ["serve", str(emu), "--emulate", "--dry-run", "--json"]))
        results = {" ".join(argv).replace(str(root), "DIR"): _run_case(root, argv, env) for root, argv in cases}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, r in results.items():
        print(f"qvl {name}  (exit {r['exit']})")
        print(f"  entries into artifacts/layout.py: {r['layout_entries']}  {r['layout_rooms']}")
        print(f"  entries into artifacts/ from outside: {r['artifacts_entries']}  {r['rooms']}")
        print(f"  asks of the CheckedArtifact (no file read): {r.get('checked_asks', 0)}")
        print(f"  files opened under DIR: {r['files_opened']}  {r['opens']}")


if __name__ == "__main__":
    main()
