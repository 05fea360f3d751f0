"""The files of one ``qvl eval`` run, all beside ``--output R.jsonl`` (docs/eval.md, "Files"):

- ``R.requests.jsonl``: the batch file, one request per question (id, prompt, media), written whole (temp + rename);
- ``R.batch.jsonl``: the batch job's results file (``qvl infer --batch-file ... --output``), appended by the batch
  job as requests finish: every id exactly once, ``--resume`` continues it, nothing in it is ever overwritten;
- ``R.jsonl``: the eval results, derived whole from R.batch.jsonl once the job has finished (temp + rename): per
  question its id, question, answers, prediction, ``correct``, category, and the batch record's fields.

So the exactly-once guarantee is the batch job's own, and R.jsonl can always be derived again from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.evaluation.items import EvalItem
from qwenvl_rbln.evaluation.length import excerpt
from qwenvl_rbln.evaluation.scoring import score_item

DEFAULT_FOLDER = Path("qvl-out") / "eval"
RESULT_KEYS = ("id", "answers", "prediction")  # what --score and --baseline need on every line
# what scoring and the report read; --score and --baseline keep only these of a line (the batch record's token ids,
# vision and timings would take ~5 KB a line in memory: 1 GB for two files of 100,000 lines)
SCORED_KEYS = (*RESULT_KEYS, "choices", "category", "metric", "data", "backend", "artifact", "emulated")


@dataclass(frozen=True)
class EvalFiles:
    output: Path  # R.jsonl
    requests: Path  # R.requests.jsonl
    batch: Path  # R.batch.jsonl


def files_for(output: Path) -> EvalFiles:
    stem = output.name[: -len(".jsonl")] if output.name.endswith(".jsonl") else output.name
    return EvalFiles(output, output.with_name(f"{stem}.requests.jsonl"), output.with_name(f"{stem}.batch.jsonl"))


def default_output(data_name: str, limit: int | None, artifact: Path) -> Path:
    """``qvl-out/eval/<data>[-<limit>]-<artifact folder>.jsonl``: one file per set, size and artifact."""
    data = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(data_name).stem if data_name.endswith(".jsonl") else data_name)
    size = f"-{limit}" if limit is not None else ""
    return DEFAULT_FOLDER / f"{data}{size}-{artifact.name or 'model'}.jsonl"


def _filled(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def check_before_run(files: EvalFiles, resume: bool) -> None:
    """Refuse, before anything is written, a run that would overwrite results or has nothing to resume."""
    out = files.output
    if out.is_dir():
        raise InputError(f"--output {out} is a directory", "pass a file path, e.g. --output eval.jsonl")
    if not out.parent.is_dir():
        raise InputError(
            f"--output {out}: folder {out.parent} does not exist", f"create it first: mkdir -p {out.parent}"
        )
    if not resume:
        for path, what in ((out, "eval results"), (files.batch, "the batch job's results")):
            if _filled(path):
                raise InputError(
                    f"{path} already holds {what}; qvl never overwrites them",
                    f"add --resume to finish that run, `qvl eval --score {out}` to score it again, or pass a new "
                    "--output",
                )
    elif _filled(out) and not files.batch.exists():
        raise InputError(
            f"--resume: {out} has no batch job results beside it ({files.batch.name}); nothing to resume",
            f"score it again with `qvl eval --score {out}`, or pass a new --output",
        )


def write_requests(files: EvalFiles, items: list[EvalItem], resume: bool) -> None:
    """The batch file of this run; a resumed run must ask the very same requests (same ids, prompts, media)."""
    text = "".join(json.dumps(item.request(), ensure_ascii=False) + "\n" for item in items)
    if resume and files.requests.is_file():
        if files.requests.read_text(encoding="utf-8") == text:
            return
        raise InputError(
            f"--resume: {files.requests} holds other requests than this run's (another --data, --limit or prompt)",
            "resume with the --data and --limit of the first run, or pass a new --output",
        )
    write_text_atomic(files.requests, text)


def write_text_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all: a temporary sibling, fsync'd, then renamed into place."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.qvl-tmp-", dir=path.absolute().parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as any new file, not mkstemp's 0600
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise InputError(f"{path}: cannot be written ({exc.strerror or exc})", "write into a writable folder") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_jsonl_atomic(path: Path, records: Iterable[dict[str, Any]]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in records))


def iter_jsonl(path: Path, flag: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of every complete line, read as consumed; a torn last line (no newline: a kill
    mid-write) is left out, a complete line that is not a JSON object is refused naming it."""
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise InputError(f"{flag} {path} {what}", "pass a results file written by qvl eval")
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.endswith(b"\n") or not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                obj = None
            if not isinstance(obj, dict):
                raise InputError(
                    f"{path}:{lineno}: not a JSON object", f"{flag} takes a results file written by qvl eval"
                )
            yield lineno, obj


def _twice(path: Path, lineno: int, rid: str, first: int) -> InputError:
    return InputError(
        f"{path}:{lineno}: id '{rid}' is there twice (first on line {first}); every id must appear once",
        "use the file qvl wrote, unedited",
    )


def load_results(path: Path, flag: str) -> list[dict[str, Any]]:
    """An eval results file (``--score``, ``--baseline``): every line with an id, answers and a prediction, each id
    once; only the keys scoring reads are kept (``SCORED_KEYS``), line by line."""
    out: list[dict[str, Any]] = []
    first: dict[str, int] = {}
    for lineno, row in iter_jsonl(path, flag):
        missing = [k for k in RESULT_KEYS if k not in row]
        if missing or not isinstance(row["id"], str) or not isinstance(row["answers"], list):
            raise InputError(
                f"{path}:{lineno}: not a qvl eval result line (no {', '.join(missing) or 'valid id/answers'})",
                f"{flag} takes the R.jsonl qvl eval wrote, not its R.batch.jsonl or R.requests.jsonl",
            )
        if row["id"] in first:
            raise _twice(path, lineno, row["id"], first[row["id"]])
        first[row["id"]] = lineno
        out.append({k: row[k] for k in SCORED_KEYS if k in row})
    if not out:
        raise InputError(f"{flag} {path} holds no results", "pass the R.jsonl of a finished qvl eval run")
    return out


def score_line(line: dict[str, Any], metric: str) -> dict[str, Any]:
    """``line`` with ``correct``, ``score`` (and ``choice``) worked out again under today's rules."""
    prediction = line.get("prediction")
    result = score_item(
        prediction if isinstance(prediction, str) else None, line["answers"], line.get("choices"), metric
    )
    out = {**line, "correct": result.correct, "score": result.score, "metric": metric}
    if line.get("choices"):
        out["choice"] = result.choice
    return out


def eval_lines(items: list[EvalItem], batch: Path, metric: str, run: dict[str, Any]) -> list[dict[str, Any]]:
    """One eval line per question, in the set's order, from the batch job's results (each id exactly once)."""
    records: dict[str, dict[str, Any]] = {}
    first: dict[str, int] = {}
    for lineno, row in iter_jsonl(batch, "batch results"):
        if not isinstance(row.get("id"), str) or "ok" not in row:
            raise InputError(f"{batch}:{lineno}: not a batch job result line", "pass a new --output")
        if row["id"] in first:
            raise _twice(batch, lineno, row["id"], first[row["id"]])
        first[row["id"]] = lineno
        records[row["id"]] = row
    missing = [item.id for item in items if item.id not in records]
    if missing:
        raise InputError(
            f"{batch} lacks {len(missing)} of the {len(items)} questions (first: {missing[0]})",
            "rerun the same command with --resume",
        )
    out = []
    for item in items:
        record = records[item.id]
        text = record.get("text")
        line: dict[str, Any] = {"id": item.id, "question": excerpt(item.question), "answers": list(item.answers)}
        if item.choices:
            line["choices"] = list(item.choices)
        line |= {"category": item.category, "prompt": excerpt(item.prompt()), **run}
        line["prediction"] = text.strip() if record.get("ok") and isinstance(text, str) else None
        line = score_line(line, metric)
        out.append(line | {k: v for k, v in record.items() if k != "id"})
    return out
