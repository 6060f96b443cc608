"""Sampled verification of live traffic: one served item at a time re-scored on the gold loop
while idle; a difference is logged and turns /health to "degraded"."""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..api.verify import Check

log = logging.getLogger("mlxbatch.serve")


@dataclass(frozen=True)
class Sample:
    request_id: str
    index: int
    prompt: list[int]
    probs: np.ndarray  # (J,) what was scored, before calibration, prior and abstention


class Verifier:
    """`check(prompt, probs) -> api.verify.Check` over the served scores as answered."""

    def __init__(
        self,
        fraction: float,
        check: Callable[[list[int], np.ndarray], Check],
        on_result: Callable[[bool, float], None],
        seed: int = 0,
        backlog: int = 1024,
    ):
        self.fraction, self.check, self.on_result = fraction, check, on_result
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
        got = self.check(s.prompt, s.probs)
        if not got.agrees:
            self.mismatches += 1
            gold, served = got.answers()
            log.warning(
                "verification failed: request %s item %d was served %r, the gold loop "
                "says %r (largest score difference %.3g)",
                s.request_id,
                s.index,
                served,
                gold,
                got.diff,
            )
        self.on_result(not got.agrees, got.diff)
        return True
