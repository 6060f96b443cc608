"""Which rows a journal holds, and where (see `RowIndex`)."""

from __future__ import annotations

import os

import numpy as np

from .rows import loads


class RowIndex:
    """Row index -> byte offset of its journal line (-1 where missing), 8 bytes a row: a job of
    millions of rows holds no result in memory, each is read back when asked for."""

    def __init__(self, fd: int):
        self.fd, self.count = fd, 0
        self.offsets = np.full(1024, -1, np.int64)

    def add(self, row: int, offset: int) -> None:
        if row >= len(self.offsets):
            grown = np.full(max(row + 1, 2 * len(self.offsets)), -1, np.int64)
            grown[: len(self.offsets)] = self.offsets
            self.offsets = grown
        self.count += self.offsets[row] < 0
        self.offsets[row] = offset

    def __contains__(self, row: int) -> bool:
        return 0 <= row < len(self.offsets) and self.offsets[row] >= 0

    def __len__(self) -> int:
        return int(self.count)

    def __iter__(self):
        return iter(np.nonzero(self.offsets >= 0)[0].tolist())

    def __getitem__(self, row: int) -> dict:
        if row not in self:
            raise KeyError(row)
        start, chunk, size = int(self.offsets[row]), b"", 1024  # a result line: ~200 bytes
        while not chunk.endswith(b"\n"):  # one line, read in growing blocks
            more = os.pread(self.fd, size, start + len(chunk))
            if not more:
                break
            chunk += more
            if b"\n" in more:
                chunk = chunk[: chunk.index(b"\n") + 1]
            size = min(2 * size, 1 << 20)
        return loads(chunk)["result"]

    def line_of(self, row: int) -> int:
        """The 1-based line of the journal that holds `row` (for messages: reads up to it)."""
        end, at, lines = int(self.offsets[row]), 0, 1
        while at < end:
            chunk = os.pread(self.fd, min(1 << 20, end - at), at)
            if not chunk:
                break
            lines, at = lines + chunk.count(b"\n"), at + len(chunk)
        return lines

    def get(self, row: int, default=None):
        return self[row] if row in self else default
