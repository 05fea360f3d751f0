"""The NPUs one batch worker holds, and how it numbers them: the one place that decides whether an artifact's ViT
sits on NPUs of its own (then a worker takes the LM's NPUs and the ViT's, e.g. a pair) and how those ids are
renumbered inside a Ray actor.

``WorkerNpus.of(placement)`` reads the placement ``runner.place`` resolves (``{"device", "visual_device"}``, each
an NPU id or a list of ids, as the host numbers them). The driver sizes the pool by ``count``, the Ray pool hands
each actor ``seen()`` (Ray sets ``RBLN_DEVICES`` to the host ids it gave the actor, and the runtime inside numbers
them from 0, in the order of the host ids: docs/many-npus-ray.md states this assumption and how to check it on a
node), and the records name ``label`` (host ids). Pure data: no Ray, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qwenvl_rbln.memory.placement import device_list

Ids = int | list[int]


@dataclass(frozen=True)
class WorkerNpus:
    """Where one worker's LM graphs (``device``) and ViT (``visual_device``) load: an NPU id, or a list of them."""

    device: Ids = 0
    visual_device: Ids = 0

    @classmethod
    def of(cls, placement: Mapping[str, Any] | None) -> WorkerNpus:
        """From a resolved placement (None, e.g. the torch backend: one worker, one NPU 0)."""
        if not placement:
            return cls()
        device = placement.get("device", 0)
        return cls(device, placement.get("visual_device", device))

    @property
    def host_ids(self) -> list[int]:
        """Every NPU the worker holds: the LM's, then the ViT's that the LM does not use."""
        ids = device_list(self.device)
        return ids + [i for i in device_list(self.visual_device) if i not in ids]

    @property
    def count(self) -> int:
        """NPUs per worker: 1 when the ViT shares the LM's NPU, 2 for a ViT on its own NPU (more for lists)."""
        return len(self.host_ids)

    @property
    def own_vit(self) -> bool:
        """The ViT is placed on NPUs the LM does not use."""
        return not set(device_list(self.visual_device)) & set(device_list(self.device))

    def seen(self) -> WorkerNpus:
        """The same placement as a process whose ``RBLN_DEVICES`` lists exactly these NPUs sees it: each host id
        replaced by its rank among them (LM on host 2 and ViT on host 3 -> 0 and 1; LM 3, ViT 2 -> 1 and 0)."""
        rank = {host: i for i, host in enumerate(sorted(self.host_ids))}

        def renumber(ids: Ids) -> Ids:
            return [rank[i] for i in ids] if isinstance(ids, list) else rank[ids]

        return WorkerNpus(renumber(self.device), renumber(self.visual_device))

    @property
    def label(self) -> Any:
        """How a record names these NPUs: one id, or the list."""
        return host_label(self.host_ids)


def host_label(ids: Sequence[int]) -> Any:
    """One NPU as its id, several as the list, none as None (the torch backend)."""
    ids = list(ids)
    if not ids:
        return None
    return ids[0] if len(ids) == 1 else ids


def visible_ids(value: str | None) -> list[int]:
    """The host NPU ids of an ``RBLN_DEVICES`` value (``"2,3"`` -> ``[2, 3]``)."""
    return [int(x) for x in (value or "").split(",") if x.strip().isdigit()]
