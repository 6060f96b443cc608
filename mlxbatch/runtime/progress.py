"""Progress on stderr: a tqdm bar on a terminal; elsewhere nothing, or where the run asks
(`RunSpec.progress_every`) a plain line every so many seconds."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class Lines:
    """tqdm's `update`/`close` as one line every `every` seconds: done / total, elapsed, ETA."""

    def __init__(self, total: int, desc: str, initial: int, every: float):
        self.total, self.desc, self.n, self.every = total, desc, initial, every
        self.t0 = self.last = time.monotonic()
        self.start = initial  # rows done before this run: not counted in its pace

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            sys.stderr.write(self.line(now) + "\n")
            sys.stderr.flush()

    def line(self, now: float) -> str:
        elapsed, done = now - self.t0, self.n - self.start
        eta = (self.total - self.n) * elapsed / done if done else None
        return (
            f"{self.desc}: {self.n:,}/{self.total:,} items, {_clock(elapsed)} elapsed, "
            f"ETA {_clock(eta) if eta is not None else 'unknown'}"
        )

    def close(self) -> None:
        return None


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


def bar(total: int, desc: str, initial: int = 0, lines_every: float | None = None):
    """A bar on a terminal; else `Lines` when `lines_every` is given, else nothing shown."""
    if lines_every and not sys.stderr.isatty():
        return Lines(total, desc, initial, lines_every)
    out = tqdm(
        total=total, desc=desc, unit="item", file=sys.stderr, disable=None, dynamic_ncols=True
    )
    out.update(initial)
    return out
