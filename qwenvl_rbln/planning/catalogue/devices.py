"""NPU catalogue: the DRAM figures optimum-rbln 0.12 itself uses (``utils/runtime_utils.py``).

Rebel100 (RBLN-CR13): 144 GiB over 4 chiplets, 1 GiB system reserve per chiplet -> 140 GiB usable,
which is also what ``rbln-smi`` prints. ATOM (RBLN-CA*): 16 GiB, 288 MiB reserve, one chiplet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from qwenvl_rbln.errors import InputError

GiB = 1 << 30
MiB = 1 << 20

NPU_NAME = re.compile(r"^RBLN-C[AR]\d{2}$")


@dataclass(frozen=True)
class NpuSpec:
    sku: str
    product: str
    family: str  # "REBEL" or "ATOM": selects optimum-rbln's attention limits
    total_bytes: int
    chiplets: int
    reserve_per_chiplet: int

    @property
    def usable_per_chiplet(self) -> int:
        return self.total_bytes // self.chiplets - self.reserve_per_chiplet

    @property
    def usable_bytes(self) -> int:
        return self.usable_per_chiplet * self.chiplets

    def to_dict(self) -> dict:
        return {
            "sku": self.sku,
            "product": self.product,
            "family": self.family,
            "total_bytes": self.total_bytes,
            "chiplets": self.chiplets,
            "reserve_per_chiplet_bytes": self.reserve_per_chiplet,
            "usable_bytes": self.usable_bytes,
        }


def npu_spec(name: str) -> NpuSpec:
    """Spec for an SKU; the family decides limits exactly as optimum-rbln's prefix check does."""
    if not isinstance(name, str) or not NPU_NAME.match(name):
        raise InputError(
            f"unknown npu name {name!r}",
            "use an RBLN SKU such as RBLN-CR13 (Rebel100) or RBLN-CA25 (ATOM)",
        )
    if name.startswith("RBLN-CR"):
        product = "Rebel100" if name == "RBLN-CR13" else f"REBEL ({name})"
        return NpuSpec(name, product, "REBEL", 144 * GiB, 4, 1 * GiB)
    return NpuSpec(name, f"ATOM ({name})", "ATOM", 16 * GiB, 1, 288 * MiB)


_UNITS = {
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": MiB,
    "mb": MiB,
    "mib": MiB,
    "g": GiB,
    "gb": GiB,
    "gib": GiB,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
SIZE_SPELLINGS = "a number with a unit: B, KiB, MiB, GiB, TiB (KB/MB/GB/TB and K/M/G/T read as binary too), e.g. 120GiB"

# The largest DRAM of any NPU in the catalogue: a --device-memory above it is no card at all.
MAX_CARD_BYTES = 144 * GiB


def parse_byte_size(value: str | int | float, what: str = "size") -> int:
    """qvl's own sizes ('120GiB', '512MB', '1.5TiB'): binary units, and a unit is required in text
    ('120' would silently mean 120 bytes). An int from Python code is bytes."""
    if isinstance(value, bool):
        raise InputError(f"{what}={value!r} is not a size", f"write {SIZE_SPELLINGS}")
    if isinstance(value, int | float):
        return int(value)
    match = _SIZE.match(str(value))
    unit = match.group(2).lower() if match else None
    if not match or not unit or unit not in _UNITS:
        why = "has no unit" if match and not unit else "is not a size"
        raise InputError(f"{what}={value!r} {why}", f"write {SIZE_SPELLINGS}")
    return int(float(match.group(1)) * _UNITS[unit])


# optimum-rbln 0.12 utils/runtime_utils.py::parse_byte_size: re.fullmatch(r"\s*(\d+)\s*([KMGT]?B)?\s*", re.I)
_OPTIMUM_SIZE = re.compile(r"\s*(\d+)\s*([KMGT]?B)?\s*", re.IGNORECASE)
_OPTIMUM_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
OPTIMUM_SIZE_SPELLINGS = (
    "a whole number of bytes, optionally with B, KB, MB, GB or TB (binary: GB = 2**30), e.g. '100GB' or '512MB'"
)


def parse_optimum_byte_size(value: str | int) -> int | None:
    """Bytes exactly as optimum-rbln's ``parse_byte_size`` reads them, or None where it raises
    (``'100GiB'``, ``'1.5GB'``, ``'100G'`` are all refused there, after every LM graph has compiled)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if not isinstance(value, str):
        return None
    match = _OPTIMUM_SIZE.fullmatch(value)
    if not match:
        return None
    unit = match.group(2)
    nbytes = int(match.group(1)) * (_OPTIMUM_UNITS[unit.upper()] if unit else 1)
    return nbytes if nbytes > 0 else None


def optimum_size_text(nbytes: int) -> str:
    """A spelling of ``nbytes`` (rounded down to a whole unit) that optimum-rbln's parse_byte_size accepts."""
    for unit in ("TB", "GB", "MB", "KB"):
        size = _OPTIMUM_UNITS[unit]
        if nbytes >= size:
            return f"{nbytes // size}{unit}"
    return f"{nbytes}B"


# --- compute and bandwidth: the figures a roofline is drawn from (qvl tune) ------------------------------------

TOMS_HARDWARE_ISSCC = (
    "Tom's Hardware, 'ISSCC 2026: Rebellions details ... Rebel 100' (2026-03-02): 2 FP8 PFLOPS or 1 FP16 PFLOPS "
    "without sparsity at 600 W; four NPU dies, each with one 12-Hi HBM3E 36 GB stack"
)
HBM_BANDWIDTH_SOURCE = (
    "Rebel Quad press coverage (AMD AI news weekly recap, 2025-12-28): 4.8 TB/s aggregate HBM3E bandwidth"
)
EFFECTIVE_BANDWIDTH_SOURCE = (
    "rebellions.ai, 'Peta-Scale SoC for Massive AI Serving: REBEL-Quad': 2.7 TB/s effective bandwidth with "
    "software-tuned DMA (a vendor figure for what DMA sustains, not the HBM peak)"
)


@dataclass(frozen=True)
class ComputeSpec:
    """Published peak figures of one NPU card, each with its source: what a roofline bound is drawn from.
    Peak figures, not measured: a roofline from them is a lower bound on time (an upper bound on speed)."""

    sku: str
    fp16_flops: float  # dense FP16/BF16 FLOP/s
    fp8_flops: float  # dense FP8 FLOP/s
    hbm_bytes_per_s: float  # peak HBM bandwidth, all chiplets together
    effective_bytes_per_s: float  # what the vendor says its DMA sustains
    chiplets: int
    sources: tuple[tuple[str, str], ...]  # (figure, citation)

    def to_dict(self) -> dict:
        return {
            "sku": self.sku,
            "fp16_flops": self.fp16_flops,
            "fp8_flops": self.fp8_flops,
            "hbm_bytes_per_s": self.hbm_bytes_per_s,
            "effective_bytes_per_s": self.effective_bytes_per_s,
            "chiplets": self.chiplets,
            "sources": [{"figure": f, "source": s} for f, s in self.sources],
        }


REBEL100_COMPUTE = ComputeSpec(
    sku="RBLN-CR13",
    fp16_flops=1.0e15,
    fp8_flops=2.0e15,
    hbm_bytes_per_s=4.8e12,
    effective_bytes_per_s=2.7e12,
    chiplets=4,
    sources=(
        ("1 PFLOPS dense FP16, 2 PFLOPS dense FP8, 4 chiplets", TOMS_HARDWARE_ISSCC),
        ("4.8 TB/s HBM3E", HBM_BANDWIDTH_SOURCE),
        ("2.7 TB/s effective (DMA)", EFFECTIVE_BANDWIDTH_SOURCE),
    ),
)


def compute_spec(sku: str) -> ComputeSpec:
    """The published compute figures of an SKU; only Rebel100 (RBLN-CR13) has cited ones."""
    if sku == "RBLN-CR13":
        return REBEL100_COMPUTE
    raise InputError(
        f"npu {sku!r}: no published compute and bandwidth figures in qvl's catalogue (only RBLN-CR13 has cited ones)",
        "tune for npu RBLN-CR13 (Rebel100)",
    )
