"""The numbers of ``qvl eval``: accuracy with its Wilson interval, overall and per category, and with a baseline the
paired comparison on the shared ids (both right / only this / only baseline, the difference in points with
Newcombe's interval, the exact McNemar p-value). Ids that are not shared are counted and named, never dropped
silently. Data in, a dict out: the view and ``--json`` print the same dict.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.evaluation.scoring import annotator_answers
from qwenvl_rbln.evaluation.stats import mcnemar_exact, paired_difference, wilson

NO_CATEGORY = "(none)"


def _interval(k: int, n: int) -> list[float] | None:
    ci = wilson(k, n)
    return None if ci is None else [ci[0], ci[1]]


def _block(lines: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(lines)
    k = sum(1 for x in lines if x["correct"])
    return {"n": n, "correct": k, "accuracy": k / n if n else None, "ci95": _interval(k, n)}


def by_category(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per category (sorted by name); questions without one form ``(none)`` when others have one."""
    if not any(x.get("category") for x in lines):
        return {}
    groups: dict[str, list[dict[str, Any]]] = {}
    for x in lines:
        groups.setdefault(x.get("category") or NO_CATEGORY, []).append(x)
    return {name: _block(groups[name]) for name in sorted(groups)}


def _mean_score(lines: list[dict[str, Any]]) -> float | None:
    return sum(float(x["score"]) for x in lines) / len(lines) if lines else None


def summary(lines: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """Accuracy, its interval, requests that failed (counted wrong) and the categories; the mean of the items'
    scores as the field publishes it: ``anls`` under anls, ``vqa_accuracy`` (and how many questions carry
    annotators' answers) under vqa."""
    out = _block(lines)
    out["failed"] = sum(1 for x in lines if x.get("prediction") is None)
    if metric == "anls":
        out["anls"] = _mean_score(lines)
    if metric == "vqa":
        out["vqa_accuracy"] = _mean_score(lines)
        out["annotated"] = sum(1 for x in lines if not x.get("choices") and annotator_answers(x["answers"]))
    out["by_category"] = by_category(lines)
    return out


def _same_questions(shared: Iterable[str], this: dict[str, Any], base: dict[str, Any]) -> None:
    """A baseline of another question set is refused: a shared id must carry the same answers (and choices)."""
    differ = [
        i
        for i in shared
        if (this[i]["answers"], this[i].get("choices")) != (base[i]["answers"], base[i].get("choices"))
    ]
    if differ:
        raise InputError(
            f"--baseline: {len(differ)} shared ids carry other answers or choices (first: '{differ[0]}'): "
            "the baseline ran another question set",
            "compare runs of the same --data (and the same --limit or a larger one)",
        )


def compare(lines: list[dict[str, Any]], baseline: list[dict[str, Any]], baseline_path: str) -> dict[str, Any]:
    """The paired comparison of this run with a baseline on their shared ids."""
    this = {x["id"]: x for x in lines}
    base = {x["id"]: x for x in baseline}
    shared = [i for i in this if i in base]
    _same_questions(shared, this, base)
    a = sum(1 for i in shared if this[i]["correct"] and base[i]["correct"])
    b = sum(1 for i in shared if this[i]["correct"] and not base[i]["correct"])
    c = sum(1 for i in shared if not this[i]["correct"] and base[i]["correct"])
    d = len(shared) - a - b - c
    only_here = [i for i in this if i not in base]
    only_base = [i for i in base if i not in this]
    paired = paired_difference(a, b, c, d)
    n = len(shared)
    return {
        "baseline": baseline_path,
        "baseline_backend": run_value(baseline, "backend"),
        "baseline_backend_mixed": mixed(baseline, "backend"),
        "baseline_emulated": any(x.get("emulated") for x in baseline),
        "n_shared": n,
        "accuracy_shared": (a + b) / n if n else None,
        "baseline_accuracy": (a + c) / n if n else None,
        "baseline_ci95": _interval(a + c, n),
        "both_right": a,
        "only_this": b,
        "only_baseline": c,
        "both_wrong": d,
        "delta_points": None if paired is None else paired[0] * 100,
        "delta_ci95": None if paired is None else [paired[1][0] * 100, paired[1][1] * 100],
        "mcnemar_p": mcnemar_exact(b, c) if n else None,
        "unshared": {"count": len(only_here) + len(only_base), "only_this_run": only_here, "only_baseline": only_base},
        "baseline_by_category": by_category([base[i] for i in shared]),
    }


def run_value(lines: list[dict[str, Any]], key: str) -> Any:
    """A run-wide field (backend, artifact) when every line agrees, else None (see ``mixed``)."""
    return lines[0].get(key) if lines and not mixed(lines, key) else None


def mixed(lines: list[dict[str, Any]], key: str) -> bool:
    """Whether the lines disagree on ``key`` (absent everywhere is agreement: a hand-made file, not joined runs)."""
    return len({json.dumps(x.get(key), sort_keys=True, default=str) for x in lines}) > 1


def build(
    lines: list[dict[str, Any]],
    *,
    data: str | None,
    results: str,
    metric: str,
    baseline: list[dict[str, Any]] | None = None,
    baseline_path: str | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """The report ``qvl eval`` prints (human) or emits (``--json``); ``gates`` are added by ``gates.check``."""
    emulated = any(x.get("emulated") for x in lines)
    report: dict[str, Any] = {
        "data": data,
        "results": results,
        "metric": metric,
        "backend": run_value(lines, "backend"),
        "backend_mixed": mixed(lines, "backend"),
        "artifact": run_value(lines, "artifact"),
        "emulated": emulated,
        **summary(lines, metric),
    }
    if baseline is not None:
        report |= compare(lines, baseline, baseline_path or "")
    notes = list(notes or [])
    if report.get("annotated"):
        notes.append(
            f"{report['annotated']} questions list annotators' answers (one repeated, or ten): each scores the "
            "official VQA accuracy (vqa_accuracy, the figure VQAv2/TextVQA/VizWiz results publish); accuracy counts "
            "a question right when any annotator gave its answer"
        )
    if emulated or report.get("baseline_emulated"):
        notes.append(
            "emulated: predictions from qvl's CPU emulator of the NPU prove the glue and host logic, never NPU "
            "numerics; measure on a real host before trusting an accuracy"
        )
    report["notes"] = notes
    report["gates"] = []
    return report
