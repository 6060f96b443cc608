"""The one verifier: an item scored again on the gold loop and compared with what was served
(top label, abstention, largest score difference), for the file job and the service alike."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .classifier import Classifier


@dataclass(frozen=True)
class Check:
    gold: str | None  # the gold loop's top label (None: its scores are not finite)
    served: str | None  # the served scores' top label (None: not finite)
    diff: float  # the largest |gold - served| score difference (nan when either is not finite)
    margin: float  # the gold loop's top two scores apart (how close the call was)
    abstains: tuple[bool, bool] = (False, False)  # (the gold loop's answer, the served one)

    @property
    def agrees(self) -> bool:
        return self.gold is not None and self.gold == self.served and len(set(self.abstains)) == 1

    def answers(self) -> tuple[str | None, str | None]:
        """(the gold loop's answer, the served one) in words: the top label, "abstains" after
        it where the answer abstains."""
        return tuple(
            label if label is None or not out else f"{label} (abstains)"
            for label, out in zip((self.gold, self.served), self.abstains)
        )

    def disagreement(self, item_id) -> dict:
        """The report line of a check that does not agree."""
        if self.gold is None or self.served is None:
            return {
                "id": item_id,
                "gold": self.gold,
                "fast": self.served,
                "error": "non-finite scores",
            }
        line = {"id": item_id, "gold": self.gold, "fast": self.served, "gold_margin": self.margin}
        if self.abstains[0] != self.abstains[1]:  # one answer abstains, the other does not
            line |= {"gold_abstained": self.abstains[0], "fast_abstained": self.abstains[1]}
        return line


def check(clf: Classifier, prompt: list[int], served: np.ndarray) -> Check:
    """`prompt` on the gold loop against `served`, the (J,) scores served for it (adjusted)."""
    names = clf.labels.names
    gold = clf.adjust.apply(clf.engine.score_gold(prompt)[None])[0]
    served = np.asarray(served, np.float64)
    gold_ok, served_ok = bool(np.isfinite(gold).all()), bool(np.isfinite(served).all())
    diff = float(np.abs(gold - served).max()) if gold_ok and served_ok else float("nan")
    top2 = np.sort(gold)[-2:] if gold_ok else np.zeros(2)
    return Check(
        names[int(np.argmax(gold))] if gold_ok else None,
        names[int(np.argmax(served))] if served_ok else None,
        diff,
        float(top2[-1] - top2[0]) if len(top2) == 2 else 0.0,
        (gold_ok and clf.adjust.abstains(gold), served_ok and clf.adjust.abstains(served)),
    )
