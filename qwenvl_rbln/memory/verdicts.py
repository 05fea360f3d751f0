"""The memory gate: a report's verdict, whether a command stops on it, and the one-line reason and fix it prints.

Its own module because compile, its dry run and bucket-plan apply the same gate to a report or its JSON.
"""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.errors import DoesNotFit
from qwenvl_rbln.memory.binding import describe
from qwenvl_rbln.memory.moe import TOO_LARGE_HINT, WEIGHTS_ALONE
from qwenvl_rbln.memory.report import DOES_NOT_FIT, FITS, UNCERTAIN, MemoryReport


def verdict_of(report: MemoryReport | dict[str, Any]) -> str:
    data = report.to_dict() if isinstance(report, MemoryReport) else report
    if data.get("verdict") in (FITS, DOES_NOT_FIT, UNCERTAIN):
        return data["verdict"]
    return {True: FITS, False: DOES_NOT_FIT}.get(data.get("fits"), UNCERTAIN)


def gate_stops(verdict: str | None, uncertain_ok: bool = False) -> bool:
    """The one memory gate every command applies (compile, its dry run, bucket-plan): stop when the planner
    predicts a failure, or cannot tell (``uncertain``) unless ``uncertain_ok``."""
    return verdict == DOES_NOT_FIT or (verdict == UNCERTAIN and not uncertain_ok)


def ensure_fits(report: MemoryReport | dict[str, Any], *, force: bool = False, uncertain_ok: bool = False) -> None:
    """Raise DoesNotFit (exit 4) when the gate stops (``gate_stops``); never with ``force``."""
    data = report.to_dict() if isinstance(report, MemoryReport) else report
    if force or not gate_stops(verdict_of(data), uncertain_ok):
        return
    raise DoesNotFit(gate_message(data), fit_hint(data))


def gate_message(data: dict[str, Any], lead: str = "the memory planner") -> str:
    """The one-line reason a gate stops: which devices do not fit, or which are uncertain and by how much."""
    if verdict_of(data) == DOES_NOT_FIT:
        over = [d for d in data["devices"] if d.get("verdict", "fits" if d.get("fits") else "") == DOES_NOT_FIT]
        where = "; ".join(describe(d, DOES_NOT_FIT) for d in over)
        return f"{lead} predicts this will not fit: {where}"
    unsure = [d for d in data["devices"] if d.get("verdict") == UNCERTAIN]
    where = "; ".join(describe(d, UNCERTAIN) for d in unsure)
    return (
        f"{lead} cannot tell whether this fits (verdict uncertain: {where}; the modelled items' range straddles "
        "that limit); --uncertain-ok accepts it"
    )


def fit_hint(data: dict[str, Any], more_where: str = "in `qvl compile --dry-run`") -> str:
    """The fix for a configuration that does not fit: the planner's first ready --set, or, when no single change
    it tries fits, what is too large and what is left to change."""
    hints = [" ".join(f"--set {x}" for x in sug["set"]) for sug in data.get("suggestions") or []]
    if hints:
        more = f" ({len(hints) - 1} more {more_where})" if len(hints) > 1 else ""
        return f"try {hints[0]}{more}, or pass --force to compile anyway"
    if any(str(n).startswith(WEIGHTS_ALONE) for n in data.get("notes") or []):
        return TOO_LARGE_HINT  # nothing to change: no setting of this model fits (an MoE too large for the card)
    return (
        "no single change the planner tries fits with margin to spare (context, batch, ViT bucket, ViT placement, "
        "memory_budget): see the items per device in `qvl compile --dry-run`, combine changes, or pass "
        "--device-memory if the card really has more; --force compiles anyway"
    )
