"""A serving simulator of vllm-rbln 0.11.1a1's optimum scheduler: what one replica does with a stream of requests.

Pure Python (no vLLM at run time), discrete steps, each as long as the device-time model (``tuning.device_time``)
says its graph calls take. Followed from the source (``vllm_rbln/v1/core/optimum_scheduler.py``,
``optimum_kv_cache_manager.py``, ``utils/optimum/converter/from_optimum.py``, ``utils/optimum/bucket.py``):

- one engine step is either ONE request's prefill or one decode of every running request, never both: the
  scheduler first takes the head of the waiting queue (FCFS) when fewer than ``max_num_seqs`` (= the compiled
  ``batch_size``) run, schedules its whole prompt (``max_num_batched_tokens = max(max_model_len, max_num_seqs)``,
  so one step) and stops (``req_index > 0: break``); only a step with no prefill decodes (``if req_index == 0``);
- a prefill runs the request's ViT calls (packed into its bucket, ``vision.packing``) and then
  ceil(tokens / prefill_chunk_size) prefill chunk calls; it yields the request's first token;
- every step also runs the sampler (vllm-rbln's compiled sampler, ``VLLM_RBLN_SAMPLER`` on by default: one NPU
  call per step, ``optimum_model_runner.sample_tokens``) on one row of logits for a prefill and for a lone decode
  row, else on the rows padded to its bucket (``prepare_rbln_sampler``: the decoder graphs when there are several,
  else ``get_bucket_sizes(max_num_seqs)``); its time is ``DeviceTimeModel.sampler``;
- every step also costs host time (``tuning.host_time.HostTimeModel``: vLLM's scheduler, vllm-rbln's input
  preparation and output processing), during which the NPU is idle: ``host.prefill(tokens, ViT calls)`` or
  ``host.decode(rows)``, plus ``Engine.step_overhead_s`` (a run's own measured gap, for the fidelity check);
- KV admission: a request needs ceil(min(tokens, max_model_len) / block_size) blocks (tokens = prompt + tokens
  generated so far); a waiting head that cannot get them stays waiting (``new_blocks is None: break``) and the
  step decodes instead; a decode that needs a new block when none is free preempts the LAST running request
  (``self.running.pop()``: freed, put back at the head of the waiting queue, recomputed later with its generated
  tokens as prompt, ViT again). The ViT is charged again because under ``qvl serve`` it runs again: qvl's vLLM
  plugin gives a resumed multimodal request its pixels and grid again. vllm-rbln alone passes multimodal inputs
  only for new requests (``_extract_mm_kwargs`` reads ``scheduled_new_reqs``), so without the plugin a resumed
  request runs no ViT and prefills its image placeholders as text (a wrong answer, faster);
- the pool: ``kvcache_num_blocks`` usable blocks when they hold every row at the full context, one fewer when not
  (vLLM's null block, ``update_num_blocks`` / ``RBLNBlockPool``);
- a decode step of n requests runs the smallest compiled decoder graph >= n (``select_bucket_size``: bisect over
  ``decoder_batch_sizes``). What a row of it costs is the hardware's secret: ``context_end`` picks the end.
  ``OWN`` charges each row its own context (the lower end, a true roofline bound); ``LONGEST`` charges every row
  the longest row's (the upper end, as if the graph attended every row over the batch's longest partitions).

Per request it records arrival, first-token time and finish, and over the run the device and host seconds (the
NPU busy share: device time / wall time); ``tuning.capacity`` turns those into TTFT, TPOT and latency
percentiles as ``vllm bench serve`` computes them.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.tuning.artifact_config import read_rbln_config
from qwenvl_rbln.tuning.device_time import DeviceTimeModel
from qwenvl_rbln.tuning.host_time import HOST_FREE, HostTimeModel

OWN, LONGEST = "own", "longest"
CONTEXT_ENDS = {
    OWN: "each decode row at its own context (the lower end: the roofline's bound)",
    LONGEST: "every decode row at the longest row's context (the upper end: the batch's longest partitions for "
    "every row)",
}


@dataclass(frozen=True)
class Engine:
    """The compiled artifact's facts the scheduler sees."""

    batch: int  # batch_size = max_num_seqs
    chunk: int  # prefill_chunk_size
    block_size: int  # kvcache_block_size (= kvcache_partition_len under flash attention)
    num_blocks: int  # kvcache_num_blocks
    max_model_len: int  # max_seq_len
    graphs: tuple[int, ...] = ()  # decoder_batch_sizes; empty: one graph at the batch
    step_overhead_s: float = 0.0  # host seconds per step on top of the host-time model (a run's measured gap)

    def decoder_graphs(self) -> tuple[int, ...]:
        return tuple(sorted(self.graphs)) if self.graphs else (self.batch,)

    def sampler_rows(self, n: int) -> int:
        return sampler_rows(n, self.decoder_graphs(), self.batch)

    def usable_blocks(self) -> int:
        full = self.num_blocks >= self.batch * math.ceil(self.max_model_len / self.block_size)
        return self.num_blocks if full else self.num_blocks - 1

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(min(tokens, self.max_model_len) / self.block_size)


def sampler_rows(n: int, graphs: Sequence[int], batch: int) -> int:
    """Rows of logits the sampler runs on for n decode rows: vllm-rbln pads them (not one row) to its bucket,
    the decoder graphs when there are several (``use_multiple_decoder``), else ``get_bucket_sizes``. Shared with
    the analytic estimate (``tuning.estimate``), so both charge the same sampler call."""
    if n <= 1:
        return 1
    buckets = sorted(graphs) if len(graphs) > 1 else sampler_buckets(batch)
    return buckets[min(bisect.bisect_left(buckets, n), len(buckets) - 1)]


def sampler_buckets(max_num_seqs: int) -> list[int]:
    """vllm-rbln 0.11.1a1's ``RBLNOptimumModelRunner.get_bucket_sizes``, line for line (sorted)."""
    bucket_sizes = [i for i in [1, 2, 4] if i <= max_num_seqs]
    if max_num_seqs >= 8:
        bucket_sizes += list(range(8, min(max_num_seqs + 1, 256), 8))
    if max_num_seqs >= 256:
        bucket_sizes += list(range(256, max_num_seqs + 1, 16))
    if max_num_seqs not in bucket_sizes:
        bucket_sizes.append(max_num_seqs)
    return sorted(bucket_sizes)


@dataclass(frozen=True)
class Request:
    """One request: when it arrives, its LM input tokens (media + text), the tokens it generates, and the buckets
    of its ViT calls (one entry per call)."""

    arrival: float
    prompt: int
    output: int
    vit: tuple[int, ...] = ()


@dataclass
class Record:
    """What happened to one request (times in seconds from the start)."""

    request: Request
    first_token: float = math.nan
    finish: float = math.nan
    generated: int = 0
    preemptions: int = 0
    blocks: int = field(default=0, repr=False)

    @property
    def ttft(self) -> float:
        return self.first_token - self.request.arrival

    @property
    def latency(self) -> float:
        return self.finish - self.request.arrival

    @property
    def tpot(self) -> float | None:
        """(latency - TTFT) / (output - 1), as ``vllm bench serve``; None for a single-token output."""
        n = self.request.output
        return (self.latency - self.ttft) / (n - 1) if n > 1 else None


@dataclass
class Trace:
    """The simulation's result: a record per request, the steps it ran (kind, start, seconds, rows), when the last
    one ended, and the seconds the NPU was busy (graph and sampler calls) and the host alone."""

    records: list[Record]
    steps: list[tuple[str, float, float, int]] = field(default_factory=list)
    end: float = 0.0
    device_s: float = 0.0
    host_s: float = 0.0

    @property
    def npu_busy_share(self) -> float:
        """Device time / wall time from 0 (the benchmark's start) to the last step's end."""
        return self.device_s / self.end if self.end > 0 else 0.0


class StepCosts:
    """(step, device, host seconds) of each kind of step, for one engine, device-time model, host-time model and
    context end; memoised, and shared by every run of a capacity search (the same steps recur at every rate)."""

    def __init__(self, engine: Engine, model: DeviceTimeModel, host: HostTimeModel = HOST_FREE, end: str = LONGEST):
        if end not in CONTEXT_ENDS:
            raise InputError(f"context end {end!r} is not one of {', '.join(CONTEXT_ENDS)}", "own or longest")
        self.e, self.m, self.host, self.end, self.own = engine, model, host, end, end == OWN
        self.graphs = engine.decoder_graphs()
        self.prefills: dict[tuple[int, tuple[int, ...]], tuple[float, float, float]] = {}
        self.decodes: dict[tuple[int, int], tuple[float, float, float]] = {}

    def prefill(self, tokens: int, vit: tuple[int, ...]) -> tuple[float, float, float]:
        """A prefill step: its ViT calls, its chunks and a sampler call on one row; host time by tokens and calls."""
        key = (tokens, vit)
        if key not in self.prefills:
            device = sum(self.m.vit(b) for b in vit) + self.m.prompt(tokens, self.e.chunk) + self.m.sampler(1)
            host = self.host.prefill(tokens, len(vit)) + self.e.step_overhead_s
            self.prefills[key] = (device + host, device, host)
        return self.prefills[key]

    def decode(self, n: int, context: int) -> tuple[float, float, float]:
        """A decode step of n rows; ``context``: the rows' total context (``OWN``) or the longest row's
        (``LONGEST``). The graph, the sampler on its padded rows, host time by rows."""
        found = self.decodes.get((n, context))
        if found is None:
            graph = self.graphs[min(bisect.bisect_left(self.graphs, n), len(self.graphs) - 1)]
            per_row = context / n if self.own else context
            device = self.m.decode(graph, per_row, rows=n) + self.m.sampler(self.e.sampler_rows(n))
            host = self.host.decode(n) + self.e.step_overhead_s
            found = self.decodes[(n, context)] = (device + host, device, host)
        return found


class _Sim:
    def __init__(self, costs: StepCosts, keep_steps: bool):
        self.e, self.costs, self.keep, self.own = costs.e, costs, keep_steps, costs.own
        self.free = self.e.usable_blocks()
        self.waiting: deque[Record] = deque()
        self.running: list[Record] = []
        self.steps: list[tuple[str, float, float, int]] = []
        self.finished = 0
        self.device_s = self.host_s = 0.0

    def account(self, kind: str, now: float, step: tuple[float, float, float], rows: int) -> float:
        seconds, device, host = step
        self.device_s += device
        self.host_s += host
        if self.keep:
            self.steps.append((kind, now, seconds, rows))
        return seconds

    def try_prefill(self, now: float) -> float | None:
        """The head of the waiting queue's prefill, if a slot and its blocks are free: its seconds."""
        if not self.waiting or len(self.running) >= self.e.batch:
            return None
        rec = self.waiting[0]
        tokens = rec.request.prompt + rec.generated
        need = self.e.blocks_for(tokens)
        if need > self.free:
            return None
        self.waiting.popleft()
        self.free -= need
        rec.blocks = need
        self.running.append(rec)
        seconds = self.account("prefill", now, self.costs.prefill(tokens, rec.request.vit), 1)
        end = now + seconds
        rec.generated += 1
        if math.isnan(rec.first_token):
            rec.first_token = end
        if rec.generated >= rec.request.output:
            self.finish(rec, end)
        return seconds

    def decode(self, now: float) -> float | None:
        """One decode step of every running request that gets its block (preempting from the back): seconds."""
        scheduled: list[Record] = []
        block = self.e.block_size
        i = 0
        while i < len(self.running):
            rec = self.running[i]
            tokens = rec.request.prompt + rec.generated
            if tokens <= rec.blocks * block:  # its blocks hold the new token: the common case, no allocation
                scheduled.append(rec)
                i += 1
                continue
            need = self.e.blocks_for(tokens) - rec.blocks
            stopped = False
            while need > self.free:
                victim = self.running.pop()
                self.free += victim.blocks
                victim.blocks = 0
                victim.preemptions += 1
                self.waiting.appendleft(victim)
                if victim is rec:
                    stopped = True
                    break
            if stopped:
                break
            self.free -= need
            rec.blocks += need
            scheduled.append(rec)
            i += 1
        if not scheduled:
            return None
        n = len(scheduled)
        contexts = [r.request.prompt + r.generated for r in scheduled]  # the scheduled rows' own (after the step)
        seconds = self.account("decode", now, self.costs.decode(n, sum(contexts) if self.own else max(contexts)), n)
        end = now + seconds
        for rec in scheduled:
            rec.generated += 1
            if rec.generated >= rec.request.output:
                self.finish(rec, end)
        return seconds

    def coast(self, now: float, arrival: float) -> float | None:
        """Decode steps of the same rows while nothing can change the schedule, in one go (the same steps, times and
        order of additions as ``decode`` one at a time): no row needs a new block, no row finishes before the last
        step, and no arrival could start a prefill (with a free slot and nobody waiting, the run stops at the next
        arrival; a waiting head that did not fit stays out until a row finishes). None when a row needs a block now.
        Returns the time after the last step."""
        rows, bs = self.running, self.e.block_size
        tokens = [r.request.prompt + r.generated for r in rows]
        slack = min(r.blocks * bs - t for r, t in zip(rows, tokens, strict=True))
        if slack < 0:
            return None
        k = min(slack + 1, min(r.request.output - r.generated for r in rows))
        watch = not self.waiting and len(rows) < self.e.batch
        n = len(rows)
        # every row gains a token per step: the total grows by n, the longest by 1
        context, grow = (sum(tokens), n) if self.own else (max(tokens), 1)
        done, cost = 0, self.costs.decode
        while done < k and not (watch and done and now >= arrival):  # the hot loop of a capacity search
            seconds, device, host = cost(n, context + grow * done)
            self.device_s += device
            self.host_s += host
            if self.keep:
                self.steps.append(("decode", now, seconds, n))
            now += seconds
            done += 1
        for rec in list(rows):
            rec.generated += done
            if rec.generated >= rec.request.output:
                self.finish(rec, now)
        return now

    def finish(self, rec: Record, end: float) -> None:
        rec.finish = end
        self.finished += 1
        self.free += rec.blocks
        rec.blocks = 0
        self.running.remove(rec)


def check_requests(engine: Engine, requests: Sequence[Request]) -> None:
    """Refuse what vLLM would refuse, or a request that could never be admitted (the engine would wait forever)."""
    for r in requests:
        if r.prompt + r.output > engine.max_model_len:
            raise InputError(
                f"a request of {r.prompt} prompt + {r.output} output tokens is longer than max_seq_len "
                f"{engine.max_model_len}",
                "raise --context, or lower --prompt-tokens/--output-tokens",
            )
        if engine.blocks_for(r.prompt + r.output) > engine.usable_blocks():
            raise InputError(
                f"a request of {r.prompt + r.output} tokens needs {engine.blocks_for(r.prompt + r.output)}"
                f" KV blocks; the pool has {engine.usable_blocks()}",
                "a configuration with more KV blocks (kvcache_num_blocks)",
            )
        if r.output < 1 or r.prompt < 1:
            raise InputError(f"a request of {r.prompt} prompt and {r.output} output tokens", "both must be >= 1")


def simulate(
    engine: Engine,
    model: DeviceTimeModel,
    requests: Sequence[Request],
    *,
    host: HostTimeModel = HOST_FREE,
    context_end: str = LONGEST,
    keep_steps: bool = False,
    fast: bool = True,
    costs: StepCosts | None = None,
) -> Trace:
    """Run the requests (any order; taken as they reach the scheduler: arrival plus the host model's API-server front
    end, ties in the given order) through the scheduler, each step
    charged its device time (``model``: graph calls and the sampler) and its host time (``host``); decode rows at
    ``context_end`` (``OWN`` or ``LONGEST``). ``fast`` takes runs of identical decode steps in one go
    (``_Sim.coast``); the result is the same step for step. ``costs``: step costs to share between runs (built
    for this engine, model, host and end; they replace those arguments)."""
    check_requests(engine, requests)
    costs = costs or StepCosts(engine, model, host, context_end)
    # a request reaches the scheduler after the API server's own work on it (``HostTimeModel.front``): its TTFT
    # counts from its arrival, its place in the queue from then
    ready = [r.arrival + costs.host.front(len(r.vit)) for r in requests]
    order = sorted(range(len(requests)), key=lambda i: (ready[i], i))
    records = [Record(requests[i]) for i in order]
    reach = [ready[i] for i in order]
    sim = _Sim(costs, keep_steps)
    now, nxt = 0.0, 0
    while sim.finished < len(records):
        while nxt < len(records) and reach[nxt] <= now:
            sim.waiting.append(records[nxt])  # requests reach the scheduler between steps
            nxt += 1
        if not sim.waiting and not sim.running:
            now = max(now, reach[nxt])
            continue
        seconds = sim.try_prefill(now)
        if seconds is None and fast and sim.running:
            arrival = reach[nxt] if nxt < len(records) else math.inf
            after = sim.coast(now, arrival)
            if after is not None:
                now = after
                continue
        if seconds is None:
            seconds = sim.decode(now)
        if seconds is None:  # every running request was preempted: an empty step, then the next one prefills
            seconds = sim.try_prefill(now)
        if seconds is None:  # unreachable after check_requests: nothing runs and the head cannot be admitted
            raise InputError("the simulated engine cannot admit the next request", "a larger KV pool")
        now += seconds
    return Trace(records, sim.steps, now, sim.device_s, sim.host_s)


def engine_for_artifact(artifact: Path) -> tuple[Engine, tuple[int, ...]]:
    """The scheduler's facts of a compiled artifact (its rbln_config.json, as vllm-rbln syncs them: max_num_seqs =
    batch_size, max_model_len = max_seq_len, block_size = kvcache_block_size, the pool = kvcache_num_blocks), and
    its ViT buckets (visual.max_seq_len)."""
    path, cfg = read_rbln_config(artifact)
    try:
        max_len = int(cfg["max_seq_len"])
        block = int(cfg.get("kvcache_block_size") or cfg.get("kvcache_partition_len") or max_len)
        engine = Engine(
            batch=int(cfg["batch_size"]),
            chunk=int(cfg.get("prefill_chunk_size") or 128),
            block_size=block,
            num_blocks=int(cfg.get("kvcache_num_blocks") or cfg["batch_size"] * math.ceil(max_len / block)),
            max_model_len=max_len,
            graphs=tuple(int(b) for b in cfg.get("decoder_batch_sizes") or ()),
        )
        visual = (cfg.get("visual") or {}).get("max_seq_len") or []
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(
            f"{path} cannot be read as an optimum-rbln config ({type(exc).__name__}: {exc})",
            "recompile with `qvl compile --force`",
        ) from None
    buckets = tuple(sorted(int(b) for b in (visual if isinstance(visual, list) else [visual])))
    return engine, buckets
