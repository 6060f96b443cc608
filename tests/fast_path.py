"""Test helper: one batch scored on an engine's fast path, its rows split over the lanes (a
job runs each batch whole on one lane: `Engine.score_batches`)."""

from __future__ import annotations

import numpy as np

from mlxbatch.engine.engine import Engine


def score_batch(engine: Engine, prompts: list[list[int]]) -> np.ndarray:
    """(B, J) probabilities of one batch on the fast path."""
    engine._keep_buffers([engine._whole(prompts)])
    return engine.scorers["fast"].score(prompts)
