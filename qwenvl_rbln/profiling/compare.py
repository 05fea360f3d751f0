"""Measured against estimated: each profiled point beside the roofline bound for the same graph and context, the
ratio, and the ``--check TOL`` verdict (a graph fails when any of its points is off by more than TOL either way).

The roofline is asked only through its public methods (``vit_call``, ``prefill_chunk``, ``decode_step``), so
this stays right while the cost model's internals change.
"""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.profiling.graphs import Graph, Shapes


def roofline_seconds(roof: Any, graph: Graph, shapes: Shapes, context: int | None) -> float:
    """The bound for one call of ``graph`` at ``context`` (every row of a decoder batch at that context)."""
    if graph.kind == "vit":
        return roof.vit_call(graph.size)
    if graph.kind == "prefill":
        return roof.prefill_chunk(int(context or 0), shapes.block)
    return roof.decode_step(graph.size, graph.size, float(context or 0), shapes.block)


def compare(graphs: list[dict[str, Any]], tol: float | None) -> dict[str, Any]:
    """Add ``ratio`` (measured / roofline) per point and per graph (worst point), and the check's verdict."""
    failing = []
    for g in graphs:
        ratios = []
        for p in g["points"]:
            p["ratio"] = p["median_s"] / p["roofline_s"] if p["roofline_s"] > 0 else float("inf")
            ratios.append(p["ratio"])
        g["ratio_range"] = [min(ratios), max(ratios)]
        worst = max(ratios, key=lambda r: abs(r - 1))
        g["worst_ratio"] = worst
        g["within_tol"] = None if tol is None else abs(worst - 1) <= tol
        if g["within_tol"] is False:
            failing.append(g["key"])
    return {"tolerance": tol, "failing": failing, "ok": not failing if tol is not None else None}
