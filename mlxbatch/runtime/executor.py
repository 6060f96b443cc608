"""How batches are executed on the device: one stream, or CPU lanes.

On the CPU, MLX's elementwise ops run on one thread per stream, and so does the NumPy work of
the host kernels, so work is spread over "lanes", one per core, each a thread with its own
stream, with OpenBLAS single-threaded while they run. A job's batches go to whichever lane is
free (`run_batches`): each batch runs whole on one core, so no lane waits for another inside a
batch, and nothing waits between batches; the results still come back in the batches' order.
One batch alone (`run`) is split into row lanes instead. On a GPU one stream does it all.
The engine only calls these; which policy a machine gets is decided here, once, and tests can
force either.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import mlx.core as mx
import numpy as np

from . import sgemm

MAX_LANES = 64  # scipy-openblas32's MAX_THREADS: every core of a large machine (was 8)

# score_rows(prompts, lane) -> (rows, labels) probabilities, built on the current stream
RowScorer = Callable[[list, int], mx.array]


class SingleStream:
    """Every row of a batch in one lazy graph on the default stream, one batch after another,
    whichever thread asks: concurrent callers take turns on the one lane's buffers."""

    lanes = 1

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def run(self, score_rows: RowScorer, prompts: list) -> np.ndarray:
        # OpenBLAS on one thread here too: its threads split a product's rows at points that
        # depend on the row count, and a row's bits with them (issue 26, Haswell kernels)
        with self._lock, sgemm.single_threaded():
            out = score_rows(prompts, 0)
            mx.eval(out)
            return np.array(out)

    def run_batches(self, score_rows: RowScorer, batches: Iterable[list]) -> Iterator[np.ndarray]:
        for prompts in batches:
            yield self.run(score_rows, prompts)


class CpuLanes:
    """`lanes` threads, each with its own CPU stream and lane number (its cache buffers).

    A lane scores its rows eagerly in its thread, so a forward that evaluates inside (host
    kernels, see model/hostops.py) runs its NumPy work concurrently with the other lanes too.
    MLX streams belong to the thread that made them: each lane thread makes its own, once.
    """

    def __init__(self, lanes: int):
        self.lanes = lanes
        self._pool: ThreadPoolExecutor | None = None  # made on first use
        self._local = threading.local()
        self._numbered = 0
        self._lock = threading.Lock()

    def _score(self, score_rows: RowScorer, prompts: list) -> np.ndarray:
        if getattr(self._local, "stream", None) is None:
            with self._lock:
                self._local.lane, self._numbered = self._numbered, self._numbered + 1
            self._local.stream = mx.new_stream(mx.cpu)
        with mx.stream(self._local.stream):
            out = score_rows(prompts, self._local.lane)
            mx.eval(out)
            return np.array(out)

    def _submit(self, score_rows: RowScorer, prompts: list) -> Future:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.lanes, thread_name_prefix="mlxbatch-lane")
        return self._pool.submit(self._score, score_rows, prompts)

    def run(self, score_rows: RowScorer, prompts: list) -> np.ndarray:
        """One batch, its rows split into contiguous lanes that run at once (a lane's buffers
        are only ever used by its own thread, so concurrent callers are safe)."""
        n = max(1, min(self.lanes, len(prompts)))
        bounds = np.linspace(0, len(prompts), n + 1).round().astype(int)
        with sgemm.single_threaded():  # one core per lane
            futures = [self._submit(score_rows, prompts[a:b])
                       for a, b in zip(bounds[:-1], bounds[1:])]  # fmt: skip
            return np.concatenate([f.result() for f in futures])

    def run_batches(self, score_rows: RowScorer, batches: Iterable[list]) -> Iterator[np.ndarray]:
        """Each batch whole on the next free lane; results in the batches' order.

        At most two batches per lane are queued ahead, so a lane never waits for the caller.
        Closing the iterator early (an error, Ctrl-C) cancels what has not started and waits
        for what has.
        """
        pending: deque[Future] = deque()
        with sgemm.single_threaded():
            try:
                for prompts in batches:
                    pending.append(self._submit(score_rows, prompts))
                    if len(pending) >= 2 * self.lanes:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                for f in pending:
                    f.cancel()
                for f in pending:
                    if not f.cancelled():
                        f.exception()  # wait: a lane must not outlive the job's BLAS setting


Executor = SingleStream | CpuLanes


def usable_cores() -> list[int]:
    """The cores this process may run on (a cgroup or `taskset` may allow fewer than exist)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def for_device(kind: str = "auto") -> Executor:
    """The policy for this machine: CPU lanes (one per usable core, up to OpenBLAS's 64
    threads; the memory budget counts a batch in flight per lane) on the CPU, else one
    stream."""
    if kind == "single" or (kind == "auto" and mx.default_device() != mx.cpu):
        return SingleStream()
    lanes = min(len(usable_cores()), MAX_LANES)
    return CpuLanes(lanes) if lanes > 1 else SingleStream()
