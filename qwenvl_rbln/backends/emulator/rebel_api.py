"""The ``rebel`` surface optimum-rbln 0.12 uses, on CPU (served as ``sys.modules["rebel"]`` when activated).

Entry points and where optimum-rbln calls them (paths inside ``optimum/rbln/``):

* ``npu_is_available(i)``, ``get_npu_name(i)``, ``device_count()``: ``utils/runtime_utils.py:40-45, 106-114,
  141-180``. The emulated host has ``QVL_EMULATOR_DEVICES`` (default 4) NPUs named ``QVL_EMULATOR_NPU``
  (default ``RBLN-CR13``).
* ``compile(..., num_devices=...)`` (its signature is probed, ``runtime_utils.py:25-37``) and
  ``compile_from_torch(module, input_info, npu=, num_devices=, example_inputs=, compile_context=)``
  (``modeling_base.py:511-538``). ``input_info`` is ``[(name, shape, dtype), ...]`` or a list of those (one
  graph per entry, the ViT buckets: ``qwen3_vl/modeling_qwen3_vl.py:125-146``). Each graph is traced (see
  ``graph.py``); inputs marked static on the ``CompileContext`` are not graph arguments at run time.
* ``RBLNCompiledModel(path)``, ``.save(path)``, and the memory queries of automatic KV sizing
  (``transformers/modeling_attention_utils.py:195-345, 440-505``): ``get_alloc_per_chiplet_by_key()``,
  ``get_alloc_per_node_by_key()``, ``exp_get_dram_tensor_sizes()``, ``exp_multiply_buffer_size()``,
  ``exp_rescale_buffer_size()``. Sizes are the real byte sizes of the emulated graph's tensors: ``Weight``
  (its constants), ``IOBuffer`` (its inputs and outputs) and ``DramTensor`` (the static KV buffers), spread
  over 4 chiplets for ``RBLN-CR*`` (1 for ``RBLN-CA*``). They are not the NPU compiler's figures.
* ``Runtime(compiled, tensor_type="pt", device=, activate_profiler=, timeout=)`` called as
  ``rt(*inputs, out=...)`` (``decoderonly/decoderonly_runtime_utils.py:347-357``,
  ``qwen3_vl/qwen3_vl_runtime_utils.py:266-269``, ``qwen3_vl/modeling_qwen3_vl.py:219-224``): it gets the
  non-static inputs in ``input_info`` order, supplies the static buffers itself, picks the graph whose input
  shapes match, writes into ``out`` when given and returns a tensor or a list.
* ``capture_reports()`` (not optimum-rbln's: vllm-rbln v0.11.0, RBLN-SW/vllm-rbln 95c7a25a,
  ``v1/worker/optimum_model_runner.py`` wraps every model call in it and ``v1/worker/metrics.py`` reads
  ``reports[0]["total_host"]`` / ``["total_device"]`` / ``["total_ccl"]`` in microseconds; read the same way since
  its 0.10 line): a context manager yielding a list that holds one report when it exits. Here
  "device" time is the time inside emulated graph calls (CPU compute plus the hold below) and "host" the rest
  of the block; each report says ``"emulated": True``.
* ``QVL_EMULATE_CALL_MS``: every graph call takes at least that many milliseconds (it sleeps the rest, without
  the GIL), so a benchmark of many workers measures qvl's overhead against a busy device, not the CPU's speed.
* ``QVL_EMULATE_TIME_MODEL`` / ``_SCALE`` / ``_STATS``: every graph call holds for its device time under a named
  model, times a scale, and each process logs its calls and overruns (``timed.py``).
* ``QVL_EMULATOR_CALL_LOG=FILE``: every graph call appends one line ``PID GRAPH_FILE GRAPH_INDEX`` to FILE, so a
  test can count the graph calls made inside processes it cannot reach (``qvl serve --emulate``'s engine core: the
  ViT calls with packing on and off).
* ``compile_context.CompileContext(use_weight_sharing=...)`` with ``mark_static_address(tensor, name)``
  (``decoderonly/modeling_decoderonly.py:262-273``): every graph compiled with one context shares its static
  tensors (the KV cache) at run time, also after save and reload (the context id is stored in each file).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import types
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import qwenvl_rbln.backends.emulator.graph as graph_mod
from qwenvl_rbln.backends.emulator import timed

__version__ = "0.12.0+qvl.emulated"
EMULATED = True

_lock = threading.Lock()


class _State:
    """Process-wide switches (tests): ``share_static_buffers=False`` is the negative control."""

    share_static_buffers = True


state = _State()


# --------------------------------------------------------------------------------------------- devices


def _npu_name() -> str:
    return os.environ.get("QVL_EMULATOR_NPU", "RBLN-CR13")


def device_count() -> int:
    try:
        return max(0, int(os.environ.get("QVL_EMULATOR_DEVICES", "4")))
    except ValueError:
        return 4


def npu_is_available(device: int = 0) -> bool:
    return 0 <= int(device) < device_count()


def get_npu_name(device: int = 0) -> str | None:
    return _npu_name() if npu_is_available(device) else None


def _chiplets(npu: str | None) -> int:
    return 4 if str(npu or _npu_name()).startswith("RBLN-CR") else 1


# ----------------------------------------------------------------------------------------- compile context


class CompileContext:
    """Graphs compiled with one context share the tensors marked static (by name) at run time."""

    def __init__(self, use_weight_sharing: bool = False, **kwargs: Any):
        self.use_weight_sharing = use_weight_sharing
        self.id = uuid.uuid4().hex
        self.static: dict[str, tuple[list[int], str]] = {}

    def mark_static_address(self, tensor: Any, name: str | None = None) -> None:
        key = name or f"static_{len(self.static)}"
        self.static[key] = (list(tensor.shape), graph_mod.dtype_name(tensor.dtype))


compile_context = types.ModuleType("rebel.compile_context")
compile_context.CompileContext = CompileContext  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------ compile


def _norm_info(input_info: Any) -> list[list[tuple[str, list[int], str]]]:
    infos = list(input_info)
    multi = bool(infos) and isinstance(infos[0], list | tuple) and infos[0] and isinstance(infos[0][0], list | tuple)
    groups = infos if multi else [infos]
    return [[(str(n), [int(d) for d in s], graph_mod.dtype_name(t)) for n, s, t in g] for g in groups]


def _example(shape: list[int], dtype: str) -> Any:
    import torch

    return torch.zeros(shape, dtype=graph_mod.torch_dtype(dtype))


def compile_from_torch(
    module: Any,
    input_info: Any,
    npu: str | None = None,
    num_devices: int | None = None,
    example_inputs: Any = None,
    compile_context: CompileContext | None = None,
    tensor_parallel_size: int | None = None,
    **kwargs: Any,
) -> RBLNCompiledModel:
    """Trace ``module`` once per input_info group into an emulated compiled model (kept in memory)."""
    from qwenvl_rbln.backends.emulator.ops import register

    register()
    groups = _norm_info(input_info)
    static = dict(compile_context.static) if compile_context is not None else {}
    graphs = []
    for gi, info in enumerate(groups):
        given = list(example_inputs) if example_inputs is not None and len(groups) == 1 else None
        inputs = []
        for i, (_name, shape, dtype) in enumerate(info):
            x = given[i] if given is not None and i < len(given) else None
            if x is None or getattr(x, "is_meta", False) or list(x.shape) != shape:
                x = _example(shape, dtype)
            inputs.append(x)
        gm = graph_mod.trace(module, inputs)
        gjson, consts = graph_mod.serialize(gm)
        outputs = _output_specs(gm, inputs)
        graphs.append({"graph": gjson, "constants": consts, "outputs": outputs, "index": gi})
    header = {
        "id": uuid.uuid4().hex,
        "npu": npu or _npu_name(),
        "num_devices": int(num_devices or tensor_parallel_size or 1),
        "context_id": compile_context.id if compile_context is not None else None,
        "static": sorted(n for n in static if any(n == name for info in groups for name, _, _ in info)),
        "inputs": groups,
        "multipliers": {},
        "writer": f"qvl emulator (rebel surface {__version__})",
    }
    return RBLNCompiledModel._from_parts(header, graphs)


def compile(*args: Any, num_devices: int | None = None, **kwargs: Any) -> RBLNCompiledModel:  # noqa: A001
    """Same as :func:`compile_from_torch` (optimum-rbln only inspects this signature for ``num_devices``)."""
    return compile_from_torch(*args, num_devices=num_devices, **kwargs)


def _output_specs(gm: Any, inputs: list[Any]) -> list[tuple[list[int], str]]:
    import torch

    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    leaves = out if isinstance(out, list | tuple) else [out]
    specs = []
    for leaf in leaves:
        val = leaf.meta.get("val") if hasattr(leaf, "meta") else None
        if isinstance(val, torch.Tensor):
            specs.append((list(val.shape), graph_mod.dtype_name(val.dtype)))
    return specs


# ------------------------------------------------------------------------------------------ compiled model


class RBLNCompiledModel:
    """An emulated compiled model: one or more traced graphs, their input specs and static tensors."""

    def __init__(self, path: str | os.PathLike[str]):
        from qwenvl_rbln.backends.emulator.ops import register

        register()
        p = Path(path)
        try:
            header, tensors = graph_mod.load_file(p)
        except graph_mod.GraphFileError as exc:
            raise RuntimeError(f"qvl emulator refuses {p}: it {exc}") from None
        graphs = []
        for gi, g in enumerate(header.get("graphs") or []):
            prefix = f"g{gi}."
            consts = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            graphs.append({"graph": g["graph"], "constants": consts, "outputs": g["outputs"], "index": gi})
        self._init(header, graphs, path=p)

    @classmethod
    def _from_parts(cls, header: dict[str, Any], graphs: list[dict[str, Any]]) -> RBLNCompiledModel:
        self = cls.__new__(cls)
        self._init(header, graphs, path=None)
        return self

    def _init(self, header: dict[str, Any], graphs: list[dict[str, Any]], path: Path | None) -> None:
        self.header = {k: v for k, v in header.items() if k not in ("graphs", "aliases")}
        self._graphs = graphs
        self._modules: list[Any] = [None] * len(graphs)
        self.path = path

    # -- facts
    @property
    def inputs(self) -> list[list[tuple[str, list[int], str]]]:
        return [[(n, list(s), d) for n, s, d in g] for g in self.header["inputs"]]

    def static_specs(self) -> dict[str, tuple[list[int], str]]:
        """Static tensor name -> (shape with the current block count, dtype)."""
        out: dict[str, tuple[list[int], str]] = {}
        mult = self.header.get("multipliers") or {}
        for info in self.header["inputs"]:
            for name, shape, dtype in info:
                if name in self.header["static"] and name not in out:
                    shape = list(shape)
                    if shape:
                        shape[0] = int(shape[0] * mult.get(name, 1))
                    out[name] = (shape, dtype)
        return out

    def module(self, index: int) -> Any:
        if self._modules[index] is None:
            g = self._graphs[index]
            self._modules[index] = graph_mod.build(g["graph"], g["constants"])
        return self._modules[index]

    # -- persistence
    def save(self, path: str | os.PathLike[str]) -> None:
        tensors: dict[str, Any] = {}
        gheaders = []
        for gi, g in enumerate(self._graphs):
            for name, t in g["constants"].items():
                tensors[f"g{gi}.{name}"] = t
            gheaders.append({"graph": g["graph"], "outputs": g["outputs"]})
        graph_mod.save_file(Path(path), {**self.header, "graphs": gheaders}, tensors)

    # -- memory queries (real tensor sizes of the emulated graph, not device figures)
    def _nbytes(self, shape: list[int], dtype: str) -> int:
        import torch

        n = 1
        for d in shape:
            n *= int(d)
        return n * torch.empty((), dtype=graph_mod.torch_dtype(dtype)).element_size()

    def _spread(self, total: int, nodes: int, chips: int) -> list[list[int]]:
        per_node = [total // nodes + (total % nodes if i == 0 else 0) for i in range(nodes)]
        return [[n // chips + (n % chips if c == 0 else 0) for c in range(chips)] for n in per_node]

    def weight_bytes(self) -> int:
        seen = set()
        total = 0
        for g in self._graphs:
            for t in g["constants"].values():
                key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
                if key not in seen:
                    seen.add(key)
                    total += t.numel() * t.element_size()
        return total

    def io_bytes(self) -> int:
        static = set(self.header["static"])
        best = 0
        for gi, info in enumerate(self.header["inputs"]):
            io = sum(self._nbytes(s, d) for n, s, d in info if n not in static)
            io += sum(self._nbytes(s, d) for s, d in self._graphs[gi]["outputs"])
            best = max(best, io)
        return best

    def exp_get_dram_tensor_sizes(self) -> dict[str, list[list[int]]]:
        nodes, chips = int(self.header.get("num_devices") or 1), _chiplets(self.header.get("npu"))
        out = {}
        for i, (name, (shape, dtype)) in enumerate(sorted(self.static_specs().items(), key=_natural)):
            size = self._nbytes(shape, dtype)
            per_node = [size // nodes + (size % nodes if n == 0 else 0) for n in range(nodes)]
            out[name] = [[s if c == i % chips else 0 for c in range(chips)] for s in per_node]
        return out

    def get_alloc_per_chiplet_by_key(self) -> dict[str, list[list[int]]]:
        nodes, chips = int(self.header.get("num_devices") or 1), _chiplets(self.header.get("npu"))
        out = {
            "Weight": self._spread(self.weight_bytes(), nodes, chips),
            "IOBuffer": self._spread(self.io_bytes(), nodes, chips),
        }
        dram = self.exp_get_dram_tensor_sizes()
        if dram:
            total = [[0] * chips for _ in range(nodes)]
            for per_node in dram.values():
                for n, row in enumerate(per_node):
                    for c, v in enumerate(row):
                        total[n][c] += v
            out["DramTensor"] = total
        return out

    def get_alloc_per_node_by_key(self) -> dict[str, list[int]]:
        return {k: [sum(row) for row in v] for k, v in self.get_alloc_per_chiplet_by_key().items()}

    def exp_multiply_buffer_size(self, multipliers: dict[str, int]) -> None:
        mult = dict(self.header.get("multipliers") or {})
        for name, m in multipliers.items():
            if name in self.header["static"]:
                mult[name] = mult.get(name, 1) * int(m)
        self.header["multipliers"] = mult

    def exp_rescale_buffer_size(self, ratios: dict[str, Any]) -> None:
        from fractions import Fraction

        mult = dict(self.header.get("multipliers") or {})
        for name, r in ratios.items():
            if name in self.header["static"]:
                value = Fraction(mult.get(name, 1)) * Fraction(r)
                if value.denominator != 1:
                    raise ValueError(f"qvl emulator: {name} cannot be rescaled by {r}")
                mult[name] = int(value)
        self.header["multipliers"] = mult

    def __repr__(self) -> str:
        return f"<RBLNCompiledModel (emulated by qvl) {self.path or 'in memory'}: {len(self._graphs)} graph(s)>"


def _natural(item: tuple[str, Any]) -> tuple:
    name = item[0]
    head, _, tail = name.rpartition("_")
    return (head, int(tail)) if tail.isdigit() else (name, 0)


# ------------------------------------------------------------------------------------------------ runtime

# (context id, device) -> groups of shared static buffers; a group ends when a graph already in it is loaded again
_groups: dict[tuple[str, str], list[dict[str, Any]]] = {}


def _static_buffers(cm: RBLNCompiledModel, device: Any, owner: Any) -> dict[str, Any]:
    """The static tensors of ``cm`` for a new runtime: shared with the other graphs of its CompileContext on
    the same device. Loading a graph that the newest group already runs starts a new group (a second load of
    the same artifact gets its own KV cache)."""
    import torch

    specs = cm.static_specs()
    if not specs:
        return {}
    ctx = cm.header.get("context_id")
    if ctx is None or not state.share_static_buffers:
        return {n: torch.zeros(s, dtype=graph_mod.torch_dtype(d)) for n, (s, d) in specs.items()}
    key = (ctx, repr(device))
    with _lock:
        groups = [g for g in _groups.get(key, []) if len(g["runtimes"])]
        group = groups[-1] if groups else None
        if group is None or cm.header["id"] in group["ids"]:
            group = {"buffers": {}, "ids": set(), "runtimes": weakref.WeakSet()}
            groups.append(group)
        _groups[key] = groups
        for name, (shape, dtype) in specs.items():
            buf = group["buffers"].get(name)
            if buf is None or list(buf.shape) != list(shape):
                group["buffers"][name] = torch.zeros(shape, dtype=graph_mod.torch_dtype(dtype))
        group["ids"].add(cm.header["id"])
        group["runtimes"].add(owner)
        return {n: group["buffers"][n] for n in specs}


class Runtime:
    """Runs an emulated compiled model on the CPU; static tensors (the KV cache) are held here."""

    def __init__(
        self,
        compiled_model: RBLNCompiledModel,
        tensor_type: str = "pt",
        device: Any = None,
        activate_profiler: Any = None,
        timeout: Any = None,
        **kwargs: Any,
    ):
        if not isinstance(compiled_model, RBLNCompiledModel):
            raise TypeError("qvl emulator: Runtime needs an emulated RBLNCompiledModel")
        devices = device if isinstance(device, list) else [0 if device is None else device]
        for d in devices:
            if not isinstance(d, int) or not npu_is_available(d):
                raise RuntimeError(
                    f"qvl emulator: device {d!r} is not an emulated NPU (the emulated host has "
                    f"{device_count()}: QVL_EMULATOR_DEVICES)"
                )
        self.compiled_model = compiled_model
        self.device = device
        self.static = _static_buffers(compiled_model, device, self)
        self.calls = 0
        timer = timed.configured()
        if timer is not None and not timer.device_speed:  # a graph's first build must not fall inside a timed call
            for gi in range(len(compiled_model.header["inputs"])):
                compiled_model.module(gi)

    def _select(self, args: list[Any]) -> tuple[int, list[tuple[str, list[int], str]]]:
        static = set(self.static)
        for gi, info in enumerate(self.compiled_model.header["inputs"]):
            dyn = [(n, s) for n, s, _ in info if n not in static]
            if len(dyn) == len(args) and all(list(a.shape) == list(s) for (_, s), a in zip(dyn, args, strict=True)):
                return gi, info
        shapes = [list(a.shape) for a in args]
        raise RuntimeError(f"qvl emulator: no compiled graph takes inputs of shapes {shapes}")

    def __call__(self, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        start = time.perf_counter()  # the CPU's whole share of the call counts inside a timed hold (timed.py)
        args = list(args) + [v for v in kwargs.values() if v is not None]
        gi, info = self._select(args)
        it = iter(args)
        full = [self.static[n] if n in self.static else next(it) for n, _, _ in info]
        timer = timed.configured()
        if timer is not None and timer.device_speed:  # device speed: well-formed zeros, nothing computed
            outs = self._zeros(gi, out)
        else:
            import torch

            with torch.no_grad():
                result = self.compiled_model.module(gi)(*full)
            outs = list(result) if isinstance(result, list | tuple) else [result]
            if out is not None:
                targets = list(out) if isinstance(out, list | tuple) else [out]
                for t, r in zip(targets, outs, strict=False):
                    t.copy_(r.reshape(t.shape) if t.numel() == r.numel() else r)
        if timer is not None:
            timer.hold(start, timed.classify(info, full), call_hold_seconds())
        else:
            _hold(start)
        _record_call(time.perf_counter() - start)
        _log_call(self.compiled_model, gi)
        self.calls += 1
        if out is not None:
            return out
        return outs if len(outs) > 1 else outs[0]

    def _zeros(self, gi: int, out: Any) -> list[Any]:
        """The declared outputs of graph ``gi`` as zeros (``out``'s buffers zeroed in place when given)."""
        if out is not None:
            targets = list(out) if isinstance(out, list | tuple) else [out]
            for t in targets:
                t.zero_()
            return targets
        return timed.zeros_like_specs(self.compiled_model._graphs[gi]["outputs"])

    run = __call__
    forward = __call__

    def __repr__(self) -> str:
        return f"<Runtime (emulated by qvl) on device {self.device}>"


# ------------------------------------------------------------------------------ device time and its reports


def call_hold_seconds() -> float:
    """``QVL_EMULATE_CALL_MS`` as seconds (0 when unset or not a non-negative number)."""
    try:
        return max(0.0, float(os.environ.get("QVL_EMULATE_CALL_MS", "0") or 0) / 1000.0)
    except ValueError:
        return 0.0


def _hold(start: float) -> None:
    """Keep a graph call busy until QVL_EMULATE_CALL_MS has passed since ``start``."""
    rest = call_hold_seconds() - (time.perf_counter() - start)
    if rest > 0:
        time.sleep(rest)


CALL_LOG_ENV = "QVL_EMULATOR_CALL_LOG"


def _log_call(compiled: RBLNCompiledModel, index: int) -> None:
    """One line per graph call to ``QVL_EMULATOR_CALL_LOG`` when it is set (an append of a few bytes: lines from
    several processes never interleave)."""
    path = os.environ.get(CALL_LOG_ENV)
    if path:
        name = Path(compiled.path).name if compiled.path is not None else "-"
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()} {name} {index}\n")


_captures = timed.captures  # the open capture_reports blocks of each thread (timed.py: the sampler adds to them)
_record_call = timed.record_call


@contextlib.contextmanager
def capture_reports() -> Iterator[list[dict[str, Any]]]:
    """Time the graph calls made in this block (this thread): on exit the yielded list holds one report with
    ``total_host``, ``total_device`` and ``total_ccl`` in microseconds, as vllm-rbln reads them."""
    reports: list[dict[str, Any]] = []
    acc = {"device": 0.0, "calls": 0}
    stack = getattr(_captures, "stack", None)
    if stack is None:
        stack = _captures.stack = []
    stack.append(acc)
    start = time.perf_counter()
    try:
        yield reports
    finally:
        del stack[next(i for i, a in enumerate(stack) if a is acc)]  # by identity: equal dicts may nest
        wall = time.perf_counter() - start
        device_us = acc["device"] * 1e6
        reports.append(
            {
                "total_host": max(0.0, wall * 1e6 - device_us),
                "total_device": device_us,
                "total_ccl": 0.0,
                "calls": acc["calls"],
                "emulated": True,
            }
        )
