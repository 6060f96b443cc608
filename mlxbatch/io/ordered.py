"""Rows to a stream (standard output, a pipe, a device) in input order, as soon as every earlier
row is known: the sink of an output that cannot be journaled."""

from __future__ import annotations

import sys
from typing import TextIO

from ..errors import OutputError
from .rows import write_rows


class OrderedStream:
    """JSONL rows to a stream (stdout by default) in input order; no journal to resume."""

    def __init__(
        self, n_rows: int, labels: tuple[str, ...], header: dict, stream: TextIO | None = None
    ):
        self.done: dict[int, dict] = {}
        self.header = header
        self.next, self.n, self.labels = 0, n_rows, labels
        self.stream = stream

    def append(self, rows: list[tuple[int, dict]]) -> None:
        self.done.update(rows)
        start = self.next
        while self.next in self.done:
            self.next += 1
        if self.next > start:
            out = self.stream or sys.stdout
            try:  # printed rows leave memory: only those waiting for an earlier one stay
                write_rows(
                    out, [self.done.pop(i) for i in range(start, self.next)], self.labels, ""
                )
                out.flush()
            except BrokenPipeError:
                raise
            except OSError as e:
                name = getattr(out, "name", "standard output")
                raise OutputError(f"{name}: cannot write ({e.strerror or e})") from None

    def finish(self, n_rows: int, labels: tuple[str, ...]) -> None:
        if self.next != self.n:
            raise RuntimeError(f"only {self.next} of {self.n} rows were printed")
        self.close()

    def abandon(self) -> None:
        self.close()

    def close(self) -> None:
        if self.stream is not None and not self.stream.closed:
            try:
                self.stream.close()
            except OSError:
                pass  # the write error was reported already
