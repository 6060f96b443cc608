"""How batches are executed on the device: one stream (a GPU), or CPU lanes (a thread and
stream a core, each batch whole on the next free lane, results back in order)."""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import mlx.core as mx
import numpy as np

from . import sgemm

MAX_LANES = 64  # scipy-openblas32's MAX_THREADS: every core of a large machine

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
        # depend on the row count, and a row's bits with them
        with self._lock, sgemm.single_threaded():
            out = score_rows(prompts, 0)
            mx.eval(out)
            return np.array(out)

    def run_batches(self, score_rows: RowScorer, batches: Iterable[list]) -> Iterator[np.ndarray]:
        for prompts in batches:
            yield self.run(score_rows, prompts)


class CpuLanes:
    """`lanes` threads, each with its own CPU stream (made by that thread: MLX streams belong
    to it) and lane number (its cache buffers), scoring eagerly so host kernels overlap."""

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
        """One batch, its rows split into contiguous lanes that run at once."""
        n = max(1, min(self.lanes, len(prompts)))
        bounds = np.linspace(0, len(prompts), n + 1).round().astype(int)
        with sgemm.single_threaded():  # one core per lane
            futures = [
                self._submit(score_rows, prompts[a:b]) for a, b in zip(bounds[:-1], bounds[1:])
            ]
            return np.concatenate([f.result() for f in futures])

    def run_batches(self, score_rows: RowScorer, batches: Iterable[list]) -> Iterator[np.ndarray]:
        """Each batch whole on the next free lane (two a lane queued ahead); results in the
        batches' order. Closing early cancels what has not started and waits for the rest."""
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
    """The policy for this machine: CPU lanes (one per usable core), else one stream."""
    if kind == "single" or (kind == "auto" and mx.default_device() != mx.cpu):
        return SingleStream()
    lanes = min(len(usable_cores()), MAX_LANES)
    return CpuLanes(lanes) if lanes > 1 else SingleStream()
