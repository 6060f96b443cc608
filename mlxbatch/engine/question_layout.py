"""The row layout of a batch of texts and their questions: host-side arrays, no MLX, no model.

A text's questions' prompts share their first tokens (the system prompt, the text). The fed
part they have in common is the longest common token prefix of the text's whole prompts,
never a guess: BPE may merge a text's last characters (".", "?", spaces, a newline) with the
question's blank line, and then that token is part of each question's tail. A tail holds at
least one token: its last predicts the label.

Tails that begin alike share more: the tails of a multi-label question ("Does this message
concern refund? ...", "... login? ...") are one part up to where they differ, fed once and
seen by each (`tail_parts`), as the text is seen by every question.

A text's row holds its common tokens once, then its tails' parts, back to back, then a
segment a label of each question whose labels are several tokens (the label's earlier
tokens, teacher-forced behind its question's tail):
    [0, P)                  the shared prefix; row r attends to its first `shared[r]` slots
    [P, P + n)              text r's common tokens (n = `lengths[r]`)
    [P + n, ...)            the tails' parts: a part's positions follow its text and the parts
                            it grows from, which it also sees
    [..., ...)              label j of question q: L_q slots, positions right after tail q
A block mask shows each slot exactly its own prompt: a tail token the text, the parts its
tail grows from and its part up to itself; a label token that and its label up to itself. So
one forward scores every question with no copy of the text's keys and values, and a row's
slots depend on its text alone, whatever the batch's width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .layout import PAD_ID, RowLayout


def common_part(prompts: list[list[int]]) -> int:
    """Tokens every prompt of a text begins with, leaving each at least one of its own."""
    n = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for k in range(n):
        if any(p[k] != first[k] for p in prompts[1:]):
            return k
    return n


def tail_parts(tails: Sequence[Sequence[int]]) -> tuple[list[tuple[Sequence[int], int]], list[int]]:
    """The tails as a tree: its parts (tokens, the part they grow from or -1), in feeding
    order, and each tail's last part. Tails that begin with the same token share their
    common part as one part, then the same again past it; each keeps a token of its own."""
    parts: list[tuple[Sequence[int], int]] = []
    leaf = [0] * len(tails)
    todo = [(list(range(len(tails))), 0, -1)]  # (tails, where they part, the part they grow from)
    while todo:
        members, at, parent = todo.pop()
        groups: dict[int, list[int]] = {}
        for k in members:
            groups.setdefault(tails[k][at], []).append(k)
        later = []
        for group in groups.values():
            c = common_part([tails[k][at:] for k in group]) if len(group) > 1 else 0
            if c == 0:
                for k in group:
                    leaf[k] = len(parts)
                    parts.append((tails[k][at:], parent))
            else:
                parts.append((tails[group[0]][at : at + c], parent))
                later.append((group, at + c, len(parts) - 1))
        todo.extend(reversed(later))
    return parts, leaf


def fed_tails(tails: Sequence[Sequence[int]]) -> list[int]:
    """The tokens a text's tails feed: each part once."""
    return [t for tokens, _ in tail_parts(tails)[0] for t in tokens]


def text_and_tails(prompts: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """(the tokens a text's prompts share, each prompt's tail after them)."""
    c = common_part(prompts)
    return prompts[0][:c], [p[c:] for p in prompts]


@dataclass(frozen=True)
class Segment:
    """Slots of a row after its text: `tokens` from slot `start` (own tokens), at positions
    from `base` past the text's first fed token; they also see the slot ranges `sees`."""

    start: int
    tokens: tuple[int, ...]
    base: int
    sees: tuple[tuple[int, int], ...] = ()

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class QuestionRows:
    """A batch's texts, each text's row its common tokens then its questions' segments."""

    text: RowLayout  # the text rows: prefix, shared slots and common tokens
    tails: tuple[tuple[tuple[int, ...], ...], ...]  # tails[r][k]: text r's tail of question k
    teacher: tuple[np.ndarray | None, ...] = ()  # question k's (J, L) label inputs, or None

    @classmethod
    def build(
        cls,
        texts: list[tuple[list[int], list[list[int]]]],
        prefix: list[int],
        teacher: tuple[np.ndarray | None, ...] = (),
    ) -> QuestionRows:
        """From each text's (common tokens, tails), as `text_and_tails` gives them, and each
        question's teacher-forced label inputs (`LabelSet.teacher_inputs`; None: one token)."""
        text = RowLayout.build([common for common, _ in texts], prefix, 0)
        return cls(text, tuple(tuple(map(tuple, tails)) for _, tails in texts), tuple(teacher))

    @property
    def batch(self) -> int:
        return self.text.batch

    def segments(self, r: int) -> list[Segment]:
        """Row r's tails' parts (`tail_parts`), then its label segments (question by
        question, label by label)."""
        return self._segments[r][0]

    @cached_property
    def _segments(self) -> list[tuple[list[Segment], list[Segment], int]]:
        """Each row's (segments, each question's last tail part, how many tail parts)."""
        return [self._row_segments(r) for r in range(self.batch)]

    def _row_segments(self, r: int) -> tuple[list[Segment], list[Segment], int]:
        n, out = int(self.text.lengths[r]), []
        parts, leaf = tail_parts(self.tails[r])
        at = n
        for tokens, parent in parts:
            up = out[parent] if parent >= 0 else None
            base = up.base + len(up.tokens) if up else n
            sees = (*up.sees, (up.start, up.end)) if up else ()
            out.append(Segment(at, tuple(tokens), base, sees))
            at += len(tokens)
        tails = [out[k] for k in leaf]
        for tail, labels in zip(tails, self.teacher):
            if labels is None:
                continue
            for j in range(len(labels)):
                inputs = tuple(map(int, labels[j]))
                sees = (*tail.sees, (tail.start, tail.end))
                out.append(Segment(at, inputs, tail.base + len(tail.tokens), sees))
                at += len(inputs)
        return out, tails, len(parts)

    @property
    def row_lengths(self) -> np.ndarray:
        """(B,) slots a row fills: its text's tokens, then every segment's."""
        return np.array(
            [s[-1].end for s in map(self.segments, range(self.batch))],
            np.int32,
        )

    @property
    def width(self) -> int:
        return int(self.row_lengths.max())

    @property
    def capacity(self) -> int:
        return self.text.prefix_width + self.width

    @cached_property
    def _slots(self) -> dict[str, np.ndarray]:
        """(B, W) tables of every slot: its token, where its own part begins (0 for the text,
        W for padding: it sees the text) and its positions' base."""
        B, W = self.batch, self.width
        t = {name: np.zeros((B, W), np.int32) for name in ("token", "own", "base")}
        t["token"][:] = PAD_ID
        t["own"][:] = W
        t["base"][:] = self.text.lengths[:, None]
        for r, fed in enumerate(self.text.fed):
            t["token"][r, : len(fed)] = fed
            t["own"][r, : len(fed)] = 0
            t["base"][r, : len(fed)] = 0
            for s in self.segments(r):
                part = slice(s.start, s.end)
                t["token"][r, part] = s.tokens
                t["own"][r, part], t["base"][r, part] = s.start, s.base
        return t

    def tokens(self) -> np.ndarray:
        """(B, W) each row's text then its segments, padded with PAD_ID."""
        return self._slots["token"]

    def positions(self) -> np.ndarray:
        """(B, W) rotary position of every slot: a segment's restart after its text (or its
        question's tail)."""
        t = self._slots
        own = np.arange(self.width)[None, :]
        return (self.text.shared[:, None] + t["base"] + np.maximum(own - t["own"], 0)).astype(
            np.int32
        )

    def mask(self) -> np.ndarray:
        """(B, 1, W, P + W): a text token sees the row's shared prefix and the text up to
        itself; a segment's token the prefix, the whole text, the slots it also sees and its
        own segment up to itself; a padding slot the prefix and the text."""
        P, W, t = self.text.prefix_width, self.width, self._slots
        k = np.arange(P + W)[None, None, :]
        q = np.arange(W)[None, :, None]
        rel = k - P
        text = (rel < self.text.lengths[:, None, None]) & (rel <= q)
        own = (rel >= t["own"][:, :, None]) & (rel <= q)
        seen = np.where(rel < 0, k < self.text.shared[:, None, None], text | own)
        for r in range(self.batch):
            for s in self.segments(r):
                for a, b in s.sees:
                    seen[r, s.start : s.end, P + a : P + b] = True
        return seen[:, None]

    def last(self) -> np.ndarray:
        """(B, K) slot of each tail's last token: its hidden state predicts the first label
        token of its question."""
        return np.array([[s.end - 1 for s in tails] for _, tails, _ in self._segments], np.int32)

    def label_inputs(self) -> np.ndarray:
        """(B, M) slots of every label segment's tokens, in order: their hidden states
        predict the labels' later tokens."""
        return np.array(
            [
                [s.start + i for s in segments[parts:] for i in range(len(s.tokens))]
                for segments, _, parts in self._segments
            ],
            np.int32,
        ).reshape(self.batch, -1)

    def kept(self) -> np.ndarray:
        """(B, K + M): `last`, then `label_inputs`."""
        return np.concatenate([self.last(), self.label_inputs()], axis=1)
