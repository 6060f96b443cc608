"""Constrained label scoring, in one place: the label set, the label pass, the normalisation.

A label's score is the sum of its tokens' log-probabilities under the full-vocabulary softmax,
and the reported `scores` are those sums softmax-normalised over the label set. Every label's
first token is scored at the same position (the prompt's last token), so that position's
full-vocabulary log-sum-exp is common to all labels of a row and cancels in the
normalisation: there only the label rows of the output head are computed. A multi-token
label's later tokens sit at positions of their own, where the log-sum-exp does not cancel; it
is computed there, and only there.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..errors import LabelError, unicode_problem
from ..model.cache import KVCache
from ..model.decoder import Decoder
from ..model.label_tokens import label_tokens
from .layout import RowLayout


def check_names(names) -> tuple[str, ...]:
    """A label set's names (two or more, distinct, one stripped line each), else a LabelError."""
    names = tuple(names)
    if not names or any(not n.strip() for n in names):
        raise LabelError("the label set is empty or holds an empty label")
    if blank := next((n for n in names if not visible(n)), None):
        raise LabelError(
            f"label {blank!r} shows nothing (only whitespace, format or control "
            "characters): the label set holds an empty label"
        )
    if len(names) < 2:
        raise LabelError(f"need at least two labels to choose from, got {list(names)}")
    for n in names:
        if problem := unicode_problem(n):
            raise LabelError(f"label {n!r} holds {problem}")
        if n != n.strip():  # --labels strips them: the API's " billing" must not differ
            raise LabelError(
                f"label {n!r} begins or ends with whitespace, which classify's "
                f"--labels strips: write {n.strip()!r}"
            )
        # U+2028/U+2029 too: JSON keeps them raw, and splitlines() would cut an output row there
        if control := next((c for c in n if unicodedata.category(c) in LINE_BREAKING), None):
            what = "control character" if unicodedata.category(control) == "Cc" else "line break"
            raise LabelError(
                f"label {n!r} holds the {what} {control!r}: a label is one line, "
                "written into prompts and output tables"
            )
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise LabelError(f"duplicate label(s): {', '.join(map(repr, dupes))}")
    printed: dict[str, str] = {}
    for n in names:
        if (other := printed.setdefault(_shown(n), n)) != n:
            raise LabelError(
                f"labels {other!r} and {n!r} differ only by invisible (format) "
                "characters: they print the same in every prompt and table"
            )
    return names


LINE_BREAKING = ("Cc", "Zl", "Zp")  # control characters, line and paragraph separators


def _shown(name: str) -> str:
    """A label as it prints: without its format characters (zero-width, soft hyphen, BOM)."""
    return "".join(c for c in name if unicodedata.category(c) != "Cf")


def visible(name: str) -> bool:
    """Whether `name` prints as something (not only whitespace, format or control characters)."""
    return any(not c.isspace() and unicodedata.category(c) not in ("Cf", "Cc") for c in name)


@dataclass(frozen=True)
class LabelSet:
    names: tuple[str, ...]
    tokens: tuple[tuple[int, ...], ...]

    @classmethod
    def build(cls, names: list[str] | tuple[str, ...], encode, vocab_size: int) -> LabelSet:
        """Validate labels and tokenize them with `encode` (PromptTokenizer.label)."""
        names = check_names(names)
        return cls(names, label_tokens(names, encode, vocab_size))

    @property
    def first_ids(self) -> list[int]:
        return [t[0] for t in self.tokens]

    @property
    def max_len(self) -> int:
        return max(len(t) for t in self.tokens)

    def teacher_inputs(self) -> np.ndarray:
        """Tokens fed after the prompt to score later label tokens: (J, max_len - 1)."""
        out = np.zeros((len(self.tokens), self.max_len - 1), np.int32)
        for j, t in enumerate(self.tokens):
            out[j, : len(t) - 1] = t[:-1]
        return out

    def continuation_slots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each scored later token: its label j, its input slot i - 1, and its token id."""
        rows = [(j, i - 1, t[i]) for j, t in enumerate(self.tokens) for i in range(1, len(t))]
        j, slot, tok = (np.array(x, np.int32) for x in zip(*rows)) if rows else ([],) * 3
        return np.asarray(j), np.asarray(slot), np.asarray(tok)


def first_token_logits(model: Decoder, h_last: mx.array, labels: LabelSet) -> mx.array:
    """(B, J) logits of each label's first token at each row's last prompt position."""
    return model.head(h_last, mx.array(labels.first_ids))


# The most fp32 logits of later label tokens held at once: rows go a few at a time
LOGIT_BYTES = 1 << 26
# arrays of that size alive at once (the host product's tiles, slices, concatenation, logsumexp)
LOGIT_COPIES = 5


def continuation_rows(positions: int, vocab_size: int) -> int:
    """Rows whose `positions` later label tokens' logits fit LOGIT_BYTES (at least one)."""
    return max(1, LOGIT_BYTES // max(1, positions * vocab_size * 4))


def continuation_logprobs(
    model: Decoder, h_lab: mx.array, labels: LabelSet, host_kernels: bool = False
) -> mx.array:
    """(B, J): sum over each label's tokens after the first of their full-vocab log-probs.

    `h_lab` (B * J, max_len - 1, D): row r * J + j holds label j behind prompt r."""
    J, T = len(labels.names), labels.max_len - 1
    B = h_lab.shape[0] // J
    j, slot, tok = labels.continuation_slots()
    flat = (np.arange(B)[:, None] * J + j[None, :]) * T + slot[None, :]  # (B, S)
    h_all = h_lab.reshape(B * J * T, -1)
    step = continuation_rows(len(j), model.args.vocab_size)
    parts = []
    for first in range(0, B, step):
        rows = flat[first : first + step]  # (n, S)
        h = h_all[mx.array(rows.reshape(-1))]  # (n * S, D)
        logits = model.head(h, host_kernels=host_kernels).astype(mx.float32)  # these positions
        target = mx.take_along_axis(logits, mx.array(np.tile(tok, len(rows)))[:, None], axis=-1)[
            :, 0
        ]
        parts.append((target - mx.logsumexp(logits, axis=-1)).reshape(len(rows), len(j)))
        if step < B:
            mx.eval(parts[-1])  # this chunk's logits freed before the next chunk's are made
    lp = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)
    sums = []  # each label's tokens added one by one, in order: a matmul's order is the BLAS's
    for label in range(J):
        total = mx.zeros((B,), lp.dtype)
        for i in np.flatnonzero(j == label):
            total = total + lp[:, int(i)]
        sums.append(total)
    return mx.stack(sums, axis=-1)


def normalise(label_logprobs: mx.array) -> mx.array:
    """Softmax over the label set: the reported per-label probabilities."""
    return mx.softmax(label_logprobs.astype(mx.float32), axis=-1)


def score_labels(
    model: Decoder,
    h_last: mx.array,
    kv: KVCache,
    layout: RowLayout,
    labels: LabelSet,
    host_kernels: bool = False,
) -> mx.array:
    """(B, J) label probabilities from `h_last` (B, D) at each row's last prompt token.

    Multi-token labels need a second pass: each row's cache repeated once per label, the
    labels' earlier tokens fed behind it (teacher forcing), their later tokens scored."""
    B = layout.batch
    scores = first_token_logits(model, h_last, labels).astype(mx.float32)
    if labels.max_len > 1:
        J = len(labels.names)
        lab_kv = kv.repeat_rows(J, layout.capacity)
        lab_tokens = np.tile(labels.teacher_inputs(), (B, 1))  # (B * J, T)
        h_lab = model(
            mx.array(lab_tokens),
            lab_kv,
            mx.array(layout.label_positions(J)),
            mx.array(layout.label_mask(J)),
            host_kernels=host_kernels,
        )
        scores = scores + continuation_logprobs(model, h_lab, labels, host_kernels)
    return normalise(scores)
