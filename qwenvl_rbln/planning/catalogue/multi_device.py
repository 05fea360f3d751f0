"""One submodule over several NPUs (``num_devices > 1``): refused on Rebel100 unless forced, and why.

Its own module because the compile, its dry run and ``qvl serve`` refuse the same thing with the same reasons.
optimum-rbln 0.12 splits nothing in Python: it hands ``num_devices`` to ``rebel.compile_from_torch`` and the
compiler decides (``modeling_base.py``), so qvl can neither vouch for the split's memory nor for its support.
"""

from __future__ import annotations

from qwenvl_rbln.errors import InputError

SINGLE_DEVICE_SKU_PREFIX = "RBLN-CR"  # Rebel100 (RBLN-CR13): one card, four chiplets the compiler uses itself
REASONS = (
    "Rebellions' Rebel100 documentation compiles every example for one NPU (num_devices 1 for the visual "
    "submodule and the LM: docs.rbln.ai Qwen3-VL-2B Rebel100 tutorial, v0.12 support matrix)",
    "vllm-rbln allows one device per rank on Rebel100 (num_devices_per_local_rank accepts only 1: its "
    "configuration guide and fine-grained device assignment pages)",
)


def split_submodules(num_devices: int, visual_num_devices: int) -> list[str]:
    """The submodules compiled over more than one NPU, as ``key=value`` for messages."""
    out = []
    if num_devices > 1:
        out.append(f"num_devices={num_devices}")
    if visual_num_devices > 1:
        out.append(f"visual.num_devices={visual_num_devices}")
    return out


def multi_device_refusal(npu: str | None, num_devices: int, visual_num_devices: int, what: str) -> InputError | None:
    """The refusal for a multi-device submodule on a Rebel100 (``what``: the command's words), else None."""
    split = split_submodules(num_devices, visual_num_devices)
    if not split or not str(npu or "").upper().startswith(SINGLE_DEVICE_SKU_PREFIX):
        return None
    return InputError(
        f"{what}: {' and '.join(split)} on {npu} is refused: {REASONS[0]}; {REASONS[1]}",
        "compile each submodule for one Rebel100 (--set num_devices=1 --set visual.num_devices=1; put the ViT on "
        "its own card with --set placement.visual_device=1), or pass --force to go ahead anyway",
    )
