"""How a batch's rows are executed on the device: one stream, or CPU lanes.

On the CPU, MLX's elementwise ops run on one thread per stream, and so does the NumPy work of
the host kernels, so a batch is split into row "lanes", one per core, each with its own thread
and stream, with OpenBLAS single-threaded while they run. On a GPU one stream does it all.
The engine only calls `run`; which policy a machine gets is decided here, once, and tests can
force either.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import numpy as np

from . import blas

# score_rows(prompts, lane) -> (rows, labels) probabilities, built on the current stream
RowScorer = Callable[[list, int], mx.array]


class SingleStream:
    """Every row of a batch in one lazy graph on the default stream."""

    lanes = 1

    def run(self, score_rows: RowScorer, prompts: list) -> np.ndarray:
        out = score_rows(prompts, 0)
        mx.eval(out)
        return np.array(out)


class CpuLanes:
    """Rows split into contiguous lanes, each run by its own thread on its own CPU stream.

    A lane's rows are scored eagerly in its thread, so a forward that evaluates inside (host
    kernels, see model/hostops.py) runs its NumPy work concurrently with the other lanes too.
    MLX streams belong to the thread that made them: each lane thread makes its own, once.
    """

    def __init__(self, lanes: int):
        self.lanes = lanes
        self._pools: list[ThreadPoolExecutor] = []  # one thread per lane, made on first use
        self._local = threading.local()

    def _score_lane(self, score_rows: RowScorer, prompts: list, lane: int) -> np.ndarray:
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = mx.new_stream(mx.cpu)
        with mx.stream(stream):
            out = score_rows(prompts, lane)
            mx.eval(out)
            return np.array(out)

    def run(self, score_rows: RowScorer, prompts: list) -> np.ndarray:
        n = min(self.lanes, len(prompts))
        if n < 2:
            return SingleStream().run(score_rows, prompts)
        while len(self._pools) < n:
            i = len(self._pools)
            self._pools.append(ThreadPoolExecutor(1, thread_name_prefix=f"mlxbatch-lane{i}"))
        bounds = np.linspace(0, len(prompts), n + 1).round().astype(int)
        with blas.single_threaded():  # one core per lane
            futures = [
                self._pools[lane].submit(self._score_lane, score_rows, prompts[a:b], lane)
                for lane, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))
            ]
            return np.concatenate([f.result() for f in futures])


Executor = SingleStream | CpuLanes


def for_device(kind: str = "auto") -> Executor:
    """The policy for this machine: CPU lanes (one per core, at most 8) on the CPU, else one stream."""
    if kind == "single" or (kind == "auto" and mx.default_device() != mx.cpu):
        return SingleStream()
    lanes = min(os.cpu_count() or 1, 8)
    return CpuLanes(lanes) if lanes > 1 else SingleStream()
