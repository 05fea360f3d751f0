"""Ids kept as 8-byte hashes, so a million-request job's duplicate check and ``--resume`` cost ~8 MB, not the ids.

``HashBuckets`` spreads the hashes over 256 ``array('Q')`` by their top byte: sorting one bucket at a time never
builds a Python list of every hash (a million ints as objects would be ~36 MB), and a lookup is a bisect in one
bucket. A hash shared by two different ids is resolved exactly by the callers (``source.check_unique_ids`` finds
such hashes; ``results.CompletedIds`` keeps the ids behind them).
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_left
from collections.abc import Iterator

_BUCKETS = 256


def id_hash(rid: str) -> int:
    """The 8-byte hash of a request id (any string: a results file may hold a lone surrogate escape that the
    batch file's ids never have, ``requests.request_id`` refuses those)."""
    return int.from_bytes(hashlib.blake2b(rid.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


class HashBuckets:
    """A multiset of 8-byte hashes: ``add``, then ``freeze`` (sorts), then ``in`` / ``repeated``."""

    def __init__(self) -> None:
        self._buckets = [array("Q") for _ in range(_BUCKETS)]
        self._frozen = False
        self.count = 0

    def add(self, h: int) -> None:
        self._buckets[h >> 56].append(h)
        self.count += 1
        self._frozen = False

    def freeze(self) -> HashBuckets:
        """Sort each bucket in place of itself (one bucket's list at a time)."""
        if not self._frozen:
            for i, bucket in enumerate(self._buckets):
                self._buckets[i] = array("Q", sorted(bucket))
            self._frozen = True
        return self

    def __len__(self) -> int:
        return self.count

    def __contains__(self, h: object) -> bool:
        if not isinstance(h, int):
            return False
        self.freeze()
        bucket = self._buckets[h >> 56]
        i = bisect_left(bucket, h)
        return i < len(bucket) and bucket[i] == h

    def repeated(self) -> Iterator[int]:
        """Each hash that was added more than once (once each)."""
        self.freeze()
        for bucket in self._buckets:
            for i in range(1, len(bucket)):
                if bucket[i] == bucket[i - 1] and (i < 2 or bucket[i - 1] != bucket[i - 2]):
                    yield bucket[i]
