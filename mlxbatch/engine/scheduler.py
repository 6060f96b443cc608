"""The scheduler: work arrives, the planner cuts what is queued into batches, lanes score them.

nano-vllm's shape (`add_request`, then `step`: schedule, run, postprocess) serves both kinds of
work. A file job is all of its items arriving at once: `add` them, then `run` every batch of a
plan through the lanes, pipelined (a lane never waits for another). Arriving work (the
service) is `LiveScheduler`: items queue from any thread, and its own thread cuts what is
queued into one batch per lane whenever the oldest item has waited `max_wait` or the queue
holds a full budget per lane. Keys are the caller's: a file job's input row numbers, a
request's (request, item) pairs; batches carry keys, so there is one index space.

Which batch an item lands in never changes its scores on the CPU float32 path (see
tests/test_invariance.py); elsewhere the plan is a pure function of the queued lengths and
the policy.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from ..runtime import testhold
from .engine import Engine
from .planner import Batch, CostModel, plan


@dataclass(frozen=True)
class BatchPolicy:
    """How queued items are cut into batches and scored: resolved once (see api/spec.py)."""

    planner: str  # "cost" | "greedy" | "naive" | "sequential" (planner.plan)
    scorer: str  # "fast" | "gold"
    batch_tokens: int | None  # None: the device's preferred budget, raised to fit the longest
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


@dataclass
class _Item:
    prompt: list[int]
    fed: int  # tokens it feeds beyond the shared prefix
    arrived: float


class Scheduler:
    """Items queued by key; `plan` cuts them, `run` scores planned batches, `step` one round."""

    def __init__(self, engine: Engine, policy: BatchPolicy,
                 items: Iterable[tuple[Hashable, list[int]]] = ()):  # fmt: skip
        """`items`: (key, prompt) pairs to `add` at once."""
        self.engine, self.policy = engine, policy
        self._queue: OrderedDict[Hashable, _Item] = OrderedDict()  # in arrival order
        for key, prompt in items:
            self.add(key, prompt)

    def add(self, key: Hashable, prompt: list[int], arrived: float | None = None) -> None:
        if key in self._queue:
            raise KeyError(f"item {key!r} is already queued")
        fed = len(self.engine.fed(prompt))
        self._queue[key] = _Item(prompt, fed, time.monotonic() if arrived is None else arrived)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def queued_tokens(self) -> int:
        return sum(item.fed for item in self._queue.values())

    def budget(self, longest: int) -> int:
        """The batch budget for a plan whose longest item feeds `longest` tokens (an item over
        a set budget gets a batch of its own: the caller's limit on items is its own)."""
        if self.policy.batch_tokens is not None:
            return max(self.policy.batch_tokens, longest)
        return self.engine.default_budget(self.policy.max_batch, longest)

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

    def run(
        self, batches: list[Batch] | None = None, progress: Callable[[int], None] | None = None
    ) -> Iterator[tuple[Batch, np.ndarray, BatchRecord]]:
        """Score `batches` of queued keys (default: `plan()`), pipelined over the lanes, in
        order; each batch's items leave the queue when its result is handed back."""
        batches = self.plan() if batches is None else batches
        prompts = {k: self._queue[k].prompt for b in batches for k in b.indices}
        started = last = time.monotonic()
        done = self.engine.run(prompts, batches, self.policy.scorer, progress)
        try:
            for batch, probs in done:
                now = time.monotonic()
                record = self._record(batch, now - last, started)
                last = now
                for k in batch.indices:
                    del self._queue[k]
                yield batch, probs, record
        finally:
            done.close()

    def step(self) -> list[tuple[Batch, np.ndarray, BatchRecord]]:
        """One round: plan what is queued and score up to one batch per lane, the batches
        holding the longest-waiting items first; the rest stay queued for the next round."""
        batches = self.plan()
        if not batches:
            return []
        rank = {k: n for n, k in enumerate(self._queue)}  # arrival order
        batches.sort(key=lambda b: min(rank[k] for k in b.indices))
        return list(self.run(batches[: self.engine.lanes]))

    def _record(self, batch: Batch, seconds: float, started: float) -> BatchRecord:
        items = [self._queue[k] for k in batch.indices]
        rows, useful = len(items), sum(item.fed for item in items)
        shared = sum(len(item.prompt) - item.fed for item in items)
        predicted = None
        if self.policy.cost is not None:
            terms = self.engine.cost_terms()
            predicted = float(self.policy.cost.seconds(rows, batch.width, *terms))
        return BatchRecord(rows, batch.width, rows * batch.width, useful, seconds, predicted,
                           tuple(max(0.0, started - item.arrived) for item in items),
                           shared if self.policy.scorer == "fast" else 0)  # fmt: skip


class LiveScheduler:
    """Arriving work: `submit` from any thread; one thread of its own batches and scores.

    It waits until the oldest queued item has waited `max_wait` seconds or a full budget per
    lane is queued, then scores one round (one batch per lane). The MLX work runs on this
    thread and the engine's lanes, never on the caller's.
    """

    def __init__(
        self, engine: Engine, policy: BatchPolicy, max_wait: float = 0.005,
        max_queue: int = 1024, on_batch: Callable[[BatchRecord], None] | None = None,
        on_idle: Callable[[], None] | None = None,
    ):  # fmt: skip
        self.scheduler = Scheduler(engine, policy)
        self.max_wait, self.max_queue = max_wait, max_queue
        self.on_batch, self.on_idle = on_batch, on_idle
        self._cond = threading.Condition()
        self._waiting: dict[Hashable, tuple[Future, np.ndarray, int]] = {}  # request -> result
        self._pending: list[tuple[Hashable, list[int], float]] = []  # submitted, not yet queued
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

    @property
    def accepting(self) -> bool:
        return self._accepting

    def submit(self, prompts: list[list[int]]) -> Future:
        """A future of the (n, J) raw probabilities of `prompts`, in their order."""
        future: Future = Future()
        if not prompts:
            future.set_result(np.zeros((0, len(self.scheduler.engine.labels.names)), np.float32))
            return future
        with self._cond:
            if not self._accepting:
                raise RuntimeError("draining")
            queued = len(self._pending) + self.scheduler.queued
            if queued + len(prompts) > self.max_queue:
                raise QueueFull(queued, self.max_queue, self._retry_after(queued))
            self._requests += 1
            request, now = self._requests, time.monotonic()
            J = len(self.scheduler.engine.labels.names)
            self._waiting[request] = (future, np.empty((len(prompts), J), np.float32), len(prompts))
            self._pending.extend(((request, i), p, now) for i, p in enumerate(prompts))
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
        self.scheduler._queue.clear()

    def _ready(self) -> bool:
        """Whether to score a round now: the oldest item has waited long enough, a full budget
        per lane is queued, or the scheduler is draining (never while a test holds it)."""
        if testhold.held():
            return False
        if self._stopped:
            return True
        s = self.scheduler
        oldest = next(iter(s._queue.values())).arrived
        if time.monotonic() - oldest >= self.max_wait:
            return True
        full = s.budget(max(item.fed for item in s._queue.values())) * s.engine.lanes
        return s.queued_tokens() >= full or s.queued >= s.policy.max_batch * s.engine.lanes

    def _loop(self) -> None:
        while True:
            with self._cond:
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
                if not self.scheduler.queued and self._stopped:
                    return
                while not self._ready():
                    oldest = next(iter(self.scheduler._queue.values())).arrived
                    wait = max(0.0, oldest + self.max_wait - time.monotonic())
                    self._cond.wait(min(wait, 0.02) if testhold.held() else wait)
                    self._take_pending()
            self._round()

    def _take_pending(self) -> None:
        for key, prompt, arrived in self._pending:
            self.scheduler.add(key, prompt, arrived)
        self._pending.clear()

    def _round(self) -> None:
        t = time.perf_counter()
        try:
            done = self.scheduler.step()
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
