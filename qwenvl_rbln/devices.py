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
    "": 1,
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


def parse_byte_size(value: str | int | float, what: str = "size") -> int:
    """'120GiB', '512MB', 2**30 -> bytes. Binary units, as optimum-rbln's parse_byte_size."""
    if isinstance(value, bool):
        raise InputError(f"{what}={value!r} is not a size", "write e.g. 120GiB or 512MiB")
    if isinstance(value, int | float):
        return int(value)
    match = _SIZE.match(str(value))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise InputError(f"{what}={value!r} is not a size", "write e.g. 120GiB, 512MiB or a number of bytes")
    return int(float(match.group(1)) * _UNITS[unit])
