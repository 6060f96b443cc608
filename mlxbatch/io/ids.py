"""The ids seen so far in an input, for refusing duplicates: 128-bit digests in an
open-addressing table (under 50 bytes an id; a collision is ~n^2 / 2^129)."""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_left

NUMBER, TEXT = 1, 0


class JsonNumber(float):
    """A JSON number with a fraction or exponent, as written (`1e2`, `1.0`, `-0.0`): its value
    for arithmetic, its text for output, so an id is echoed and told apart exactly as given."""

    def __new__(cls, text: str):
        number = float.__new__(cls, text)
        number.text = text
        return number

    def __repr__(self) -> str:
        return self.text

    def __reduce__(self):
        return JsonNumber, (self.text,)


def canonical(rid: str | int | float) -> bytes:
    """Equal ids give equal bytes: strings and integers by value (1 != "1"), a JSON number
    with a fraction or exponent as written (1.0, 1e2 and 1 are three ids)."""
    if isinstance(rid, str):
        return b"s" + rid.encode("utf-8", "surrogatepass")
    if isinstance(rid, JsonNumber):
        return b"f" + rid.text.encode()
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


class DuplicateIds:
    """The rows whose id repeats an earlier row's, as one pass found them (16 bytes each), so a
    later pass over the same input needs no table of ids."""

    def __init__(self):
        self.rows, self.firsts = array("q"), array("q")

    def add(self, row: int, first: int, kind: int) -> None:
        if self.rows and row <= self.rows[-1]:
            raise ValueError("rows are added in increasing order")
        self.rows.append(row)
        self.firsts.append(first * 2 + kind)

    def get(self, row: int) -> tuple[int, int] | None:
        """(first row, its kind) of `row`'s id, or None when `row`'s id is its first."""
        i = bisect_left(self.rows, row)
        if i < len(self.rows) and self.rows[i] == row:
            return self.firsts[i] >> 1, self.firsts[i] & 1
        return None

    def __len__(self) -> int:
        return len(self.rows)
