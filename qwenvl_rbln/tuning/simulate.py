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
- KV admission: a request needs ceil(min(tokens, max_model_len) / block_size) blocks (tokens = prompt + tokens
  generated so far); a waiting head that cannot get them stays waiting (``new_blocks is None: break``) and the
  step decodes instead; a decode that needs a new block when none is free preempts the LAST running request
  (``self.running.pop()``: freed, put back at the head of the waiting queue, recomputed later with its generated
  tokens as prompt, ViT again);
- the pool: ``kvcache_num_blocks`` usable blocks when they hold every row at the full context, one fewer when not
  (vLLM's null block, ``update_num_blocks`` / ``RBLNBlockPool``);
- a decode step of n requests runs the smallest compiled decoder graph >= n (``select_bucket_size``: bisect over
  ``decoder_batch_sizes``), at the longest row's context.

Per request it records arrival, first-token time and finish; ``tuning.capacity`` turns those into TTFT, TPOT and
latency percentiles as ``vllm bench serve`` computes them.
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


@dataclass(frozen=True)
class Engine:
    """The compiled artifact's facts the scheduler sees."""

    batch: int  # batch_size = max_num_seqs
    chunk: int  # prefill_chunk_size
    block_size: int  # kvcache_block_size (= kvcache_partition_len under flash attention)
    num_blocks: int  # kvcache_num_blocks
    max_model_len: int  # max_seq_len
    graphs: tuple[int, ...] = ()  # decoder_batch_sizes; empty: one graph at the batch
    step_overhead_s: float = 0.0  # host time per engine step (scheduling, sampling), if known

    def decoder_graphs(self) -> tuple[int, ...]:
        return tuple(sorted(self.graphs)) if self.graphs else (self.batch,)

    def usable_blocks(self) -> int:
        full = self.num_blocks >= self.batch * math.ceil(self.max_model_len / self.block_size)
        return self.num_blocks if full else self.num_blocks - 1

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(min(tokens, self.max_model_len) / self.block_size)


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
    """The simulation's result: a record per request, and the steps it ran (kind, start, seconds, rows)."""

    records: list[Record]
    steps: list[tuple[str, float, float, int]] = field(default_factory=list)
    end: float = 0.0


class _Sim:
    def __init__(self, engine: Engine, model: DeviceTimeModel, keep_steps: bool):
        self.e, self.m, self.keep = engine, model, keep_steps
        self.graphs = engine.decoder_graphs()
        self.free = engine.usable_blocks()
        self.waiting: deque[Record] = deque()
        self.running: list[Record] = []
        self.steps: list[tuple[str, float, float, int]] = []
        self.finished = 0
        self._prefill_cache: dict[tuple[int, tuple[int, ...]], float] = {}
        self._decode_cache: dict[tuple[int, int], float] = {}

    def prefill_seconds(self, tokens: int, vit: tuple[int, ...]) -> float:
        key = (tokens, vit)
        if key not in self._prefill_cache:
            self._prefill_cache[key] = sum(self.m.vit(b) for b in vit) + self.m.prompt(tokens, self.e.chunk)
        return self._prefill_cache[key]

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
        seconds = self.prefill_seconds(tokens, rec.request.vit) + self.e.step_overhead_s
        if self.keep:
            self.steps.append(("prefill", now, seconds, 1))
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
        block, context, preempted = self.e.block_size, 0, False
        i = 0
        while i < len(self.running):
            rec = self.running[i]
            tokens = rec.request.prompt + rec.generated
            context = max(context, tokens)
            if tokens <= rec.blocks * block:  # its blocks hold the new token: the common case, no allocation
                scheduled.append(rec)
                i += 1
                continue
            need = self.e.blocks_for(tokens) - rec.blocks
            stopped = False
            while need > self.free:
                victim = self.running.pop()
                preempted = True
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
        if preempted:  # the context counted a row that was then preempted: the scheduled rows' own
            context = max(r.request.prompt + r.generated for r in scheduled)
        seconds = self.step_seconds(n, context)
        if self.keep:
            self.steps.append(("decode", now, seconds, n))
        end = now + seconds
        for rec in scheduled:
            rec.generated += 1
            if rec.generated >= rec.request.output:
                self.finish(rec, end)
        return seconds

    def step_seconds(self, n: int, context: int) -> float:
        key = (n, context)
        seconds = self._decode_cache.get(key)
        if seconds is None:  # the same rows at the same context cost the same: look the graph up once
            graph = self.graphs[min(bisect.bisect_left(self.graphs, n), len(self.graphs) - 1)]
            seconds = self._decode_cache[key] = self.m.decode(graph, context, rows=n) + self.e.step_overhead_s
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
        n, context = len(rows), max(tokens)
        done = 0
        while done < k and not (watch and done and now >= arrival):
            seconds = self.step_seconds(n, context + done)
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
    engine: Engine, model: DeviceTimeModel, requests: Sequence[Request], *, keep_steps: bool = False, fast: bool = True
) -> Trace:
    """Run the requests (any order; taken by arrival, ties in the given order) through the scheduler. ``fast``
    takes runs of identical decode steps in one go (``_Sim.coast``); the result is the same step for step."""
    check_requests(engine, requests)
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival, i))
    records = [Record(requests[i]) for i in order]
    sim = _Sim(engine, model, keep_steps)
    now, nxt = 0.0, 0
    while sim.finished < len(records):
        while nxt < len(records) and records[nxt].request.arrival <= now:
            sim.waiting.append(records[nxt])  # requests reach the scheduler between steps
            nxt += 1
        if not sim.waiting and not sim.running:
            now = max(now, records[nxt].request.arrival)
            continue
        seconds = sim.try_prefill(now)
        if seconds is None and fast and sim.running:
            arrival = records[nxt].request.arrival if nxt < len(records) else math.inf
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
    return Trace(records, sim.steps, now)


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
