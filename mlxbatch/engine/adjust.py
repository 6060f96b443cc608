"""What is done to the label probabilities after scoring, alike on the fast path and the gold
loop: contextual calibration (Zhao et al., 2021: divide by the content-free inputs' average
probabilities), priors, and abstention below `min_confidence`."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

CONTENT_FREE = ("N/A", "", "[MASK]")


@dataclass(frozen=True)
class Adjustment:
    p_cf: tuple[float, ...] | None = None  # content-free label probabilities
    prior: tuple[float, ...] | None = None
    min_confidence: float | None = None

    @property
    def identity(self) -> bool:
        return self.p_cf is None and self.prior is None

    def apply(self, probs: np.ndarray) -> np.ndarray:
        """(N, J) probabilities -> (N, J) adjusted, renormalised; unchanged when identity."""
        if self.identity:
            return probs
        q = np.asarray(probs, np.float64)
        if self.p_cf is not None:
            q = q / np.asarray(self.p_cf, np.float64)
        if self.prior is not None:
            q = q * np.asarray(self.prior, np.float64)
        return (q / q.sum(axis=-1, keepdims=True)).astype(np.float32)

    def abstains(self, probs: np.ndarray) -> bool:
        return self.min_confidence is not None and float(np.max(probs)) < self.min_confidence

    def describe(self, names: tuple[str, ...]) -> str:
        parts = []
        if self.p_cf is not None:
            parts.append("p_cf " + ", ".join(f"{n}={p:.3f}" for n, p in zip(names, self.p_cf)))
        if self.prior is not None:
            parts.append("prior " + ", ".join(f"{n}={p:.3f}" for n, p in zip(names, self.prior)))
        if self.min_confidence is not None:
            parts.append(f"min confidence {self.min_confidence}")
        return "; ".join(parts)


MAX_PRIOR_RATIO = 1e9


DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)


def parse_prior(
    spec: str | dict, names: tuple[str, ...], option: str = "--prior"
) -> tuple[float, ...]:
    """`billing=0.5,technical=0.3,account=0.2` (or the Python API's {label: weight}, which
    takes labels holding `,`) -> priors in label order, normalised.
    Labels not named get an equal share of what is left (an error if nothing is left).
    `option`: the prior as messages name it, the CLI's `--prior` or the API's `prior`."""
    from ..errors import LabelError

    given: dict[str, float] = {}
    for name, sep, value in _prior_parts(spec):
        part = f"{name}{sep}{value}"
        if not part.strip():
            continue
        name = name.strip()
        if not sep or name not in names:
            raise LabelError(
                f"{option} {part.strip()!r}: expected LABEL=WEIGHT with a label of "
                f"{', '.join(names)}"
            )
        w = _weight(part, value, option)
        if name in given:
            raise LabelError(f"{option} names {name!r} twice")
        given[name] = w
    if not given:
        raise LabelError(f"{option} names no label")
    given, total = _share_the_rest(given, names, option)
    _check_ratio(given, total, option)
    return tuple(given[n] / total for n in names)


def _prior_parts(spec: str | dict) -> list[tuple]:
    """(label, "=", weight) triples; a part without `=` has an empty separator."""
    if isinstance(spec, dict):
        return [(str(k), "=", v) for k, v in spec.items()]
    # the last `=`: a weight never holds one, a label may (`a=b=0.3` weighs "a=b")
    return [part.rpartition("=") for part in spec.split(",")]


def _weight(part: str, value, option: str) -> float:
    """A positive finite weight, from a number or a string in ASCII decimals."""
    from ..errors import LabelError

    try:  # a string weight in ASCII decimals: float() also read "1_0" as 10, "١" as 1
        if isinstance(value, str) and not DECIMAL.fullmatch(value.strip()):
            raise ValueError(value)
        w = float(value)
    except OverflowError:  # 10**400: a number, past a float's range
        raise LabelError(
            f"{option} {part.strip()[:60]!r}: the weight is past a float's range"
        ) from None
    except (TypeError, ValueError):
        raise LabelError(
            f"{option} {part.strip()[:60]!r}: {str(value).strip()[:40]!r} is not a number"
        ) from None
    if not np.isfinite(w) or w <= 0:
        raise LabelError(f"{option} {part.strip()!r}: weights must be positive")
    return w


def _share_the_rest(
    given: dict[str, float], names: tuple[str, ...], option: str
) -> tuple[dict[str, float], float]:
    """The labels not named share what the named ones leave below 1; (weights, their total)."""
    from ..errors import LabelError

    rest = [n for n in names if n not in given]
    total = sum(given.values())
    if not rest:
        return given, total
    if total >= 1:
        raise LabelError(
            f"{option} leaves nothing for {', '.join(rest)}: name every label "
            "or let the weights sum below 1"
        )
    share = (1 - total) / len(rest)
    return given | dict.fromkeys(rest, share), 1.0


def _check_ratio(given: dict[str, float], total: float, option: str) -> None:
    """Beyond MAX_PRIOR_RATIO a label can never win (or the sum overflows): a typo, not a
    prior."""
    from ..errors import LabelError

    low, high = min(given, key=given.get), max(given, key=given.get)
    if not np.isfinite(total):
        raise LabelError(f"{option}: the weights sum beyond a float's range; give smaller ones")
    if given[high] > MAX_PRIOR_RATIO * given[low]:
        raise LabelError(
            f"{option}: {high!r} ({given[high]:g}) outweighs {low!r} "
            f"({given[low]:g}) more than {MAX_PRIOR_RATIO:g} to 1; is a weight "
            "mistyped?"
        )
