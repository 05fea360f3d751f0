"""The device-time model: how long one compiled graph call holds the NPU. One source of device times for the
serving simulator (``tuning.simulate``) and the emulator's timed calls (``backends/emulator``), so a prediction
and a measurement of the same artifact rest on the same figures.

Three kinds, each a JSON recipe (``to_json`` / ``from_json``: the emulator reads it from a file in vLLM's
subprocess and rebuilds the same figures there):

- ``roofline``: the roofline bound of a model at the artifact's compiled shapes (``tuning.roofline``); a MoE at
  its high end (every expert computed), the figure tune ranks by.
- ``timings``: ``qvl profile``'s timings.json (``tuning.measured``) for that model and NPU, graph by graph,
  every unmeasured graph of a measured kind at its bound times that kind's measured/bound ratio and the rest at
  the bound (``tuning.measured_roofline``, as tune does).
- ``linear``: declared coefficients (a toy model for hand-worked schedules and tests).

Besides the graphs, ``sampler(rows)``: vllm-rbln's compiled sampler, one NPU call per engine step. No measured or
published figure exists: the roofline kinds use ``roofline.SAMPLER_ASSUMPTION`` (stated wherever it is printed),
a linear model its declared ``sampler`` coefficients (default none).

Pure: no torch, no vLLM. The emulator's time scale is the emulator's, not part of a device time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError

KINDS = ("roofline", "timings", "linear")
DEFAULT_NPU = "RBLN-CR13"


@dataclass(frozen=True)
class DeviceTimeModel:
    """Device seconds of one graph call. ``name`` says what the figures are (for labels); ``spec`` is the recipe.

    - ``vit(bucket)``: one ViT call at a visual ``max_seq_len`` bucket (patches);
    - ``prefill(chunk, context)``: one prefill chunk call of ``chunk`` (= prefill_chunk_size) tokens, ``context``
      tokens in the KV cache after it (so the first chunk of a prompt is at ``context == chunk``);
    - ``decode(batch, context, rows=None)``: one call of the decoder graph compiled at ``batch`` rows. ``context``
      is either one number, every real row at it (``rows`` of them, default all ``batch``: the upper end when it is
      the longest row's), or each real row's own context (a sequence: the rows are its length). Tokens in the KV
      cache after the step: a row at ``cache_position`` p is at context p + 1;
    - ``sampler(rows)``: one sampler call on ``rows`` rows of logits (``sampler_source`` says what it rests on).
    """

    name: str
    spec: dict[str, Any] = field(compare=False)
    _backend: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self._backend is None:
            object.__setattr__(self, "_backend", _build(self.spec))

    def vit(self, bucket: int) -> float:
        return float(self._backend.vit(int(bucket)))

    def prefill(self, chunk: int, context: int) -> float:
        return float(self._backend.prefill(int(chunk), int(context)))

    def decode(self, batch: int, context: float | Sequence[int], rows: int | None = None) -> float:
        if isinstance(context, int | float):
            return float(self._backend.decode(int(batch), float(context), int(batch if rows is None else rows)))
        contexts = [int(c) for c in context]
        n = len(contexts)  # the cost is linear in rows x context: the rows at their mean context cost the same
        return float(self._backend.decode(int(batch), sum(contexts) / n if n else 0.0, n))

    def sampler(self, rows: int) -> float:
        return float(self._backend.sampler(int(rows)))

    @property
    def sampler_source(self) -> str:
        return str(self._backend.sampler_source)

    def prompt(self, tokens: int, chunk: int) -> float:
        """Every chunk of one prompt of ``tokens`` tokens: ceil(tokens / chunk) calls, each compiled at ``chunk``."""
        n = max(1, math.ceil(tokens / chunk))
        return sum(self.prefill(chunk, (i + 1) * chunk) for i in range(n))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **self.spec}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DeviceTimeModel:
        if not isinstance(d, dict) or d.get("kind") not in KINDS:
            got = d.get("kind") if isinstance(d, dict) else type(d).__name__
            raise InputError(f"device-time model kind {got!r} is not one of {', '.join(KINDS)}",
                             "write it with DeviceTimeModel.to_json()")  # fmt: skip
        spec = {k: v for k, v in d.items() if k != "name"}
        return cls(str(d.get("name") or _name(spec)), spec)


# ------------------------------------------------------------------------------------------------ backends


@dataclass(frozen=True)
class _Linear:
    """vit = v0 + v1 x bucket; prefill = p0 + p1 x chunk + p2 x context; decode = d0 + d1 x batch + d2 x rows x
    context. Declared, for hand-worked schedules."""

    vit_c: tuple[float, float]
    prefill_c: tuple[float, float, float]
    decode_c: tuple[float, float, float]
    sampler_c: tuple[float, float] = (0.0, 0.0)  # s0 + s1 x rows

    @property
    def sampler_source(self) -> str:
        if not any(self.sampler_c):
            return "declared: none (0 s)"
        return f"declared: {self.sampler_c[0]:g} s + {self.sampler_c[1]:g} s per row"

    def sampler(self, rows: int) -> float:
        return self.sampler_c[0] + self.sampler_c[1] * rows

    def vit(self, bucket: int) -> float:
        return self.vit_c[0] + self.vit_c[1] * bucket

    def prefill(self, chunk: int, context: int) -> float:
        return self.prefill_c[0] + self.prefill_c[1] * chunk + self.prefill_c[2] * context

    def decode(self, batch: int, context: float, rows: int) -> float:
        return self.decode_c[0] + self.decode_c[1] * batch + self.decode_c[2] * rows * context


class _Roof:
    """A (Measured)Roofline asked with the simulator's arguments."""

    def __init__(self, roof: Any, block: int):
        self.roof, self.block = roof, block

    def vit(self, bucket: int) -> float:
        return self.roof.vit_call(bucket)

    def prefill(self, chunk: int, context: int) -> float:
        if chunk != self.roof.chunk:
            raise InputError(f"prefill chunk {chunk} is not the compiled prefill_chunk_size {self.roof.chunk}",
                             "ask the time model at the artifact's prefill_chunk_size")  # fmt: skip
        return self.roof.prefill_chunk(max(0, context - chunk), self.block)

    def decode(self, batch: int, context: float, rows: int) -> float:
        return self.roof.decode_step(batch, rows, float(context), self.block)

    def sampler(self, rows: int) -> float:
        return self.roof.sampler_call(rows)

    @property
    def sampler_source(self) -> str:
        from qwenvl_rbln.tuning.roofline import SAMPLER_ASSUMPTION

        return SAMPLER_ASSUMPTION


def _coeffs(spec: dict[str, Any], key: str, n: int) -> tuple[float, ...]:
    raw = spec.get(key)
    numbers = isinstance(raw, list | tuple) and all(isinstance(x, int | float) and not isinstance(x, bool) for x in raw)
    if not numbers or len(raw) != n:
        raise InputError(f"linear device-time model: {key}={raw!r} is not {n} numbers", f"e.g. {key}={[0.0] * n}")
    if not all(math.isfinite(x) and x >= 0 for x in raw):
        raise InputError(f"linear device-time model: {key}={raw!r} has a negative or non-finite coefficient",
                         "give seconds >= 0")  # fmt: skip
    return tuple(float(x) for x in raw)


def _build(spec: dict[str, Any]) -> Any:
    kind = spec.get("kind")
    if kind == "linear":
        sampler = _coeffs(spec, "sampler", 2) if "sampler" in spec else (0.0, 0.0)
        return _Linear(_coeffs(spec, "vit", 2), _coeffs(spec, "prefill", 3), _coeffs(spec, "decode", 3), sampler)  # type: ignore[arg-type]
    if kind in ("roofline", "timings"):
        return _Roof(_roofline(spec), int(spec["block"]))
    raise InputError(f"device-time model kind {kind!r} is not one of {', '.join(KINDS)}", "use roofline or timings")


def _roofline(spec: dict[str, Any]) -> Any:
    """The roofline (or measured roofline) the recipe names, at its high end for a MoE."""
    from qwenvl_rbln.memory.calibration import model_key
    from qwenvl_rbln.planning.catalogue.devices import compute_spec
    from qwenvl_rbln.planning.catalogue.modelinfo import load_geometry
    from qwenvl_rbln.tuning.measured import load_measured
    from qwenvl_rbln.tuning.measured_roofline import MeasuredRoofline

    geometry = load_geometry(str(spec["model"]), "the device-time model's model")[0]
    npu = str(spec.get("npu") or DEFAULT_NPU)
    chunk = int(spec["chunk"])
    if spec["kind"] == "roofline":
        from qwenvl_rbln.tuning.roofline import Roofline

        roof: Any = Roofline(geometry, compute_spec(npu), chunk=chunk)
    else:
        measured = load_measured(model_key(geometry), npu, Path(spec["path"]), emulated=bool(spec.get("emulated")),
                                 graph_hash=spec.get("graph_hash"))  # fmt: skip
        roof = MeasuredRoofline(geometry, compute_spec(npu), chunk=chunk, measured=measured, scale_unmeasured=True)
    return roof.high_end() if spec.get("end", "high") == "high" else roof


def _name(spec: dict[str, Any]) -> str:
    kind = spec.get("kind")
    if kind == "linear":
        return "declared linear times"
    if kind == "timings":
        return f"timings {spec.get('path')}" + (" (emulated section)" if spec.get("emulated") else "")
    return f"roofline {spec.get('model')} on {spec.get('npu') or DEFAULT_NPU}"


# ------------------------------------------------------------------------------------------------ builders


def time_model_for(
    *,
    model: str,
    chunk: int,
    block: int,
    npu: str = DEFAULT_NPU,
    timings: Path | None = None,
    emulated: bool = False,
    graph_hash: str | None = None,
) -> DeviceTimeModel:
    """The time model of an artifact's compiled shapes: ``model`` (a hub id or a model/artifact directory with
    config.json), its ``prefill_chunk_size`` (``chunk``) and ``kvcache_partition_len`` (``block``), on ``npu``.
    With ``timings`` the measured graphs of that file (its ``emulated`` section with ``emulated=True``; only this
    artifact's entries with ``graph_hash``), else the roofline bound."""
    spec: dict[str, Any] = {"kind": "roofline", "model": str(model), "npu": npu, "chunk": int(chunk),
                            "block": int(block), "end": "high"}  # fmt: skip
    if timings is not None:
        spec.update(kind="timings", path=str(timings), emulated=bool(emulated), graph_hash=graph_hash)
    return DeviceTimeModel(_name(spec), spec)


def time_model_for_artifact(artifact: Path, *, timings: Path | None = None, model: str | None = None,
                            emulated: bool = False) -> DeviceTimeModel:  # fmt: skip
    """The time model at an artifact's compiled shapes (its rbln_config.json): the roofline of ``model`` (default:
    the artifact's own config.json), or ``timings``' entries for this artifact's graphs (its graph hash)."""
    from qwenvl_rbln.tuning.artifact_config import read_rbln_config

    _, cfg = read_rbln_config(artifact)
    chunk = int(cfg.get("prefill_chunk_size") or 128)  # as profiling.graphs.discover reads the shapes
    block = int(cfg.get("kvcache_partition_len") or cfg.get("max_seq_len") or 0)
    ghash = None
    if timings is not None:
        from qwenvl_rbln.artifacts.manifest import graph_hash, read_manifest

        ghash = graph_hash(artifact, read_manifest(artifact))
    return time_model_for(model=model or str(artifact), chunk=chunk, block=block, timings=timings,
                          emulated=emulated, graph_hash=ghash)  # fmt: skip


def linear_model(vit: tuple[float, float] = (0.0, 0.0), prefill: tuple[float, float, float] = (0.0, 0.0, 0.0),
                 decode: tuple[float, float, float] = (0.0, 0.0, 0.0), name: str = "declared linear times",
                 sampler: tuple[float, float] = (0.0, 0.0)) -> DeviceTimeModel:  # fmt: skip
    """A declared toy model (hand-worked schedules): see ``_Linear``."""
    spec = {"kind": "linear", "vit": list(vit), "prefill": list(prefill), "decode": list(decode)}
    if any(sampler):
        spec["sampler"] = list(sampler)
    return DeviceTimeModel(name, spec)


def from_roofline(roof: Any, block: int, name: str) -> DeviceTimeModel:
    """A time model over a roofline tune already built (its measured lookups, scales and labels are shared): not
    serialisable to the emulator (``to_json`` gives the name only), for the simulator inside tune."""
    return DeviceTimeModel(name, {"kind": "in-process", "block": block}, _Roof(roof, block))


def model_for_flag(spec: str, artifact: Path) -> DeviceTimeModel:
    """``--time-model``'s value: ``roofline:MODEL`` (a hub id or directory: its roofline at the artifact's compiled
    shapes), ``timings:FILE`` (``qvl profile``'s timings.json for this artifact's graphs), or a JSON file written
    by ``DeviceTimeModel.to_json``."""
    import json

    kind, _, rest = spec.partition(":")
    if kind == "roofline" and rest:
        return time_model_for_artifact(Path(artifact), model=rest)
    if kind == "timings" and rest:
        return time_model_for_artifact(Path(artifact), timings=Path(rest))
    return DeviceTimeModel.from_json(json.loads(Path(spec).read_text(encoding="utf-8")))
