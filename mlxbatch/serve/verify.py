"""Sampled verification: a fraction of served items re-scored on the gold loop while idle.

The fast path (shared-prefix KV, padded batches) is checked against the reference it must
match, on live traffic: a label that differs is logged with its request id and item index
and turns /health to "degraded". The work is one item per idle call, so a verification
never holds a batch back for more than one gold-loop item.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("mlxbatch.serve")


@dataclass(frozen=True)
class Sample:
    request_id: str
    index: int
    prompt: list[int]
    probs: np.ndarray  # (J,) what was served, before calibration, prior and abstention


class Verifier:
    def __init__(
        self, fraction: float, score_gold: Callable[[list[int]], np.ndarray],
        label_of: Callable[[np.ndarray], str | None],
        on_result: Callable[[bool, float], None], seed: int = 0, backlog: int = 1024,
    ):  # fmt: skip
        self.fraction, self.score_gold, self.label_of = fraction, score_gold, label_of
        self.on_result = on_result
        self.rng = random.Random(seed)
        self.pending: deque[Sample] = deque(maxlen=backlog)  # the oldest drop under overload
        self.mismatches = 0

    def offer(self, request_id: str, prompts: list[list[int]], probs: np.ndarray) -> None:
        """Keep each served item for verification with probability `fraction`."""
        if self.fraction <= 0:
            return
        for i, (prompt, p) in enumerate(zip(prompts, probs)):
            if self.rng.random() < self.fraction:
                self.pending.append(Sample(request_id, i, prompt, p))

    def step(self) -> bool:
        """Verify one pending item (the scheduler's idle hook); False when none was pending."""
        try:
            s = self.pending.popleft()
        except IndexError:
            return False
        gold = self.score_gold(s.prompt)
        served, expected = self.label_of(s.probs), self.label_of(gold)
        diff = float(np.max(np.abs(np.asarray(gold, np.float64) - s.probs)))
        mismatch = served != expected
        if mismatch:
            self.mismatches += 1
            log.warning("verification failed: request %s item %d was served %r, the gold loop "
                        "says %r (largest probability difference %.3g)", s.request_id, s.index,
                        served, expected, diff)  # fmt: skip
        self.on_result(mismatch, diff)
        return True
