"""A batch job's identity, kept beside its results file, so ``--resume`` never mixes the lines of two jobs.

``R.qvl-job.json`` (next to ``--output R``) records what decides a request's answer: the artifact (its path and
the sha256 its manifest holds over every file), the backend (rbln or torch, emulated or not), the preset and
``--set`` values, the generation (greedy, or sampling with its temperature, top-p and seed; ``--max-new-tokens``),
the default ``--system`` and the oversize policy. ``check`` compares it, before anything touches R, and refuses
a ``--resume`` that differs, naming each difference; ``record`` writes it (atomically) before the first line.
Where the job runs (workers, NPUs) and how fast (``--no-vit-packing``, the torch device) are not part of it: they
do not change an answer.

A sidecar rather than a field in every line: the lines keep their documented schema, and ``--resume`` checks one
small file instead of re-reading a million lines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError

SUFFIX = ".qvl-job.json"
FORMAT = 1
_NAMES = {  # field -> how a message names it
    "artifact": "artifact",
    "backend": "backend",
    "emulated": "emulated (--emulate)",
    "preset": "preset (--preset)",
    "sets": "--set values",
    "generation": "generation (--max-new-tokens, --temperature, --top-p, --seed)",
    "system": "default system prompt (--system)",
    "on_oversize": "oversize policy (--on-oversize)",
}


def sidecar(output: Path) -> Path:
    """Where the job record of ``--output`` lives: ``results.jsonl`` -> ``results.jsonl.qvl-job.json``."""
    output = Path(output)
    return output.with_name(output.name + SUFFIX)


def identity(opts: Any, target: Any, emulated: bool, system: str | None) -> dict[str, Any]:
    """The job's identity from ``qvl infer``'s options and the resolved target (``inference.target.Target``)."""
    from qwenvl_rbln.inference.generation import GenerationOptions
    from qwenvl_rbln.inference.runner import oversize_policy

    gen = GenerationOptions(opts.max_new_tokens, opts.temperature, opts.top_p, opts.seed).to_dict()
    generation = {"max_new_tokens": gen["max_new_tokens"], "mode": gen["mode"]}
    if gen["do_sample"]:  # greedy ignores temperature, top-p and seed: they do not tell two greedy jobs apart
        generation.update(temperature=gen["temperature"], top_p=gen["top_p"], seed=gen["seed"])
    artifact = (target.manifest or {}).get("artifact")
    return {
        "artifact": str(Path(target.directory).absolute()),
        "artifact_sha256": artifact.get("sha256") if isinstance(artifact, dict) else None,
        "backend": target.backend,
        "emulated": bool(emulated),
        "preset": target.plan.preset,
        "sets": list(opts.sets or []),
        "generation": generation,
        "system": system,
        "on_oversize": oversize_policy(opts, target),
    }


def differences(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Each field that differs, as ``name: was X, now Y``. The artifact is the same when its files are (the
    manifest's sha256, wherever it was moved), else when its path is."""
    out = []
    for key, name in _NAMES.items():
        was, is_ = recorded.get(key), now.get(key)
        if key == "artifact":
            old_sha, new_sha = recorded.get("artifact_sha256"), now.get("artifact_sha256")
            if (old_sha == new_sha) if (old_sha and new_sha) else (was == is_):
                continue
            if old_sha and new_sha and was == is_:  # same folder, other files: a recompile in place
                was, is_ = f"{was} (sha256 {old_sha[:12]})", f"the same folder recompiled (sha256 {new_sha[:12]})"
        elif was == is_:
            continue
        out.append(f"{name}: was {_show(was)}, now {_show(is_)}")
    return out


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return "none" if value is None or value == [] else str(value)


def check(output: Path, now: dict[str, Any], resume: bool) -> list[str]:
    """Before a line is written to ``output`` (``--resume``'s read may already have cut a torn last line, which is
    redone whichever job it was): InputError when a ``--resume`` of non-empty results differs from the job
    that wrote them; the notes for the summary otherwise (results without a record, from a qvl before this check
    or with the record deleted, are continued with a note). ``record`` writes the record once the job starts."""
    output, path = Path(output), sidecar(output)
    if not (resume and output.is_file() and output.stat().st_size > 0):
        return []
    recorded = _read(path)
    if recorded is None:
        return [f"{output} had no job record ({path.name}); this run's settings are recorded from now on"]
    diff = differences(recorded, now)
    if diff:
        raise InputError(
            f"--resume {output}: its results were written by another job ({'; '.join(diff)}); continuing "
            "would mix the answers of two jobs in one file",
            f"rerun with the settings it was started with (recorded in {path}), or pass a new --output",
        )
    return []


def record(output: Path, now: dict[str, Any]) -> None:
    """Write (atomically) the job record beside ``output``, before the job's first line."""
    _write(sidecar(output), now)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InputError(
            f"{path}: the job record of these results cannot be read ({exc})",
            f"delete {path} to continue without the check, or pass a new --output",
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("job"), dict):
        raise InputError(
            f"{path}: not a qvl job record (format {FORMAT})",
            f"delete {path} to continue without the check, or pass a new --output",
        )
    return data["job"]


def _write(path: Path, job: dict[str, Any]) -> None:
    from qwenvl_rbln.artifacts.manifest import write_json_atomic

    try:
        write_json_atomic(path, {"format": FORMAT, "job": job})
    except OSError as exc:
        raise InputError(
            f"cannot write the job record {path} beside --output ({exc.strerror or exc})",
            f"make {path.parent} writable, or pass an --output in a writable folder",
        ) from None
