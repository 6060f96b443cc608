"""Arriving work (the service's scheduler): items queue from any thread, one thread scores."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from ..runtime import testhold
from .engine import Engine
from .item import Item
from .scheduler import BatchPolicy, BatchRecord, Scheduler


class QueueFull(Exception):
    def __init__(self, queued: int, limit: int, retry_after: float):
        super().__init__(f"the queue holds {queued} items, its limit is {limit}")
        self.retry_after = retry_after


@dataclasses.dataclass
class _Request:
    """A request waited for: its future, rows as scored, how many are left, padded tokens served."""

    future: Future
    out: np.ndarray  # (n, J)
    left: int
    served: int


class LiveScheduler:
    """Arriving work: `submit` from any thread; one thread of its own batches and scores.

    A round (one batch per lane) starts when the oldest item has waited `max_wait` or a full
    budget per lane is queued, and takes the requests served the fewest padded tokens, so one
    client's long texts do not hold everyone else's; draining, the requests nearest done.
    """

    def __init__(
        self,
        engine: Engine,
        policy: BatchPolicy,
        max_wait: float = 0.005,
        max_queue: int = 1024,
        on_batch: Callable[[BatchRecord], None] | None = None,
        on_idle: Callable[[], None] | None = None,
    ):
        self.scheduler = Scheduler(engine, policy)
        self.max_wait, self.max_queue = max_wait, max_queue
        self.on_batch, self.on_idle = on_batch, on_idle
        self._cond = threading.Condition()
        # request -> its record; a new request starts level with the most served one waiting,
        # so a stream of small requests cannot starve a large one
        self._waiting: dict[int, _Request] = {}
        self._pending: list[tuple[Item, float]] = []  # submitted, not yet queued
        # _dropped: closed without a drain; only the scheduler's thread clears what it holds
        self._accepting, self._stopped, self._dropped = True, False, False
        self._withdrawn: set[int] = set()  # requests nobody waits for: the thread drops them
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
        """A future of the (n, J) raw probabilities of `items`, in their order."""
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
            most = max((r.served for r in self._waiting.values()), default=0)
            self._waiting[request] = _Request(
                future, np.empty((len(items), J), np.float32), len(items), most
            )
            self._pending.extend(
                (dataclasses.replace(item, key=(request, i)), now) for i, item in enumerate(items)
            )
            self._cond.notify()
        return future

    def withdraw(self, future: Future) -> None:
        """Drop the unscored items of `future`, whose client is gone, so it holds no lane."""
        with self._cond:
            request = next((r for r, w in self._waiting.items() if w.future is future), None)
            if request is None:
                return
            del self._waiting[request]
            future.cancel()
            self._pending = [(item, t) for item, t in self._pending if item.key[0] != request]
            self._withdrawn.add(request)
            self._cond.notify()

    def _retry_after(self, queued: int) -> float:
        rounds = queued / max(1, self.scheduler.policy.max_batch * self.scheduler.engine.lanes)
        return max(1.0, rounds * self._round_seconds)

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting; with `drain`, finish everything queued first; then stop the thread."""
        with self._cond:
            self._accepting = False
            if not drain:
                self._fail_requests(RuntimeError("the scheduler was closed"))
                self._dropped = True
            self._stopped = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _fail_requests(self, error: BaseException) -> None:
        """(Holding the lock) fail every request still waiting; any thread may call it."""
        for waiting in self._waiting.values():
            if not waiting.future.done():
                waiting.future.set_exception(error)
        self._waiting.clear()
        self._pending.clear()

    def _ready(self) -> bool:
        """Whether to step a round now (never while a test holds it)."""
        if testhold.held():
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
                while self.scheduler.queued and not self._ready():
                    wait = max(0.0, self.scheduler.oldest() + self.max_wait - time.monotonic())
                    self._cond.wait(min(wait, 0.02) if testhold.held() else wait)
                    self._take_pending()
                if self._dropped:
                    self.scheduler.clear()
                    return
                if not self.scheduler.queued:  # all of it withdrawn meanwhile
                    continue
            self._round()

    def _wait_for_work(self) -> bool:
        """(Holding the lock) wait for work, verifying while idle; False once stopped and empty."""
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
        """(Holding the lock, on the thread) queue what was submitted, drop what was withdrawn."""
        for item, arrived in self._pending:
            self.scheduler.add(item, arrived)
        self._pending.clear()
        if self._withdrawn:
            gone = self._withdrawn
            self.scheduler.remove(lambda key: key[0] in gone)
            self._withdrawn = set()

    def _drain_plan(self) -> tuple[list, dict] | None:
        """(Holding the lock) while draining, (batches, rank) of the requests with the fewest
        items left, a round's worth; else None (the fair round)."""
        if not self._stopped:
            return None
        s, order = self.scheduler, sorted(self._waiting, key=lambda r: (self._waiting[r].left, r))
        chosen, wanted = {}, s.policy.max_batch * s.engine.lanes
        for request in order:
            chosen[request] = (len(chosen),)
            wanted -= self._waiting[request].left
            if wanted <= 0:
                break
        keys = [k for k in s.keys() if k[0] in chosen]
        return (s.plan(keys), chosen) if keys else None  # none: only withdrawn work is left

    def _round(self) -> None:
        t = time.perf_counter()
        with self._cond:
            # a request withdrawn since is not in it: it goes last
            rank = {request: (w.served,) for request, w in self._waiting.items()}
            batches, draining = None, self._drain_plan()
            if draining is not None:  # one batch a lane still: a round bounds the drain's exit
                batches, rank = draining

        def first(key: tuple[int, int]) -> tuple:  # the first request by rank, then the oldest
            return rank.get(key[0], (math.inf,)), key

        try:
            lanes = self.scheduler.engine.lanes
            done = list(self.scheduler.step(batches, lanes=lanes, first=first))
        except Exception as e:  # the engine failed: fail every request queued, go on
            with self._cond:
                self._fail_requests(e)
                self.scheduler.clear()
            return
        self._round_seconds = 0.8 * self._round_seconds + 0.2 * (time.perf_counter() - t)
        for batch, probs, record in done:
            with self._cond:
                for (request, i), p in zip(batch.indices, probs):
                    self._deliver(request, i, p, batch.width)
            if self.on_batch is not None:
                self.on_batch(record)

    def _deliver(self, request: int, i: int, p: np.ndarray, width: int) -> None:
        """(Holding the lock) item `i` of `request` is scored; the last one sets its future."""
        waiting = self._waiting.get(request)
        if waiting is None:
            return
        waiting.out[i], waiting.left, waiting.served = p, waiting.left - 1, waiting.served + width
        if waiting.left == 0:
            del self._waiting[request]
            if waiting.future.set_running_or_notify_cancel():
                waiting.future.set_result(waiting.out)
