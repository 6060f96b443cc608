"""Host-side batch planning, pure Python: order items, cut batches, count padding: one item a
batch, fixed-size batches, greedy under a token budget, or the least predicted time of a
`CostModel` (an exact DP over the sorted order, padding capped)."""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, fields

import numpy as np

PLANNERS = ("cost", "greedy", "naive", "sequential")
SIMPLE_PLANNERS = PLANNERS[1:]
DEFAULT_MAX_BATCH = 64

# The one mode table: what a mode means (classify's --mode, the API's mode=, bench's --modes),
# as the (planner, scorer) of its policy (scheduler.BatchPolicy). Only "sorted" lets
# --planner choose how its length-sorted items are cut ("cost": least predicted time;
# "greedy": fill the budget).
MODES = {
    "sorted": ("cost", "fast"),
    "naive": ("naive", "fast"),
    "sequential": ("sequential", "gold"),  # the gold loop
    "sequential-prefix": ("sequential", "fast"),  # one row per batch on the fast path
}
# other words for the same modes, taken everywhere a mode is (bench's --modes said these)
MODE_ALIASES = {"gold": "sequential", "prefix": "sequential-prefix"}
SORTED_PLANNERS = ("cost", "greedy")


def mode_name(word: str) -> str:
    """The mode `word` names (an alias is read as its mode); ValueError for none."""
    mode = MODE_ALIASES.get(word, word)
    if mode not in MODES:
        raise ValueError(f"mode {word!r} is not one of {', '.join(MODES)}")
    return mode


@dataclass(frozen=True)
class Batch:
    indices: tuple[int, ...]  # positions in the input
    width: int  # longest item: every row is padded to it

    @property
    def padded_tokens(self) -> int:
        return self.width * len(self.indices)


def plan_batches(
    lengths: list[int], planner: str, batch_tokens: int, max_batch: int
) -> list[Batch]:
    """Cut items into batches by one of the simple planners (see the module docstring); greedy
    fills a batch while rows x width <= batch_tokens and rows <= max_batch."""
    if planner not in SIMPLE_PLANNERS:
        raise ValueError(f"planner {planner!r} is not one of {', '.join(SIMPLE_PLANNERS)}")
    if batch_tokens < 1 or max_batch < 1:
        raise ValueError("batch_tokens and max_batch must be positive")
    too_long = [i for i, n in enumerate(lengths) if n > batch_tokens]
    if too_long and planner == "greedy":
        i = too_long[0]
        raise ValueError(
            f"item {i} has {lengths[i]} tokens, more than --batch-tokens {batch_tokens}"
        )
    n = len(lengths)
    if planner == "sequential":
        groups = [[i] for i in range(n)]
    elif planner == "naive":
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


@dataclass(frozen=True)
class CostModel:
    """Predicted seconds of one batch of `rows` x `width` tokens behind `prefix` tokens on one
    lane while the others run too; a plan takes the sum of its batches over `lanes`.

    per_batch: fixed cost (weights streamed once, kernel launches, host work);
    per_token: each padded token through the dense layers;
    per_key: each (padded token x attended key) pair of attention.
    """

    per_batch: float
    per_token: float
    per_key: float
    lanes: int = 1
    source: str = "default"

    def seconds(self, rows, width, prefix: int, label_rows: int = 0, label_len: int = 0):
        """Works on numbers or numpy arrays of rows/width."""
        tokens = rows * width
        work = self.per_token * tokens + self.per_key * tokens * (prefix + width)
        if label_rows and label_len:  # the teacher-forced pass of multi-token labels
            lab = rows * label_rows * label_len
            work = work + self.per_token * lab + self.per_key * lab * (prefix + width + label_len)
        return self.per_batch + work

    def plan_seconds(
        self, batches: list[Batch], prefix: int, label_rows: int = 0, label_len: int = 0
    ) -> float:
        """The predicted time of a whole plan: its batches shared among the lanes."""
        total = sum(
            self.seconds(len(b.indices), b.width, prefix, label_rows, label_len) for b in batches
        )
        return float(total) / max(self.lanes, 1)

    def constants(self) -> str:
        """The three constants in words (for `doctor`, progress lines and the bench report)."""
        return (
            f"{self.per_batch * 1e3:.1f} ms per batch + {self.per_token * 1e6:.1f} us per "
            f"token + {self.per_key * 1e9:.2f} ns per token-key pair"
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        """From `to_dict` output (unknown fields dropped); ValueError for edited bad constants."""
        if not isinstance(d, dict):
            raise ValueError(f"cost_model {d!r}"[:200])
        try:
            cost = cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
        except TypeError:  # a constant missing
            raise ValueError(f"cost_model {d!r}"[:200]) from None
        for name in ("per_batch", "per_token", "per_key"):  # named: a refused journal says which
            x = getattr(cost, name)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x < math.inf:
                raise ValueError(f"cost_model {name} {x!r}"[:200])
        lanes = cost.lanes
        if isinstance(lanes, bool) or not isinstance(lanes, int) or not 1 <= lanes <= sys.maxsize:
            raise ValueError(f"cost_model lanes {lanes!r}"[:200])
        if not isinstance(cost.source, str):
            raise ValueError(f"cost_model source {cost.source!r}"[:200])
        return cost


MAX_PADDING = 0.03  # the cost planner's cap on padding (share of processed tokens)


def plan_cost(
    lengths: list[int],
    cost: CostModel,
    prefix: int,
    batch_tokens: int,
    max_batch: int,
    label_rows: int = 0,
    label_len: int = 0,
    max_padding: float | None = MAX_PADDING,
) -> list[Batch]:
    """Longest first; the contiguous cut with the least predicted time (an exact DP) among those
    padding at most `max_padding` (None: no cap), met by the smallest Lagrange penalty per
    padded token that meets it (bisection). An item over `batch_tokens` gets a batch alone."""
    if batch_tokens < 1 or max_batch < 1:
        raise ValueError("batch_tokens and max_batch must be positive")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    width = np.array([lengths[i] for i in order], np.int64)
    args = (cost, prefix, batch_tokens, max_batch, label_rows, label_len)
    cuts = _cut(width, *args, 0.0)

    def padding(c: list[tuple[int, int]]) -> float:
        processed = sum((b - a) * int(width[a]) for a, b in c)
        return 1 - int(width.sum()) / processed if processed else 0.0

    if max_padding is not None and padding(cuts) > max_padding:
        lo, hi = 0.0, max(cost.per_batch, cost.per_token, 1e-9)
        cuts = _cut(width, *args, hi)  # `cuts` stays the plan at penalty `hi`
        while padding(cuts) > max_padding and hi < 1e6:
            hi *= 4
            cuts = _cut(width, *args, hi)
        for _ in range(12):
            mid = (lo + hi) / 2
            trial = _cut(width, *args, mid)
            if padding(trial) <= max_padding:
                hi, cuts = mid, trial
            else:
                lo = mid
    return [Batch(tuple(order[a:b]), int(width[a])) for a, b in cuts]


def _cut(
    width: np.ndarray,
    cost: CostModel,
    prefix: int,
    batch_tokens: int,
    max_batch: int,
    label_rows: int,
    label_len: int,
    penalty: float,
) -> list[tuple[int, int]]:
    """The DP over lengths sorted longest first: [start, end) of each batch, minimising
    predicted seconds + `penalty` per padded token."""
    n = len(width)
    before = np.concatenate([[0], np.cumsum(width)])  # tokens of the first i items
    best = np.zeros(n + 1)
    cut = np.zeros(n + 1, np.int64)  # best[i]: items [0, i); its last batch starts at cut[i]
    for i in range(1, n + 1):
        k = np.arange(1, min(max_batch, i) + 1)  # candidate last batches: [i - k, i)
        w = width[i - k]  # the first (longest) item of the batch sets its width
        total = best[i - k] + cost.seconds(k, w, prefix, label_rows, label_len)
        if penalty:
            total = total + penalty * (k * w - (before[i] - before[i - k]))
        total[(k * w > batch_tokens) & (k > 1)] = np.inf
        j = int(np.argmin(total))
        best[i], cut[i] = total[j], i - k[j]
    out, i = [], n
    while i > 0:
        out.append((int(cut[i]), i))
        i = int(cut[i])
    return out[::-1]


def plan(
    lengths: list[int],
    planner: str,
    batch_tokens: int,
    max_batch: int,
    cost: CostModel | None = None,
    prefix: int = 0,
    label_rows: int = 0,
    label_len: int = 0,
) -> list[Batch]:
    """Dispatch to a planner by name (see the module docstring)."""
    if planner not in PLANNERS:
        raise ValueError(f"planner {planner!r} is not one of {', '.join(PLANNERS)}")
    if planner == "cost":
        if cost is None:
            raise ValueError("the cost planner needs a cost model")
        return plan_cost(lengths, cost, prefix, batch_tokens, max_batch, label_rows, label_len)
    return plan_batches(lengths, planner, batch_tokens, max_batch)
