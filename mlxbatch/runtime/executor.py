"""How a batch's rows are executed on the device: one stream, or CPU lanes.

On the CPU, MLX's elementwise ops (exp in SiLU and softmax) run on one thread per stream, so a
batch is split into row "lanes" on separate streams, one per core, with OpenBLAS single-threaded
while they run. On a GPU one stream does it all. The engine only calls `run`; which policy a
machine gets is decided here, once, and tests can force either.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from . import blas

# score_rows(prompts, lane) -> (rows, labels) probabilities, lazily built on the current stream
RowScorer = Callable[[list, int], mx.array]


class SingleStream:
    """Every row of a batch in one lazy graph on the default stream."""

    lanes = 1

    def run(self, score_rows: RowScorer, prompts: list) -> np.ndarray:
        out = score_rows(prompts, 0)
        mx.eval(out)
        return np.array(out)


class CpuLanes:
    """Rows split into contiguous lanes, each on its own CPU stream (one core each)."""

    def __init__(self, lanes: int):
        self.lanes = lanes
        self.streams = [mx.new_stream(mx.cpu) for _ in range(lanes)]

    def run(self, score_rows: RowScorer, prompts: list) -> np.ndarray:
        n = min(self.lanes, len(prompts))
        if n < 2:
            return SingleStream().run(score_rows, prompts)
        bounds = np.linspace(0, len(prompts), n + 1).round().astype(int)
        outs = []
        for lane, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            with mx.stream(self.streams[lane]):
                outs.append(score_rows(prompts[a:b], lane))
        with blas.single_threaded():  # one core per lane
            mx.eval(outs)
        return np.concatenate([np.array(o) for o in outs])


Executor = SingleStream | CpuLanes


def for_device(kind: str = "auto") -> Executor:
    """The policy for this machine: CPU lanes (one per core, at most 8) on the CPU, else one stream."""
    if kind == "single" or (kind == "auto" and mx.default_device() != mx.cpu):
        return SingleStream()
    lanes = min(os.cpu_count() or 1, 8)
    return CpuLanes(lanes) if lanes > 1 else SingleStream()
