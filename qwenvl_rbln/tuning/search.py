"""The search: configurations checked by the memory planner, best first, with why each neighbour lost.

Every configuration is a list of ``--set``s over the base preset, built into a Plan and estimated by
``memory.planner.estimate_plan``: the same code path as ``qvl compile --preset rebel100-1npu --set ... --dry-run``,
so nothing is offered that the dry run would refuse, and no memory arithmetic is repeated here. Only ``fits``
(it fits with every modelled item at its high end) counts.

Not brute force: the ViT buckets and the decoder graphs come from the workload alone (``tuning.workload``); for
each placement and KV partition the largest batch that fits at the needed context is a binary search (memory grows
with the batch), and for each batch offered the longest context that fits is another (memory grows with the
context). A few hundred planner calls in all, about a millisecond each.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from qwenvl_rbln.errors import InputError, QvlError
from qwenvl_rbln.memory.moe import WEIGHTS_ALONE
from qwenvl_rbln.memory.report import FITS
from qwenvl_rbln.tuning.estimate import FULL_BATCH, estimate, score
from qwenvl_rbln.tuning.host_time import HostTimeModel, for_prediction, section
from qwenvl_rbln.tuning.roofline import SAMPLER_ASSUMPTION, Roofline
from qwenvl_rbln.tuning.workload import Work, decoder_graphs

BASE_PRESET = "rebel100-1npu"  # the Model Zoo baseline every configuration is a set of changes to
PARTITIONS = (8192, 4096, 16384)  # optimum-rbln's REBEL default first (the documented one), then its neighbours
BATCH_CAP = 256
TABLE_ROWS = 8
MOE_RANGE = (
    "times are a range: low = custom_moe_glu computes and reads only the routed experts, high = it computes "
    "every expert densely (its interface takes every expert and a dense mask); ranked by the high end unless measured"
)


@dataclass(frozen=True)
class Needs:
    model: str | None
    context: int
    min_batch: int = 1
    devices: int = 1
    objective: str = "throughput"
    max_buckets: int = 3
    device_memory: str | None = None
    concurrency: int | None = None  # requests in flight at once, when known (else half the largest batch)
    slos: tuple[Any, ...] = ()  # latency targets (capacity.Slo): size each candidate's capacity under them
    rate: float | None = None  # requests/s the fleet must carry (needs slos)
    sim_requests: int = 1000  # requests per simulated run
    seed: int = 0  # the simulated runs' draw
    arrivals: tuple[float, ...] | None = None  # a replayed trace of arrival times, else Poisson arrivals


@dataclass(frozen=True)
class Config:
    """One configuration: what the search varies. ``vit`` / ``graphs`` override the workload's choices."""

    split: bool  # the ViT on its own NPU (device 1)
    partition: int
    max_seq_len: int
    batch: int
    memory_budget: float | None = None
    vit: tuple[int, ...] | None = None
    graphs: tuple[int, ...] | None = None


def need_len(context: int, partition: int) -> int:
    """The shortest max_seq_len optimum-rbln accepts that holds ``context``: a multiple of the partition, >= 2x it."""
    return max(-(-context // partition), 2) * partition


def largest(pred: Any, lo: int, hi: int) -> int:
    """The largest x in [lo, hi] with pred(x), for a pred true up to some point and false after; lo - 1 if none."""
    if hi < lo or not pred(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


class Checker:
    """Builds and estimates configurations (memoised): the planner's verdict and the cost model's figures.
    ``host``: (host-time model, measured?), by default ``host_time.for_prediction()``'s: the one source of host time
    for the estimate and the simulated capacity alike."""

    def __init__(
        self, needs: Needs, work: Work, roof: Roofline, base: Any, host: tuple[HostTimeModel, bool] | None = None
    ):
        self.needs, self.work, self.roof, self.base = needs, work, roof, base
        self.host, self.host_measured = host if host is not None else for_prediction()
        self.max_position: int = base.geometry.text.max_position_embeddings
        self._checks: dict[Config, dict[str, Any]] = {}
        self._graphs: dict[int, tuple[list[int], str]] = {}
        self._load: int | None = None
        self.calls = 0

    def light_load(self) -> int | None:
        """The lighter load every candidate is also costed (and, for throughput, ranked) at when there is no batch
        trace: --concurrency, else half the largest batch that fits at the needed context (at least --min-batch).
        One figure for every candidate, so a batch above it buys no throughput and the smaller batch wins."""
        if self.work.trace:
            return None
        if self.needs.concurrency:
            return self.needs.concurrency
        if self._load is None:
            top = max((c.batch for c in largest_batches(self)), default=0)
            self._load = max(self.needs.min_batch, -(-top // 2), 1)
        return self._load

    def cost_notes(self) -> dict[str, Any]:
        """What the figures assume about the load and, for a MoE, the experts: printed by tune, in its --json."""
        load = self.light_load()
        if self.work.trace:
            source, rule = "batch trace", "ranked at the batch trace's running batches"
        else:
            source = "--concurrency" if self.needs.concurrency else "half the largest batch that fits, no --concurrency"
            rank = "throughput" if self.needs.objective == "throughput" else None
            rule = (
                f"{FULL_BATCH}; ranked by throughput at a lighter load of {load} running requests ({source}), so a "
                "batch above it is no faster and the smaller batch wins"
                if rank
                else f"{FULL_BATCH}; latency is ranked there (the slowest TPOT the batch can see)"
            )
        return {
            "load": {
                "assumption": None if self.work.trace else FULL_BATCH,
                "lighter_load": load,
                "lighter_from": source,
                "rule": rule,
            },  # fmt: skip
            "moe_range": MOE_RANGE if self.roof.is_moe else None,
            "host_time": section(self.host, self.host_measured),
            "sampler": SAMPLER_ASSUMPTION,
        }

    def graphs(self, cfg: Config) -> list[int]:
        if cfg.graphs is not None:
            return list(cfg.graphs)
        if cfg.batch not in self._graphs:
            self._graphs[cfg.batch] = decoder_graphs(self.work, cfg.batch, self.needs.max_buckets)
        return self._graphs[cfg.batch][0]

    def graphs_note(self, batch: int) -> str:
        self.graphs(Config(False, 8192, 0, batch))
        return self._graphs[batch][1]

    def vit(self, cfg: Config) -> list[int]:
        return list(cfg.vit) if cfg.vit is not None else list(self.work.vit_buckets)

    def sets(self, cfg: Config) -> list[str]:
        """The configuration as --sets over the base preset (also what the tuned preset writes)."""
        out = [
            "visual.max_seq_len=[" + ",".join(map(str, self.vit(cfg))) + "]",
            f"kvcache_partition_len={cfg.partition}",
            f"max_seq_len={cfg.max_seq_len}",
            f"batch_size={cfg.batch}",
            "decoder_batch_sizes=[" + ",".join(map(str, self.graphs(cfg))) + "]",
        ]
        if cfg.split:
            out.append("placement.visual_device=1")
        if cfg.memory_budget is not None:
            out.append(f"memory_budget={cfg.memory_budget:.2f}")
        return out

    def check(self, cfg: Config, *, suggest: bool = False) -> dict[str, Any]:
        """{verdict, reason, margin_low_bytes, kv_blocks, full_blocks}; ``suggest`` adds the planner's fixes."""
        if cfg in self._checks and not suggest:
            return self._checks[cfg]
        from qwenvl_rbln.memory.planner import estimate_plan
        from qwenvl_rbln.planning.plan import build_plan

        self.calls += 1
        try:
            plan = build_plan(BASE_PRESET, self.sets(cfg), model=self.needs.model)
            report = estimate_plan(plan, self.needs.device_memory, suggest=suggest).to_dict()
        except QvlError as exc:
            out = {"verdict": "invalid", "reason": exc.one_line(), "margin_low_bytes": None}
            self._checks[cfg] = out
            return out
        out = {
            "verdict": report["verdict"],
            "reason": None if report["verdict"] == FITS else _why_not(report),
            "margin_low_bytes": report.get("margin_low_bytes"),
            **binding_margin(report),
            "kv_blocks": report["kv"].get("num_blocks"),
            "full_blocks": plan.resolved.num_full_blocks,
            "kv_full": (report["kv"].get("num_blocks") or 0) >= plan.resolved.num_full_blocks,
            # the planner's note when the LM weights alone exceed the card: no configuration of this model fits
            "too_large": next((str(n) for n in report.get("notes") or [] if str(n).startswith(WEIGHTS_ALONE)), None),
            "devices": [
                {"device": d["device"], "verdict": d["verdict"], "total_high_bytes": d.get("total_high_bytes")}
                for d in report["devices"]
            ],
        }
        if suggest:
            out = {**out, "suggestions": report.get("suggestions") or []}
        else:
            self._checks[cfg] = out
        return out

    def fits(self, cfg: Config) -> bool:
        """The planner says fits, and (without a memory_budget, which trades blocks on purpose) automatic KV sizing
        gives every row its full context: a pool of fewer blocks "fits" but cannot serve the batch at the context."""
        chk = self.check(cfg)
        return chk["verdict"] == FITS and (chk.get("kv_full", False) or cfg.memory_budget is not None)

    def why_not(self, cfg: Config) -> str | None:
        """Why a configuration does not count: the planner's reason, or the KV pool it would get."""
        chk = self.check(cfg)
        if chk["verdict"] != FITS:
            return f"{chk['verdict'].replace('_', ' ')}: {chk['reason']}"
        if not self.fits(cfg):
            per_row = cfg.max_seq_len // cfg.partition
            return (
                f"KV pool too small: automatic KV sizing fits only {chk['kv_blocks']} of {chk['full_blocks']} full "
                f"blocks, so {chk['kv_blocks'] // per_row} of {cfg.batch} rows can hold the full context at once"
            )
        return None

    def longest(self, cfg: Config, lo: int | None = None) -> int:
        """The longest max_seq_len (a multiple of the partition) that fits with everything else as in ``cfg``."""
        p = cfg.partition
        top = self.max_position // p
        start = (lo or 2 * p) // p
        k = largest(lambda k: self.fits(replace(cfg, max_seq_len=k * p)), start, top)
        return k * p if k >= start else 0

    def figures(self, cfg: Config) -> dict[str, Any]:
        return estimate(
            self.work,
            self.roof,
            batch=cfg.batch,
            graphs=self.graphs(cfg),
            vit_buckets=self.vit(cfg),
            block=cfg.partition,
            shared=not cfg.split,
            host=self.host,
            load=self.light_load(),
        )

    def describe(self, cfg: Config, **extra: Any) -> dict[str, Any]:
        """A configuration as the table and --json show it."""
        chk = self.check(cfg)
        ok = self.fits(cfg)
        est = self.figures(cfg) if ok else None
        return {
            "placement": {"device": 0, "visual_device": 1 if cfg.split else 0},
            "npus": 2 if cfg.split else 1,
            "vit_buckets": self.vit(cfg),
            "kvcache_partition_len": cfg.partition,
            "max_seq_len": cfg.max_seq_len,
            "batch_size": cfg.batch,
            "decoder_batch_sizes": self.graphs(cfg),
            "memory_budget": cfg.memory_budget,
            "set": self.sets(cfg),
            "verdict": chk["verdict"],
            "counts": ok,
            "reason": self.why_not(cfg),
            "margin_low_bytes": chk.get("margin_low_bytes"),
            "margin_chiplet_bytes": chk.get("margin_chiplet_bytes"),
            "margin_binding_bytes": chk.get("margin_binding_bytes"),
            "margin_binds": chk.get("margin_binds"),
            "kv_blocks": chk.get("kv_blocks"),
            "full_kv_blocks": chk.get("full_blocks"),
            "estimate": est,
            "score": score(est, self.needs.objective) if est else None,
            **extra,
        }


def binding_margin(report: dict[str, Any]) -> dict[str, Any]:
    """The margin that binds: the card's (usable less the high end of its total) or its fullest chiplet's (a
    chiplet's share less its high-end load), whichever is smaller, over every device. A card with 30 GiB free can
    have a chiplet at its limit (a KV tensor or a ViT workspace is placed whole): that chiplet is what fails."""
    card = report.get("margin_low_bytes")
    chips = []
    for dev in report.get("devices") or []:
        c = dev.get("chiplets")
        if c:
            chips.append(c["usable_per_chiplet_bytes"] - c.get("fullest_high_bytes", c["fullest_bytes"]))
    chip = min(chips) if chips else None
    known = [x for x in (card, chip) if x is not None]
    if not known:
        return {"margin_chiplet_bytes": None, "margin_binding_bytes": None, "margin_binds": None}
    binds = "chiplet" if chip is not None and (card is None or chip < card) else "card"
    return {"margin_chiplet_bytes": chip, "margin_binding_bytes": min(known), "margin_binds": binds}


def _why_not(report: dict[str, Any]) -> str:
    from qwenvl_rbln.memory.verdicts import gate_message

    return gate_message(report)


def partitions_for(needs: Needs, max_position: int) -> list[int]:
    """The KV partitions that can hold the context within the model's positions (shortest round-up first kept)."""
    return [p for p in PARTITIONS if need_len(needs.context, p) <= max_position]


def batch_choices(min_batch: int, bmax: int, trace: dict[int, int] | None, load: int | None = None) -> list[int]:
    """The batches offered between the need and the most that fits: both ends, the powers of two between, the
    trace's largest running batch, the lighter load (the smallest batch that carries it: no climb down to it)."""
    out = {min_batch, bmax, *([load] if load else [])}
    p = 1
    while p < bmax:
        if p >= min_batch:
            out.add(p)
        p *= 2
    if trace and min_batch <= max(trace) <= bmax:
        out.add(max(trace))
    return sorted(b for b in out if min_batch <= b <= bmax)


def check_needs(needs: Needs, max_position: int, has_trace: bool = False) -> None:
    if needs.context < 1:
        raise InputError(f"--context {needs.context} is not a length", "give the longest request in tokens, e.g. 32768")
    if needs.context > max_position or not partitions_for(needs, max_position):
        raise InputError(
            f"--context {needs.context} is above the model's max_position_embeddings ({max_position})",
            f"the longest context this model serves is {max_position}: use --context {max_position} or less",
        )
    if needs.min_batch < 1 or needs.min_batch > BATCH_CAP:
        raise InputError(f"--min-batch {needs.min_batch} is outside 1..{BATCH_CAP}", "e.g. --min-batch 4")
    if needs.devices not in (1, 2):
        raise InputError(f"--devices {needs.devices}: qvl places the LM and the ViT on 1 or 2 NPUs", "use 1 or 2")
    if needs.objective not in ("throughput", "latency"):
        raise InputError(f"--objective {needs.objective!r} is not throughput or latency", "use one of them")
    if needs.max_buckets < 1:
        raise InputError(f"--max-buckets {needs.max_buckets} must be at least 1", "e.g. --max-buckets 3")
    if needs.concurrency is not None and not 1 <= needs.concurrency <= BATCH_CAP:
        raise InputError(f"--concurrency {needs.concurrency} is outside 1..{BATCH_CAP}", "e.g. --concurrency 8")
    from qwenvl_rbln.tuning.capacity import check_rate

    check_rate(needs.rate, list(needs.slos))
    if not 20 <= needs.sim_requests <= 100_000:
        raise InputError(f"--sim-requests {needs.sim_requests} is outside 20..100000", "e.g. --sim-requests 1000")
    if needs.concurrency is not None and has_trace:
        raise InputError(
            "--concurrency and --batch-trace both describe the load",
            "give one: the trace when you have one (it is the measured load), else --concurrency",
        )


def largest_batches(checker: Checker) -> list[Config]:
    """Per placement (the NPUs the needs allow, fewest first) and KV partition: the configuration at the needed
    context with the largest batch that fits (batch 0: none fits; BATCH_CAP: the search's bound)."""
    needs = checker.needs
    out = []
    for split in (False, True)[: needs.devices]:
        for p in partitions_for(needs, checker.max_position):
            length = need_len(needs.context, p)
            bmax = largest(lambda b, s=split, p=p, n=length: checker.fits(Config(s, p, n, b)), 1, BATCH_CAP)
            out.append(Config(split, p, length, bmax))
    return out
