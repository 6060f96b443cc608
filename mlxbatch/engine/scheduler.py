"""The scheduler: work arrives, the planner cuts what is queued into batches, lanes score them.

nano-vllm's shape (`add_request`, then `step`: schedule, run, postprocess) serves both kinds of
work, and every entry (the Python API, the file job, its ranks, the service, bench) scores
through it: `add` prepared items (`item.Item`), then `step`: schedule (the planner cuts what is
queued, or the caller gives the batches of a plan it made with `plan`), run (through the lanes,
pipelined: a lane never waits for another), postprocess (each batch's items leave the queue as
its result is handed back). A file job adds a window's items and steps once through its plan;
arriving work (the service) is `LiveScheduler`: items queue from any thread, and its own thread
steps one batch per lane whenever the oldest item has waited `max_wait` or the queue holds a
full budget per lane. Keys are the caller's: a file job's input row numbers, a request's
(request, item) pairs; batches carry keys, so there is one index space.

Which batch an item lands in never changes its scores on the CPU float32 path (see
tests/test_invariance.py); elsewhere the plan is a pure function of the queued lengths and
the policy.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from .engine import Engine
from .item import Item
from .planner import Batch, CostModel, plan, unsort


@dataclass(frozen=True)
class BatchPolicy:
    """How queued items are cut into batches and scored: part of the run's settings, resolved
    once (api/spec.py)."""

    planner: str  # "cost" | "greedy" | "naive" | "sequential" (planner.plan)
    scorer: str  # "fast" | "gold"
    batch_tokens: int  # the budget: declared, or the device's preferred within memory
    max_batch: int
    cost: CostModel | None = None  # the cost planner's model


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


class QueueFull(Exception):
    def __init__(self, queued: int, limit: int, retry_after: float):
        super().__init__(f"the queue holds {queued} items, its limit is {limit}")
        self.retry_after = retry_after


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

    def queued_tokens(self) -> int:
        return sum(item.fed for item in self._queue.values())

    def oldest(self) -> float | None:
        """When the longest-waiting queued item arrived (None: nothing is queued)."""
        return next(iter(self._arrived.values()), None)

    def longest(self) -> int:
        """The most tokens a queued item feeds."""
        return max((item.fed for item in self._queue.values()), default=0)

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
        cut = plan(lengths, p.planner, self.budget(max(lengths)), p.max_batch, p.cost,
                   *self.engine.cost_terms())  # fmt: skip
        return [Batch(tuple(keys[i] for i in b.indices), b.width) for b in cut]

    def step(
        self, batches: list[Batch] | None = None, lanes: int | None = None
    ) -> Iterator[tuple[Batch, np.ndarray, BatchRecord]]:
        """Schedule, run, postprocess: score `batches` of queued keys (default: `plan()` of
        everything queued; with `lanes`, only that many, those holding the longest-waiting
        items first), pipelined over the lanes, yielding (batch, probabilities, record) in
        order; each batch's items leave the queue when its result is handed back."""
        batches = self.plan() if batches is None else batches
        if lanes is not None:
            rank = {k: n for n, k in enumerate(self._queue)}  # arrival order
            batches = sorted(batches, key=lambda b: min(rank[k] for k in b.indices))[:lanes]
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
        return BatchRecord(rows, batch.width, rows * batch.width, useful, seconds, predicted,
                           waited, shared)  # fmt: skip


def positional_items(engine: Engine, prompts: list[list[int]]) -> list[Item]:
    """Items of prompts already tokenized, keyed by position (no limit applies: for plans and
    measurements of given prompts; texts become items through `api.limits.prepare`)."""
    return [Item(i, p, len(engine.fed(p))) for i, p in enumerate(prompts)]


def score_all(engine: Engine, prompts: list[list[int]], batches: list[Batch],
              scorer: str = "fast") -> np.ndarray:  # fmt: skip
    """Probabilities (N, J) of every prompt, back in input order, scored through a scheduler
    in the given `batches` (indices are positions: bench times each planner's batches, and
    tests set batches of their own). The policy's cut is not used."""
    items = positional_items(engine, prompts)
    policy = BatchPolicy("sequential", scorer, 1, 1)
    done = [(b, list(p)) for b, p, _ in Scheduler(engine, policy, items).step(batches)]
    return np.stack(unsort(done, len(prompts)))


class LiveScheduler:
    """Arriving work: `submit` from any thread; one thread of its own batches and scores.

    It waits until the oldest queued item has waited `max_wait` seconds or a full budget per
    lane is queued, then steps one round (one batch per lane). The MLX work runs on this
    thread and the engine's lanes, never on the caller's. `held`: a test's hook, asked before
    each round (True: keep what is queued queued).
    """

    def __init__(
        self, engine: Engine, policy: BatchPolicy, max_wait: float = 0.005,
        max_queue: int = 1024, on_batch: Callable[[BatchRecord], None] | None = None,
        on_idle: Callable[[], None] | None = None, held: Callable[[], bool] = lambda: False,
    ):  # fmt: skip
        self.scheduler = Scheduler(engine, policy)
        self.max_wait, self.max_queue = max_wait, max_queue
        self.on_batch, self.on_idle, self.held = on_batch, on_idle, held
        self._cond = threading.Condition()
        self._waiting: dict[Hashable, tuple[Future, np.ndarray, int]] = {}  # request -> result
        self._pending: list[tuple[Item, float]] = []  # submitted, not yet queued
        self._accepting, self._stopped = True, False
        self._requests = 0
        self._thread = threading.Thread(target=self._loop, name="mlxbatch-scheduler", daemon=True)
        self._round_seconds = 0.05  # a running estimate, for Retry-After

    def start(self) -> None:
        self._thread.start()

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._pending) + self.scheduler.queued

    def submit(self, items: list[Item]) -> Future:
        """A future of the (n, J) raw probabilities of `items`, in their order (each is queued
        under the key (request, its position))."""
        future: Future = Future()
        if not items:
            future.set_result(np.zeros((0, len(self.scheduler.engine.labels.names)), np.float32))
            return future
        with self._cond:
            if not self._accepting:
                raise RuntimeError("draining")
            queued = len(self._pending) + self.scheduler.queued
            if queued + len(items) > self.max_queue:
                raise QueueFull(queued, self.max_queue, self._retry_after(queued))
            self._requests += 1
            request, now = self._requests, time.monotonic()
            J = len(self.scheduler.engine.labels.names)
            self._waiting[request] = (future, np.empty((len(items), J), np.float32), len(items))
            self._pending.extend((dataclasses.replace(item, key=(request, i)), now)
                                 for i, item in enumerate(items))  # fmt: skip
            self._cond.notify()
        return future

    def _retry_after(self, queued: int) -> float:
        rounds = queued / max(1, self.scheduler.policy.max_batch * self.scheduler.engine.lanes)
        return max(1.0, rounds * self._round_seconds)

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting; with `drain`, finish everything queued first; then stop the thread."""
        with self._cond:
            self._accepting = False
            if not drain:
                self._fail_all(RuntimeError("the scheduler was closed"))
            self._stopped = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _fail_all(self, error: BaseException) -> None:
        for future, _, _ in self._waiting.values():
            if not future.done():
                future.set_exception(error)
        self._waiting.clear()
        self._pending.clear()
        self.scheduler.clear()

    def _ready(self) -> bool:
        """Whether to step a round now: the oldest item has waited long enough, a full budget
        per lane is queued, or the scheduler is draining (never while a test holds it)."""
        if self.held():
            return False
        if self._stopped:
            return True
        s = self.scheduler
        if time.monotonic() - s.oldest() >= self.max_wait:
            return True
        full = s.budget(s.longest()) * s.engine.lanes
        return s.queued_tokens() >= full or s.queued >= s.policy.max_batch * s.engine.lanes

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._wait_for_work():
                    return
                while not self._ready():
                    wait = max(0.0, self.scheduler.oldest() + self.max_wait - time.monotonic())
                    self._cond.wait(min(wait, 0.02) if self.held() else wait)
                    self._take_pending()
            self._round()

    def _wait_for_work(self) -> bool:
        """(Holding the lock) until something is queued, verifying while idle; False once the
        scheduler is stopped with nothing left to score."""
        self._take_pending()
        while not self.scheduler.queued and not self._stopped:
            if self.on_idle is not None:
                self._cond.release()
                try:
                    self.on_idle()
                finally:
                    self._cond.acquire()
                self._take_pending()
                if self.scheduler.queued or self._stopped:
                    break
            self._cond.wait(0.05 if self.on_idle else None)
            self._take_pending()
        return bool(self.scheduler.queued) or not self._stopped

    def _take_pending(self) -> None:
        for item, arrived in self._pending:
            self.scheduler.add(item, arrived)
        self._pending.clear()

    def _round(self) -> None:
        t = time.perf_counter()
        try:
            done = list(self.scheduler.step(lanes=self.scheduler.engine.lanes))
        except Exception as e:  # the engine failed: fail the requests of this round, go on
            with self._cond:
                self._fail_all(e)
            return
        self._round_seconds = 0.8 * self._round_seconds + 0.2 * (time.perf_counter() - t)
        for batch, probs, record in done:
            with self._cond:
                for (request, i), p in zip(batch.indices, probs):
                    future, out, left = self._waiting[request]
                    out[i] = p
                    self._waiting[request] = (future, out, left - 1)
                    if left == 1:
                        del self._waiting[request]
                        if future.set_running_or_notify_cancel():
                            future.set_result(out)
            if self.on_batch is not None:
                self.on_batch(record)
