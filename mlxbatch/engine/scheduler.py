"""The scheduler every entry scores through: `add` prepared items, then `step` (schedule,
run over the lanes, postprocess). Keys are the caller's, so there is one index space."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from .engine import Engine
from .item import Item
from .planner import MODES, SORTED_PLANNERS, Batch, CostModel, mode_name, plan, unsort


@dataclass(frozen=True)
class BatchPolicy:
    """How queued items are cut into batches and scored: part of the run's settings, resolved
    once (api/spec.py)."""

    planner: str  # "cost" | "greedy" | "naive" | "sequential" (planner.plan)
    scorer: str  # "fast" | "gold"
    batch_tokens: int  # the budget: declared, or the device's preferred within memory
    max_batch: int
    cost: CostModel | None = None  # the cost planner's model

    @staticmethod
    def step(mode: str, planner: str = "cost") -> tuple[str, str]:
        """The (planner, scorer) of `mode`; `planner` chooses the sorted mode's cut."""
        mode = mode_name(mode)
        if mode != "sorted":
            return MODES[mode]
        if planner not in SORTED_PLANNERS:
            raise ValueError(f"planner {planner!r} is not one of {', '.join(SORTED_PLANNERS)}")
        return planner, MODES[mode][1]

    @classmethod
    def of_mode(
        cls, mode: str, planner: str, batch_tokens: int, max_batch: int, cost: CostModel | None
    ) -> BatchPolicy:
        """The policy of `mode` (`cost`: kept for the cost planner alone)."""
        planner, scorer = cls.step(mode, planner)
        return cls(planner, scorer, batch_tokens, max_batch, cost if planner == "cost" else None)


@dataclass(frozen=True)
class BatchRecord:
    """What one scored batch did (for the service's metrics and the job's statistics)."""

    rows: int
    width: int
    padded_tokens: int
    useful_tokens: int
    seconds: float  # inference, this batch's share of its round
    predicted_seconds: float | None
    queue_seconds: tuple[float, ...]  # per item: arrival to the start of its batch
    prefix_tokens_saved: int  # shared-prefix tokens its rows did not recompute


class Scheduler:
    """Items queued by key; `plan` cuts them, `step` scores them (schedule, run, postprocess)."""

    def __init__(self, engine: Engine, policy: BatchPolicy, items: Iterable[Item] = ()):
        """`items`: prepared items to `add` at once."""
        self.engine, self.policy = engine, policy
        self._queue: OrderedDict[Hashable, Item] = OrderedDict()  # in arrival order
        self._arrived: dict[Hashable, float] = {}
        for item in items:
            self.add(item)

    def add(self, item: Item, arrived: float | None = None) -> None:
        if item.key in self._queue:
            raise KeyError(f"item {item.key!r} is already queued")
        self._queue[item.key] = item
        self._arrived[item.key] = time.monotonic() if arrived is None else arrived

    @property
    def queued(self) -> int:
        return len(self._queue)

    def keys(self) -> list[Hashable]:
        """The queued items' keys, in arrival order."""
        return list(self._queue)

    def queued_tokens(self) -> int:
        return sum(item.fed for item in self._queue.values())

    def oldest(self) -> float | None:
        """When the longest-waiting queued item arrived (None: nothing is queued)."""
        return next(iter(self._arrived.values()), None)

    def longest(self) -> int:
        """The most tokens a queued item feeds."""
        return max((item.fed for item in self._queue.values()), default=0)

    def remove(self, drop: Callable[[Hashable], bool]) -> int:
        """Drop the queued items whose key `drop` holds for (a request nobody waits for now);
        how many."""
        keys = [k for k in self._queue if drop(k)]
        for k in keys:
            del self._queue[k], self._arrived[k]
        return len(keys)

    def clear(self) -> None:
        """Drop everything queued (a failed round, a closed service)."""
        self._queue.clear()
        self._arrived.clear()

    def budget(self, longest: int) -> int:
        """The batch budget for a plan whose longest item feeds `longest` tokens: the policy's,
        raised to fit that item (an item over the budget gets a batch of its own: one row, its
        memory checked by the item limit, resolved with the budget)."""
        return max(self.policy.batch_tokens, longest)

    def plan(self, keys: list[Hashable] | None = None) -> list[Batch]:
        """Batches of `keys` (default: everything queued) under the policy; indices are keys."""
        keys = list(self._queue) if keys is None else keys
        lengths = [self._queue[k].fed for k in keys]
        if not keys:
            return []
        p = self.policy
        cut = plan(
            lengths,
            p.planner,
            self.budget(max(lengths)),
            p.max_batch,
            p.cost,
            *self.engine.cost_terms(),
        )
        return [Batch(tuple(keys[i] for i in b.indices), b.width) for b in cut]

    def step(
        self,
        batches: list[Batch] | None = None,
        lanes: int | None = None,
        first: Callable[[Hashable], tuple] | None = None,
    ) -> Iterator[tuple[Batch, np.ndarray, BatchRecord]]:
        """Schedule, run, postprocess: score `batches` of queued keys (default: `plan()` of all;
        with `lanes`, only that many, first by `first(key)`), yielding (batch, probabilities,
        record) in order."""
        batches = self.plan() if batches is None else batches
        if lanes is not None:
            if first is None:
                rank = {k: (n,) for n, k in enumerate(self._queue)}  # arrival order
                first = rank.__getitem__
            batches = sorted(batches, key=lambda b: min(map(first, b.indices)))[:lanes]
        prompts = {k: self._queue[k].prompt for b in batches for k in b.indices}
        started = last = time.monotonic()
        done = self.engine.run(prompts, batches, self.policy.scorer)
        try:
            for batch, probs in done:
                now = time.monotonic()
                record = self._record(batch, now - last, started)
                last = now
                for k in batch.indices:
                    del self._queue[k], self._arrived[k]
                yield batch, probs, record
        finally:
            done.close()

    def _record(self, batch: Batch, seconds: float, started: float) -> BatchRecord:
        items = [self._queue[k] for k in batch.indices]
        rows, useful = len(items), sum(item.fed for item in items)
        predicted = None
        if self.policy.cost is not None:
            terms = self.engine.cost_terms()
            predicted = float(self.policy.cost.seconds(rows, batch.width, *terms))
        waited = tuple(max(0.0, started - self._arrived[k]) for k in batch.indices)
        shared = sum(item.shared for item in items) if self.policy.scorer == "fast" else 0
        return BatchRecord(
            rows, batch.width, rows * batch.width, useful, seconds, predicted, waited, shared
        )


def positional_items(engine: Engine, prompts: list[list[int]]) -> list[Item]:
    """Items of prompts already tokenized, keyed by position (no limit applies: for plans and
    measurements of given prompts; texts become items through `api.limits.prepare`)."""
    return [Item(i, p, len(engine.fed(p))) for i, p in enumerate(prompts)]


def score_all(
    engine: Engine, prompts: list[list[int]], batches: list[Batch], scorer: str = "fast"
) -> np.ndarray:
    """Probabilities (N, J) of every prompt in input order, scored in the given `batches`
    (positions; bench times each planner's cut with it)."""
    items = positional_items(engine, prompts)
    policy = BatchPolicy("sequential", scorer, 1, 1)
    done = [(b, list(p)) for b, p, _ in Scheduler(engine, policy, items).step(batches)]
    return np.stack(unsort(done, len(prompts)))
