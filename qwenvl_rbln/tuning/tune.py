"""``qvl tune`` as data: read the workload once, search, rank, explain, and hand over the tuned preset.

``run_tune`` returns ``(document, error)``: the document is what ``--json`` prints (and what a plot reads:
``candidates`` and ``neighbours`` are plain rows with their estimate); ``error`` is the ``DoesNotFit`` to raise
after printing it when no configuration meets the needs (exit 4).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import DoesNotFit
from qwenvl_rbln.tuning.fleet import size_candidates
from qwenvl_rbln.tuning.measured_roofline import KINDS, ROOFLINE, SCALED, MeasuredRoofline, kind_of, row_timing
from qwenvl_rbln.tuning.neighbours import nearest, neighbours
from qwenvl_rbln.tuning.result import HEADER, commands, output_dir_for, preset_data, preset_yaml
from qwenvl_rbln.tuning.roofline import LABEL
from qwenvl_rbln.tuning.search import (
    BASE_PRESET,
    BATCH_CAP,
    TABLE_ROWS,
    Checker,
    Config,
    Needs,
    batch_choices,
    check_needs,
    largest_batches,
    need_len,
    partitions_for,
)
from qwenvl_rbln.tuning.workload import check_context, read_work


def _setup(needs: Needs, workload: Path, trace: Path | None, prompt_tokens: int, output_tokens: int) -> Checker:
    from qwenvl_rbln.memory.calibration import model_key
    from qwenvl_rbln.planning.catalogue.devices import compute_spec
    from qwenvl_rbln.planning.catalogue.modelinfo import load_geometry
    from qwenvl_rbln.planning.plan import build_plan
    from qwenvl_rbln.planning.presets import load_preset
    from qwenvl_rbln.tuning.measured import load_measured

    model = needs.model or load_preset(BASE_PRESET).data["model"]
    max_position = load_geometry(model, "--model")[0].text.max_position_embeddings
    check_needs(needs, max_position, has_trace=trace is not None)
    if needs.device_memory is not None:  # a bad --device-memory is the user's error, not a configuration's
        from qwenvl_rbln.memory.report import parse_device_memory
        from qwenvl_rbln.planning.catalogue.devices import npu_spec

        parse_device_memory(needs.device_memory, npu_spec(load_preset(BASE_PRESET).data["npu"]))
    # the base plan at a context the model has (the base preset's 262144 is above a small model's positions)
    p = partitions_for(needs, max_position)[0]
    base = build_plan(BASE_PRESET, [f"kvcache_partition_len={p}", f"max_seq_len={need_len(needs.context, p)}"],
                      model=needs.model)  # fmt: skip
    work = read_work(base, workload, needs.max_buckets, trace, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
    check_context(work, needs.context, max_position)
    roof = MeasuredRoofline(
        base.geometry,
        compute_spec(base.npu),
        chunk=base.resolved.prefill_chunk_size,
        measured=load_measured(model_key(base.geometry), base.npu),  # real NPU entries only, never emulated
        scale_unmeasured=True,  # rank every row on one footing (measured_roofline)
    )
    return Checker(needs, work, roof, base)


def _search(checker: Checker) -> tuple[list[tuple[Config, dict[str, Any]]], list[dict[str, Any]]]:
    """Every configuration that meets the needs and fits (described), and the frontier per placement/partition."""
    found: list[tuple[Config, dict[str, Any]]] = []
    frontier = []
    for top in largest_batches(checker):
        split, p, length, bmax = top.split, top.partition, top.max_seq_len, top.batch
        frontier.append(
            {
                "vit_on_own_npu": split,
                "kvcache_partition_len": p,
                "max_seq_len": length,
                "largest_batch": bmax,
                "batch_cap_reached": bmax == BATCH_CAP,  # the search stops at BATCH_CAP: at least this many
            }
        )
        for b in batch_choices(checker.needs.min_batch, bmax, checker.work.trace, checker.light_load()):
            cfg = Config(split, p, length, b)
            row = checker.describe(cfg, longest_max_seq_len_that_fits=checker.longest(cfg, length))
            found.append((cfg, row))
    return found, frontier


def _table(found: list[tuple[Config, dict[str, Any]]]) -> list[tuple[Config, dict[str, Any]]]:
    """The best rows, one per placement and batch (its best partition): the table shows choices, not repeats."""
    seen: set[tuple[bool, int]] = set()
    rows = []
    for cfg, row in found:
        if (cfg.split, cfg.batch) not in seen:
            seen.add((cfg.split, cfg.batch))
            rows.append((cfg, row))
    return rows[:TABLE_ROWS]


def _rank_key(item: tuple[Config, dict[str, Any]]) -> tuple:
    cfg, row = item
    # the objective, then fewer NPUs, the documented partition, the smaller batch, the larger binding margin
    return (round(row["score"], 12), cfg.split, cfg.partition != 8192, cfg.batch, -(row["margin_binding_bytes"] or 0))


def _climb(checker: Checker, found: list[tuple[Config, dict[str, Any]]]) -> None:
    """From #1, step to a better neighbour (batch +-1, the other partitions, the other placement) while one meets
    every need, fits and ranks higher. The batches searched are samples (the ends, powers of two, the trace's top),
    and a cost need not be monotone between them: a MoE's decode step reads more experts with every row."""
    needs, seen = checker.needs, {c for c, _ in found}
    while found:
        cfg = found[0][0]
        moves = [replace(cfg, batch=cfg.batch + d) for d in (-1, 1) if needs.min_batch <= cfg.batch + d <= BATCH_CAP]
        moves += [
            replace(cfg, partition=q, max_seq_len=need_len(needs.context, q))
            for q in partitions_for(needs, checker.max_position)
            if q != cfg.partition
        ]
        if needs.devices == 2:
            moves.append(replace(cfg, split=not cfg.split))
        better = []
        for m in moves:
            if m in seen or not checker.fits(m):
                continue
            seen.add(m)
            row = checker.describe(m, longest_max_seq_len_that_fits=checker.longest(m, m.max_seq_len))
            if _rank_key((m, row)) < _rank_key(found[0]):
                better.append((m, row))
        if not better:
            return
        found.extend(better)
        found.sort(key=_rank_key)


def run_tune(
    needs: Needs,
    workload: Path,
    trace: Path | None = None,
    *,
    prompt_tokens: int = 128,
    output_tokens: int = 256,
    output: Path | None = None,
) -> tuple[dict[str, Any], DoesNotFit | None]:
    start = time.perf_counter()
    checker = _setup(needs, workload, trace, prompt_tokens, output_tokens)
    found, frontier = _search(checker)
    found = [(c, r) for c, r in found if r["counts"]]
    found.sort(key=_rank_key)
    _climb(checker, found)
    table, sizing, slo_error = _table(found), None, None
    if (needs.slos or needs.rate is not None) and table:  # --slo ranks by capacity (NPUs for --rate): #1 handed over
        table, sizing, slo_error = size_candidates(checker, table)
        first = table[0]
        found = [first, *(x for x in found if x is not first)]
    doc: dict[str, Any] = {
        "needs": {
            "model": checker.base.model_id,
            "context": needs.context,
            "min_batch": needs.min_batch,
            "devices": needs.devices,
            "objective": needs.objective,
            "max_buckets": needs.max_buckets,
            "device_memory": needs.device_memory,
            "concurrency": needs.concurrency,
            "slo": [t.text() for t in needs.slos] or None,
            "rate_rps": needs.rate,
        },
        "base_preset": BASE_PRESET,
        "workload": checker.work.to_dict(),
        "cost_model": {
            "label": LABEL,
            "npu": checker.roof.compute.to_dict(),
            "measured_graphs": sorted(checker.roof.used_measured),
            "note": "peak figures: real calls are slower; `qvl profile DIR` on the NPU host records measured timings "
            "in $QVL_HOME/timings.json (docs/profiling.md), which replace the roofline graph by graph",
            **checker.cost_notes(),
        },
        "frontier": frontier,
        "candidates": [row for _, row in table],
        "searched": 0,
    }
    if sizing is not None:
        doc["capacity"] = sizing
    error = None
    if found:
        best_cfg, best = found[0]
        doc["best"] = best
        best["timing"] = row_timing(best, checker.roof)
        doc["decoder_graphs_from"] = checker.graphs_note(best_cfg.batch)
        doc["neighbours"] = neighbours(checker, best_cfg, best)
        doc.update(_hand_over(checker, best_cfg, best, output))
    else:
        doc["nearest"] = nearest(checker)
        error = _unmet(checker, doc["nearest"])
    error = error or slo_error
    doc["cost_model"].update(_timing_sources(checker, doc))
    doc["searched"] = checker.calls
    doc["search_s"] = round(time.perf_counter() - start, 3)
    return doc, error


def _timing_sources(checker: Checker, doc: dict[str, Any]) -> dict[str, Any]:
    """Label every row with where its figures came from (measured, fitted, roofline bound), and say which rows
    rest on estimates: a measured row is slower than a bound, so a bound row ranked above it may not be faster."""
    roof = checker.roof
    rows = [*doc["candidates"], *([doc["best"]] if "best" in doc else []), *doc.get("neighbours", []),
            *doc.get("nearest", [])]  # fmt: skip
    for row in rows:
        if isinstance(row, dict) and row.get("estimate") and "kvcache_partition_len" in row:
            row["timing"] = row_timing(row, roof)
    on_estimates = sum(1 for r in doc["candidates"] if (r.get("timing") or {}).get("rests_on_estimates", True))
    extrapolated = sum(1 for r in doc["candidates"] if (r.get("timing") or {}).get("extrapolated"))
    scales = roof.scales()  # once: _ranked_by prints the same factors
    label = (
        LABEL
        if not roof.used_measured
        else f"roofline bound except {len(roof.used_measured)} measured graphs (see figures)"
    )
    return {
        "label": label,
        "measured_graphs": sorted(roof.used_measured),
        "sources": dict(sorted(roof.sources.items())),
        "rows_on_estimates": on_estimates,
        "rows_extrapolated": extrapolated,
        "scaled_by": scales,
        "ranked_by": _ranked_by(roof, scales),
    }


def _ranked_by(roof: MeasuredRoofline, scales: dict[str, float]) -> str:
    """The footing every row is ranked on, in one line (the table prints it under itself)."""
    if not roof.used_measured:
        return "the roofline bound in every row (no measured timings for this model and NPU)"
    scaled = ", ".join(f"{kind} x{factor:.2f}" for kind, factor in scales.items())
    bare = sorted({KINDS[p[0]] for key, s in roof.sources.items() if s == ROOFLINE and (p := kind_of(key))})
    text = "one footing: measured figures where timings.json has them"
    if scaled and any(s.startswith(SCALED) for s in roof.sources.values()):
        text += f"; the other graphs of a measured kind at their bound times its measured/bound ratio ({scaled})"
    if bare:
        text += f"; {', '.join(bare)}: nothing measured, the roofline bound in every row"
    return text


def _description(checker: Checker, best: dict[str, Any]) -> str:
    needs, work, est = checker.needs, checker.work, best["estimate"]
    trace = f", batch trace {work.trace_path}" if work.trace_path else ""
    origin = (best.get("timing") or {}).get("label", LABEL)
    origin = LABEL if origin == ROOFLINE else origin
    host = "measured" if checker.host_measured else "this machine's default"
    return (
        f"qvl tune: {checker.base.model_id} for {work.path} ({work.requests:,} requests{trace}); "
        f"needs context {needs.context}, batch >= {needs.min_batch}, {needs.devices} NPU(s), objective "
        f"{needs.objective}; estimate ({origin}): {est['output_tokens_per_s']:.0f} output tokens/s, TTFT "
        f"{est['ttft_s'] * 1000:.1f} ms, TPOT {est['tpot_s'] * 1000:.2f} ms{_moe_span(est)} (host time: {host}; "
        f"sampler assumed){_capacity_text(checker, best)}"
    )


def _capacity_text(checker: Checker, best: dict[str, Any]) -> str:
    """#1's simulated capacity under the targets (and its fleet for --rate), for the preset's description."""
    cap = best.get("capacity")
    if not cap or not cap.get("capacity_rps"):
        return ""
    targets = ",".join(t.text() for t in checker.needs.slos)
    text = f"; simulated capacity {cap['capacity_rps']:.2f} req/s per replica under {targets}"
    if cap.get("npu_busy_share") is not None:  # the host's share: what its time leaves of the card
        text += f" (NPU busy {cap['npu_busy_share']:.0%} there, host time {cap.get('host_time', 'default')})"
    if cap.get("replicas"):
        text += f"; {cap['replicas']} replica(s), {cap['npus']} NPU(s), for {checker.needs.rate:g} req/s"
    return text


def _moe_span(est: dict[str, Any]) -> str:
    """A MoE's TPOT as its range (routed experts to every expert): the headline above is the high end."""
    span = (est.get("moe_range") or {}).get("tpot_s")
    return f" (MoE range {span['low'] * 1000:.2f}-{span['high'] * 1000:.2f} ms, ranked by the high end)" if span else ""


def _hand_over(checker: Checker, cfg: Config, best: dict[str, Any], output: Path | None) -> dict[str, Any]:
    """The tuned preset (checked again as the file it is), and the commands."""
    from qwenvl_rbln.memory.planner import estimate_plan
    from qwenvl_rbln.planning.plan import plan_from_loaded
    from qwenvl_rbln.planning.presets import LoadedPreset

    description = _description(checker, best)
    data = preset_data(BASE_PRESET, checker.sets(cfg), description, output_dir_for(output), checker.needs.model)
    loaded = LoadedPreset(name="tuned", path=output or Path("tuned.yaml"), data=data)
    plan = plan_from_loaded(loaded, model=checker.needs.model)
    verdict = estimate_plan(plan, checker.needs.device_memory, suggest=False).verdict
    label = (best.get("timing") or {}).get("label", ROOFLINE)
    header = [
        f"{HEADER} Every figure in the description is a roofline bound from published peak figures,",
        "not a measurement. Check it: qvl compile --preset THIS_FILE --dry-run",
    ]
    if label != ROOFLINE:
        header[0] = f"{HEADER} The figures in the description are {label} (qvl profile, docs/profiling.md)."
        header[1] = "Check it: qvl compile --preset THIS_FILE --dry-run"
    ref = str(output) if output is not None else "tuned.yaml"
    cmds = commands(ref, data, plan)
    replicas = (best.get("capacity") or {}).get("replicas")
    if replicas:  # --rate: the fleet that carries it, as qvl deploy writes it
        cmds["replicas"] = replicas
        out_dir = data["output_dir"]  # CLAIM and IMAGE are the user's: where the pods find it, the serving image
        cmds["deploy"] = (
            f"qvl deploy {out_dir} --replicas {replicas} --artifact pvc:CLAIM --image IMAGE --out {out_dir}-deploy"
        )
    return {
        "preset": data,
        "preset_yaml": preset_yaml(data, header),
        "preset_verdict": verdict,
        "preset_path": str(output) if output is not None else None,
        "preset_replaced": False,  # the command sets it once -o has replaced a preset tune wrote before
        "commands": cmds,
    }


_NEED_KEYS = ("max_seq_len", "batch_size", "memory_budget")
TOO_LARGE = (
    "no rbln_config change fits this model on one Rebel100 with optimum-rbln 0.12; tune Qwen3-VL-30B-A3B instead "
    "(--model Qwen/Qwen3-VL-30B-A3B-Instruct)"
)


def _unmet(checker: Checker, near: list[dict[str, Any]]) -> DoesNotFit:
    needs = checker.needs
    where = f"{needs.devices} NPU{'s' if needs.devices > 1 else ''}"
    lead = (
        f"no configuration meets the needs (context {needs.context}, batch >= {needs.min_batch}, {where}) with a "
        "memory verdict of fits"
    )
    if not near:
        p = partitions_for(needs, checker.max_position)[0]
        too_large = checker.check(Config(False, p, need_len(needs.context, p), 1)).get("too_large")
        if too_large:  # no context, batch or placement helps: say what the planner says, and what would
            return DoesNotFit(f"{lead}: {too_large}", TOO_LARGE)
        # nearest tried batch 1 at every shorter context, and the ViT on a second NPU: neither helps, so say why
        shortest = Config(False, p, 2 * p, 1)
        return DoesNotFit(
            f"{lead}, nor does batch 1 at the shortest context ({2 * p}) or with the ViT on a second NPU, nor smaller "
            f"images (a lower largest ViT bucket): {checker.why_not(shortest)}",
            "more usable device memory (--device-memory), or a smaller model (--model)",
        )
    options = "; ".join(_near_text(row) for row in near)
    return DoesNotFit(f"{lead}; nearest: {options}", "relax the need each one gives up (see `nearest` in --json)")


def _near_text(row: dict[str, Any]) -> str:
    keys = _NEED_KEYS if row["kvcache_partition_len"] == 8192 else ("kvcache_partition_len", *_NEED_KEYS)
    if row.get("images_max_pixels"):  # the smaller-images trade: its buckets are the change
        keys = ("visual.max_seq_len", *keys)
    sets = " ".join("--set " + s for s in row["set"] if s.startswith(keys))
    where = " (ViT on device 1)" if row["npus"] == 2 else ""
    return f"{sets}{where} gives up {', '.join(row['gives_up'])}"
