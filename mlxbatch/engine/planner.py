"""Host-side batch planning, pure Python: order items, cut batches, count padding."""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("sorted", "naive", "sequential")
DEFAULT_MAX_BATCH = 64


@dataclass(frozen=True)
class Batch:
    indices: tuple[int, ...]  # positions in the input
    width: int  # longest item: every row is padded to it

    @property
    def padded_tokens(self) -> int:
        return self.width * len(self.indices)


def plan_batches(lengths: list[int], mode: str, batch_tokens: int, max_batch: int) -> list[Batch]:
    """Cut items into batches.

    sequential: one item per batch, input order. naive: `max_batch` items per batch in input
    order. sorted: longest first, each batch filled while rows x width <= batch_tokens and
    rows <= max_batch. Every item appears in exactly one batch.
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if batch_tokens < 1 or max_batch < 1:
        raise ValueError("batch_tokens and max_batch must be positive")
    too_long = [i for i, n in enumerate(lengths) if n > batch_tokens]
    if too_long and mode == "sorted":
        i = too_long[0]
        raise ValueError(
            f"item {i} has {lengths[i]} tokens, more than --batch-tokens {batch_tokens}"
        )
    n = len(lengths)
    if mode == "sequential":
        groups = [[i] for i in range(n)]
    elif mode == "naive":
        groups = [list(range(s, min(s + max_batch, n))) for s in range(0, n, max_batch)]
    else:
        order = sorted(range(n), key=lambda i: (-lengths[i], i))
        groups, current = [], []
        for i in order:
            width = lengths[current[0]] if current else lengths[i]  # longest is first
            if current and ((len(current) + 1) * width > batch_tokens or len(current) >= max_batch):
                groups.append(current)
                current = []
            current.append(i)
        if current:
            groups.append(current)
    return [Batch(tuple(g), max(lengths[i] for i in g)) for g in groups]


@dataclass(frozen=True)
class PaddingStats:
    useful_tokens: int
    processed_tokens: int

    @property
    def overhead(self) -> float:
        """Share of processed tokens that are padding."""
        return 1 - self.useful_tokens / self.processed_tokens if self.processed_tokens else 0.0

    @property
    def factor(self) -> float:
        """Processed over useful tokens (the article's "3.7x" for pad-to-global-max)."""
        return self.processed_tokens / self.useful_tokens if self.useful_tokens else 1.0


def padding_stats(lengths: list[int], batches: list[Batch]) -> PaddingStats:
    return PaddingStats(sum(lengths), sum(b.padded_tokens for b in batches))


def global_max_stats(lengths: list[int]) -> PaddingStats:
    """Padding every item to the longest one in the whole input."""
    return PaddingStats(sum(lengths), len(lengths) * max(lengths, default=0))


def unsort(results_by_batch: list[tuple[Batch, list]], n: int) -> list:
    """Results back in input order, checking every item came back exactly once."""
    out: list = [None] * n
    seen = [False] * n
    for batch, rows in results_by_batch:
        for i, row in zip(batch.indices, rows, strict=True):
            if seen[i]:
                raise RuntimeError(f"item {i} was scored twice")
            seen[i] = True
            out[i] = row
    if not all(seen):
        raise RuntimeError(f"item {seen.index(False)} was never scored")
    return out
