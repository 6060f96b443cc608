"""What a resumed job holds from its journal: the rows an earlier run wrote, checked against
the input's ids, and the prompts of those to verify once every window is done."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..api.spec import Settings
from ..errors import ResumeError
from ..io.sinks import Sink
from .plan import JobPlan
from .rows import Window
from .verify import to_verify


@dataclass
class Held:
    """The rows an earlier run journaled, and the prompts of those to verify at the end, kept
    compactly: each one's own tokens as int32 and how many it takes from the shared prefix."""

    mask: np.ndarray
    ids: dict = field(default_factory=dict)
    prompts: dict = field(default_factory=dict)

    def keep(
        self, window: Window, plan: JobPlan, settings: Settings, every: bool, prefix: list[int] = ()
    ) -> None:
        """Keep the items to verify of `plan`'s batches held whole (a partly held one: again)."""
        held = self.mask
        whole = [b for b in plan.batches if all(j < len(held) and held[j] for j in plan.rows_of(b))]
        mine = {i: plan.items[i] for b in whole for i in b.indices}
        chosen = to_verify(mine, settings, every) or {}
        for i, it in chosen.items():
            k = it.shared if list(it.prompt[: it.shared]) == list(prefix[: it.shared]) else 0
            self.prompts[i] = (k, np.array(it.prompt[k:], np.int32))
        self.ids.update(window.ids(chosen))

    def prompt_of(self, i: int, prefix: list[int]) -> list[int]:
        shared, fed = self.prompts[i]
        return prefix[:shared] + fed.tolist()


def check_held(
    sink: Sink, window: Window, plan: JobPlan, held: np.ndarray, non_finite: str
) -> None:
    """Refuse a resumed journal whose rows in `window` do not stand for their input rows (id,
    error where the row is bad, result where good): an edited journal, or one for rows since
    changed, would copy in another row's result or leave a good row unscored."""
    end = min(window.start + len(window.rows), len(held))
    for i in map(int, np.flatnonzero(held[window.start : end]) + window.start):
        row, got = window[i], sink.done[i]
        want, bad = row.id, row.error or plan.errors.get(i)
        if type(got.get("id")) is not type(want) or got.get("id") != want:
            found = f"id {got.get('id')!r} for input row {i + 1}, whose id is {want!r}"
        elif bad and "error" not in got:
            found = f"a result for input row {i + 1}, which this run refuses ({bad})"
        elif not bad and "error" in got and got["error"] != non_finite:
            found = f"the error {got['error']!r} for input row {i + 1}, which this run scores"
        else:
            continue
        raise ResumeError(
            f"{sink.path}: line {sink.done.line_of(i)} holds {found[:300]} "
            "(edited?); delete the journal to start over"
        )
