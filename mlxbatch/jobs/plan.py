"""What a file job decides for a window before computing, a pure function of rows and settings."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..api.classifier import Classifier
from ..api.limits import LIMIT_SETTINGS, prepare
from ..api.spec import Settings, check_fits
from ..engine.item import Item
from ..engine.planner import Batch, PaddingStats
from ..engine.scheduler import Scheduler
from ..errors import flag, worded
from ..io.inputs import Row


@dataclass
class JobPlan:
    items: dict[int, Item]  # scored input row -> its item (one per distinct prompt)
    errors: dict[int, str]  # input row -> why it was refused (too long)
    batches: list[Batch]  # indices are input rows
    scheduler: Scheduler  # holds `items`; scores the batches
    memory_bound: int
    extras: dict[int, dict] = field(default_factory=dict)  # input row -> extra output fields
    copies: dict[int, list[int]] = field(default_factory=dict)  # scored row -> its duplicates

    @property
    def prompts(self) -> dict[int, list[int]]:
        return {i: item.prompt for i, item in self.items.items()}

    def predicted_seconds(self, terms: tuple[int, int, int]) -> float | None:
        """The cost model's time for these batches (`terms`: `Engine.cost_terms`)."""
        cost = self.scheduler.policy.cost
        return None if cost is None else cost.plan_seconds(self.batches, *terms)

    @property
    def duplicates(self) -> int:
        return sum(len(c) for c in self.copies.values())

    @property
    def useful_tokens(self) -> int:
        return sum(item.fed for item in self.items.values())

    @property
    def padded_tokens(self) -> int:
        return sum(b.padded_tokens for b in self.batches)

    @property
    def padding_overhead(self) -> float:
        return PaddingStats(self.useful_tokens, self.padded_tokens).overhead

    def rows_of(self, batch: Batch):
        """The input rows a batch writes: each scored row, then its copies."""
        for i in batch.indices:
            yield i
            yield from self.copies.get(i, ())


def plan_window(
    clf: Classifier,
    rows: list[Row],
    start: int,
    settings: Settings,
    check_memory: bool = True,
    prompts: list[list[int]] | None = None,
) -> JobPlan:
    """Each row's item or refusal and the batches; rows with identical prompts scored once."""
    engine = clf.engine
    good = [(start + i, r.text) for i, r in enumerate(rows) if not r.error]
    if prompts is None:
        prompts = engine.prompts([text for _, text in good])
    made = [
        prepare(engine, text, settings.limit, settings.truncating, i, prompt)
        for (i, text), prompt in zip(good, prompts)
    ]
    errors = {
        i: worded(m, flag, LIMIT_SETTINGS) for (i, _), m in zip(good, made) if isinstance(m, str)
    }
    kept = once_each([m for m in made if isinstance(m, Item)])
    scored = {item.key: item for item in kept if item.duplicate_of is None}
    copies: dict[int, list[int]] = {}
    for item in kept:
        if item.duplicate_of is not None:
            copies.setdefault(item.duplicate_of, []).append(item.key)
    scheduler = Scheduler(engine, settings.policy, scored.values())
    batches = scheduler.plan()
    largest = _largest(batches)
    if check_memory:
        check_fits(clf.footprint, *largest, settings.spec)
    fp = clf.footprint
    return JobPlan(
        scored,
        errors,
        batches,
        scheduler,
        fp.weight_bytes + fp.batch_cost(*largest).total,
        {it.key: {"truncated": it.truncated} for it in kept if it.truncated},
        copies,
    )


def once_each(items: list[Item]) -> list[Item]:
    """`items`, each whose prompt repeats an earlier one's marked `duplicate_of` that one."""
    first: dict[tuple[int, ...], int] = {}
    out = []
    for item in items:
        rep = first.setdefault(tuple(item.prompt), item.key)
        out.append(item if rep == item.key else dataclasses.replace(item, duplicate_of=rep))
    return out


def _largest(batches: list[Batch]) -> tuple[int, int, int]:
    """(padded tokens, rows, width) of the largest batch of each kind: what memory must hold."""
    return (
        max((b.padded_tokens for b in batches), default=1),
        max((len(b.indices) for b in batches), default=1),
        max((b.width for b in batches), default=1),
    )
