"""The ids seen so far in an input, for refusing duplicates, in memory that stays small.

A dict of the ids themselves held ~125 bytes an id (130 MB for a million string ids, the
largest part of a streamed job's memory). Here an id is a 128-bit BLAKE2b digest of its
canonical form in an open-addressing table of NumPy arrays, at most half full: 24 bytes a slot,
under 50 bytes an id (arrays from the standard library: their items read as Python ints
several times faster than NumPy's scalars, measured). Two different ids share a digest with probability ~n^2 / 2^129
(1e-27 for ten million ids): not a practical concern.
"""

from __future__ import annotations

import hashlib
from array import array

NUMBER, TEXT = 1, 0


def canonical(rid: str | int | float) -> bytes:
    """Equal ids give equal bytes, as Python compares them (1 == 1.0; 1 != "1")."""
    if isinstance(rid, str):
        return b"s" + rid.encode("utf-8", "surrogatepass")
    if isinstance(rid, float) and rid.is_integer():
        return b"n" + str(int(rid)).encode()
    return b"n" + (str(rid) if isinstance(rid, int) else repr(rid)).encode()


class IdTable:
    def __init__(self, capacity: int = 1 << 12):
        self._alloc(capacity)
        self.count = 0

    def _alloc(self, capacity: int) -> None:
        self.hi = array("Q", [0]) * capacity  # no temporary of the same size (bytes(8 * n))
        self.lo = array("Q", [0]) * capacity
        self.row = array("q", [0]) * capacity  # 0: empty; else row * 2 + kind
        self.mask = capacity - 1

    def first(self, key: bytes, row: int, kind: int) -> tuple[int, int] | None:
        """(row, kind) where `key` was first seen; None (and `key` recorded at `row`) when new."""
        digest = hashlib.blake2b(key, digest_size=16).digest()
        hi, lo = int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")
        found = self._probe(hi, lo)
        if found is not None:
            return found
        if 2 * (self.count + 1) > len(self.row):
            self._grow()
        self._insert(hi, lo, row * 2 + kind)
        self.count += 1
        return None

    def _probe(self, hi: int, lo: int) -> tuple[int, int] | None:
        i = lo & self.mask
        while self.row[i]:
            if self.lo[i] == lo and self.hi[i] == hi:
                return self.row[i] >> 1, self.row[i] & 1
            i = (i + 1) & self.mask
        return None

    def _insert(self, hi: int, lo: int, value: int) -> None:
        i = lo & self.mask
        while self.row[i]:
            i = (i + 1) & self.mask
        self.hi[i], self.lo[i], self.row[i] = hi, lo, value

    def _grow(self) -> None:
        old = self.hi, self.lo, self.row
        self._alloc(2 * len(self.row))
        for hi, lo, value in zip(*old):
            if value:
                self._insert(hi, lo, value)
