"""The run spec: how a run cuts, scores and polices its items, resolved once from options.

The CLI and the Python API both build one; everything below reads it and nothing re-resolves
a setting. The mode comes from the one mode table (`engine.engine.MODES`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.engine import MODES, SORTED_PLANNERS, Mode, resolve_mode
from ..engine.planner import DEFAULT_MAX_BATCH
from ..errors import UsageError

TOO_LONG = ("error", "truncate")
ON_ERROR = ("fail", "skip")


@dataclass(frozen=True)
class RunSpec:
    mode: str = "sorted"
    planner: str = "cost"  # sorted mode: "cost" (least predicted time) or "greedy" (fill budget)
    batch_tokens: int | None = None  # None: the device's preferred budget (see footprint.py)
    max_batch: int = DEFAULT_MAX_BATCH
    max_tokens: int | None = None  # per-item limit on fed tokens
    too_long: str = "error"
    on_error: str = "fail"
    verify_sample: float = 0.0  # share of items re-scored on the gold loop
    window: int = 16384  # rows read, planned and written at a time (memory flat in the job)
    progress_every: float | None = None  # off a terminal: a progress line every N s (the demo)

    def __post_init__(self) -> None:
        def choice(name: str, value, options) -> None:
            if value not in options:
                raise UsageError(f"{name} {value!r} is not one of {', '.join(map(str, options))}")

        choice("mode", self.mode, tuple(MODES))
        choice("planner", self.planner, SORTED_PLANNERS)
        choice("too_long", self.too_long, TOO_LONG)
        choice("on_error", self.on_error, ON_ERROR)
        for name in ("batch_tokens", "max_batch", "max_tokens", "window"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):  # fmt: skip
                raise UsageError(f"{name} must be a positive whole number, not {value!r}")
        if isinstance(self.verify_sample, bool) or not 0 <= self.verify_sample <= 1:
            raise UsageError(f"verify_sample {self.verify_sample!r} is not between 0 and 1")

    @property
    def step(self) -> Mode:
        """(planner, scorer) of this run, from the mode table."""
        return resolve_mode(self.mode, self.planner)
