"""What the planner answers: the items, devices and report it returns, the verdict names, the assumptions it
states, and the usable bytes per device (--device-memory).

Its own module because every step of the planner and every caller reads these shapes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.memory.binding import deciding_devices, device_decided_by, headline
from qwenvl_rbln.memory.workspaces import (
    LM_WORKSPACE_FORMULA,
    LM_WORKSPACE_RANGE,
    VISUAL_WORKSPACE_FORMULA,
    VISUAL_WORKSPACE_RANGE,
)
from qwenvl_rbln.planning.catalogue.devices import MAX_CARD_BYTES, SIZE_SPELLINGS, GiB, NpuSpec, parse_byte_size

SOURCE_SPEC = "optimum-rbln 0.12 DRAM spec"
SOURCE_OVERRIDE = "--device-memory"
FITS, DOES_NOT_FIT, UNCERTAIN = "fits", "does_not_fit", "uncertain"


def gib(n: float) -> float:
    return n / GiB


def fmt_gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


@dataclass
class MemoryItem:
    name: str
    bytes: int
    exact: bool
    formula: str
    note: str = ""
    calibrated: bool = False
    low_bytes: int | None = None  # filled from the low / high scenarios (exact items: = bytes)
    high_bytes: int | None = None
    whole: list[int] = field(default_factory=list)  # single tensors the chiplet view places whole

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("whole")
        return d


@dataclass
class DeviceMemory:
    device: int
    usable_bytes: int
    items: list[MemoryItem]
    chiplets: dict[str, Any]
    fits: bool | None
    notes: list[str] = field(default_factory=list)
    verdict: str = FITS
    verdict_source: str = "planner"
    total_low_bytes: int | None = None
    total_high_bytes: int | None = None
    ok: bool = True  # this scenario alone: pooled and fullest chiplet within usable, KV search not insufficient
    decided_by: dict[str, Any] = field(default_factory=dict)  # memory.binding.decided_by, set with the verdict

    @property
    def total_bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    @property
    def free_bytes(self) -> int:
        return self.usable_bytes - self.total_bytes

    def to_dict(self) -> dict[str, Any]:
        low = self.total_low_bytes if self.total_low_bytes is not None else self.total_bytes
        high = self.total_high_bytes if self.total_high_bytes is not None else self.total_bytes
        return {
            "device": self.device,
            "usable_bytes": self.usable_bytes,
            "items": [i.to_dict() for i in self.items],
            "total_bytes": self.total_bytes,
            "total_low_bytes": low,
            "total_high_bytes": high,
            "free_bytes": self.free_bytes,
            "free_low_bytes": self.usable_bytes - high,
            "free_high_bytes": self.usable_bytes - low,
            "verdict": self.verdict,
            "verdict_source": self.verdict_source,
            "fits": self.fits,
            "chiplets": self.chiplets,
            "notes": self.notes,
            "decided_by": self.decided_by,
        }


@dataclass
class MemoryReport:
    npu: str
    usable_bytes: int
    usable_source: str
    devices: list[DeviceMemory]
    kv: dict[str, Any]
    suggestions: list[dict[str, Any]]
    assumptions: list[str]
    notes: list[str]

    @property
    def verdict(self) -> str:
        verdicts = {d.verdict for d in self.devices}
        if DOES_NOT_FIT in verdicts:
            return DOES_NOT_FIT
        return UNCERTAIN if UNCERTAIN in verdicts else FITS

    @property
    def fits(self) -> bool | None:
        """True: fits in every scenario; False: does not fit; None: uncertain (the margin is inside the range)."""
        return {FITS: True, DOES_NOT_FIT: False, UNCERTAIN: None}[self.verdict]

    @property
    def margin_bytes(self) -> int:
        return min(d.free_bytes for d in self.devices)

    @property
    def margin_low_bytes(self) -> int:
        """The worst-case margin: every modelled item at its high end."""
        return min(d.usable_bytes - (d.total_high_bytes or d.total_bytes) for d in self.devices)

    def device(self, device_id: int) -> DeviceMemory:
        for d in self.devices:
            if d.device == device_id:
                return d
        raise KeyError(device_id)

    def to_dict(self) -> dict[str, Any]:
        out = self._fields()
        deciding = next(iter(deciding_devices(out)), None)
        out["decided_by"] = {"device": deciding["device"], **device_decided_by(deciding, self.kv)} if deciding else {}
        out["headline"] = headline(out)
        return out

    def _fields(self) -> dict[str, Any]:
        return {
            "npu": self.npu,
            "usable_bytes": self.usable_bytes,
            "usable_source": self.usable_source,
            "devices": [d.to_dict() for d in self.devices],
            "verdict": self.verdict,
            "fits": self.fits,
            "margin_bytes": self.margin_bytes,
            "margin_low_bytes": self.margin_low_bytes,
            "kv": self.kv,
            "notes": self.notes,
            "suggestions": self.suggestions,
            "assumptions": self.assumptions,
        }


ASSUMPTIONS = [
    "verdict: each device is estimated three times, every modelled item at its low end, at its estimate and at its "
    "high end (automatic KV sizing re-run each time); 'fits' when the device fits in all three, 'does_not_fit' "
    "when in none, 'uncertain' otherwise; a device fits a scenario when the sum of its items <= its usable bytes "
    "AND the fullest chiplet fits its share",
    "observed: a configuration the product document describes (Qwen3-VL-2B, RBLN-CR13, ViT bucket 16384, flash "
    "partition 8192, automatic KV blocks, bf16) keeps the verdict the document reports, cited in verdict_source",
    "chiplets: KV tensors whole, round-robin over the chiplets; single ViT workspace tensors (the S x S score and "
    "probability buffers, the masks) placed whole on the least-filled chiplet, largest first; weights and the rest "
    "split evenly",
    "usable bytes: chiplets x (DRAM / chiplets - reserve) as optimum-rbln 0.12 computes it (Rebel100: "
    "4 x (36 - 1) GiB = 140 GiB), unless --device-memory gives a measured figure",
    "weights: exact parameter counts x dtype bytes (bf16 = 2 for RBLN artifacts); token embedding, ViT patch "
    "and position embeddings run on the host; with rbln_config.quantization the q/k/v/o/gate/up/down weights take "
    "1 byte (int8, fp8) or 0.5 (int4) + an fp32 scale per output channel and everything else fp32 (optimum-rbln "
    "0.12 get_quantized_model loads quantized models in float32), range low = the rest in bf16",
    "KV cache: 2 x layers tensors [blocks, kv_heads, block, head_dim] in the model dtype (fp8 kv_caches: 1 byte; "
    "a quantized model without fp8 KV: fp32), each aligned up to 2 MiB; one pool shared by prefill and all "
    "decoder graphs",
    "automatic KV blocks (flash, kvcache_num_blocks 0): optimum-rbln 0.12 sizes the pool for the LM graphs alone "
    "(the ViT is not counted), against one device's nominal DRAM x memory_budget (a byte budget is per device), "
    "fullest chiplet deciding",
    "lm.workspace (modelled): " + LM_WORKSPACE_FORMULA + "; " + LM_WORKSPACE_RANGE,
    "visual.workspace (modelled, hypothesis): " + VISUAL_WORKSPACE_FORMULA + "; bucket graphs share one .rbln "
    "and one buffer region, so the largest bucket decides; " + VISUAL_WORKSPACE_RANGE,
    "not counted: host memory, other processes on the NPU, runtime overhead beyond the per-chiplet reserve, "
    "profiler buffers, LoRA adapters",
]


def parse_device_memory(device_memory: int | str | None, spec: NpuSpec | None = None) -> int | None:
    """--device-memory as bytes (None when not given); one-line input errors for anything unusable: no unit,
    not positive, or more than the card's physical DRAM (``spec``; without it, the largest card qvl knows)."""
    if device_memory is None:
        return None
    try:
        nbytes = parse_byte_size(device_memory, "--device-memory")
    except InputError as exc:
        raise InputError(exc.message, f"pass --device-memory as the usable bytes per NPU, {SIZE_SPELLINGS}") from None
    if nbytes <= 0:
        raise InputError(f"--device-memory={device_memory!r} must be positive", f"write {SIZE_SPELLINGS}")
    limit = spec.total_bytes if spec is not None else MAX_CARD_BYTES
    if nbytes > limit:
        card = f"one {spec.product} ({spec.sku})" if spec is not None else "any NPU qvl knows (Rebel100)"
        raise InputError(
            f"--device-memory={device_memory!r} is more than the {fmt_gib(limit)} of DRAM on {card}",
            f"pass at most {limit // GiB}GiB (the usable bytes you measured, e.g. with rbln-smi)",
        )
    return nbytes


_parse_device_memory = parse_device_memory
