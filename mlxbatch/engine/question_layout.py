"""The row layout of a batch of texts and their questions: host-side arrays, no MLX, no model.

A text's questions' prompts share their first tokens (the system prompt, the text); the fed
part they have in common is laid out once per text, as a `RowLayout` row, and each question
then adds only its own tail, one question at a time, at the same slots:
    [0, P)                  the shared prefix; row r attends to its first `shared[r]` slots
    [P, P + W)              text r's common tokens, `lengths[r]` of them
    [P + W, P + W + T)      question q's tail for text r, `tail_lengths[r]` of them, then
                            (multi-token labels only, a row a label) its teacher tokens
The common part is the longest common token prefix of the text's whole prompts, never a
guess: BPE may merge a text's last characters (".", "?", spaces, a newline) with the
question's blank line, and then that token is part of each question's tail. A tail holds at
least one token: its last predicts the label.

The first pass (`QuestionRows`) lays out each text's common tokens and all its tails in one
row, back to back, as an item's fed tokens are counted: a block mask shows each tail the text
and itself only, and its rotary positions restart at the text's end, so the row holds every
prompt of its text at once, with no copy of the text's keys and values:
    [0, P)                  the shared prefix, as above
    [P, P + n)              text r's common tokens (n = `lengths[r]`)
    [P + n, P + n + T_0)    question 0's tail, positions n .. n + T_0 - 1 after the prefix
    [P + n + T_0, ...)      question 1's tail, at the same positions again; and so on
A row's slots are fixed by its text alone, whatever the batch's width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import PAD_ID, RowLayout, batch_mask


def common_part(prompts: list[list[int]]) -> int:
    """Tokens every prompt of a text begins with, leaving each at least one of its own."""
    n = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for k in range(n):
        if any(p[k] != first[k] for p in prompts[1:]):
            return k
    return n


def text_and_tails(prompts: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """(the tokens a text's prompts share, each prompt's tail after them)."""
    c = common_part(prompts)
    return prompts[0][:c], [p[c:] for p in prompts]


def repeat_rows(text: RowLayout, n: int) -> RowLayout:
    """Each text row `n` times over (row r -> rows r * n ... r * n + n - 1)."""
    return RowLayout(
        text.prefix_width,
        np.repeat(text.shared, n),
        tuple(f for f in text.fed for _ in range(n)),
        0,
    )


@dataclass(frozen=True)
class TailLayout:
    """Question q's tails behind a batch's text rows (`text`)."""

    text: RowLayout
    tails: tuple[tuple[int, ...], ...]  # each row's tail tokens

    @property
    def batch(self) -> int:
        return self.text.batch

    @property
    def width(self) -> int:
        """T: the longest tail."""
        return max(len(t) for t in self.tails)

    @property
    def tail_lengths(self) -> np.ndarray:
        return np.array([len(t) for t in self.tails], np.int32)

    @property
    def start(self) -> int:
        """The first tail slot: the text rows' end."""
        return self.text.prefix_width + self.text.width

    @property
    def capacity(self) -> int:
        return self.start + self.width

    def tokens(self) -> np.ndarray:
        """(B, T) tail tokens, padded with PAD_ID."""
        out = np.full((self.batch, self.width), PAD_ID, np.int32)
        for r, t in enumerate(self.tails):
            out[r, : len(t)] = t
        return out

    def positions(self) -> np.ndarray:
        """(B,) rotary position of each row's first tail token: right after its text."""
        return self.text.shared + self.text.lengths

    def mask(self) -> np.ndarray:
        """(B, 1, T, start + T): the text rows' mask, the tail slots causal after them."""
        t = self.text
        return batch_mask(t.prefix_width, t.shared, t.lengths, t.width, self.start, self.width)

    def last(self) -> np.ndarray:
        """(B,) index of each row's last tail token: its hidden state predicts the label."""
        return self.tail_lengths - 1

    def repeated(self, teacher: np.ndarray) -> TailLayout:
        """The label pass of multi-token labels: row r * J + j is text r's row with label j's
        teacher tokens (`teacher`, (J, L)) fed right after its tail, in the same pass as the
        tail again. In the cache the tail would sit behind the text's padded width, where the
        host attention's blocks fall at another offset in each batch: fed again, a batch's
        company never changes a row's bits."""
        J = len(teacher)
        tails = tuple((*tail, *map(int, teacher[j])) for tail in self.tails for j in range(J))
        return TailLayout(repeat_rows(self.text, J), tails)

    def label_inputs(self, n_labels: int, label_slots: int) -> np.ndarray:
        """(B * J, 1 + L) for `repeated` rows: the index of the hidden state predicting each
        label token (the tail's last, then each teacher token's)."""
        last = np.repeat(self.tail_lengths, n_labels) - 1
        return last[:, None] + np.arange(1 + label_slots)[None, :]


@dataclass(frozen=True)
class QuestionRows:
    """A batch's texts, each text's row its common tokens then every question's tail."""

    text: RowLayout  # the text rows: prefix, shared slots and common tokens
    tails: tuple[tuple[tuple[int, ...], ...], ...]  # tails[r][k]: text r's tail of question k

    @classmethod
    def build(
        cls, texts: list[tuple[list[int], list[list[int]]]], prefix: list[int]
    ) -> QuestionRows:
        """From each text's (common tokens, tails), as `text_and_tails` gives them."""
        text = RowLayout.build([common for common, _ in texts], prefix, 0)
        return cls(text, tuple(tuple(map(tuple, tails)) for _, tails in texts))

    @property
    def batch(self) -> int:
        return self.text.batch

    @property
    def row_lengths(self) -> np.ndarray:
        """(B,) fed tokens a row: its text's, then every tail's."""
        return self.text.lengths + np.array([sum(map(len, t)) for t in self.tails], np.int32)

    @property
    def width(self) -> int:
        return int(self.row_lengths.max())

    @property
    def capacity(self) -> int:
        return self.text.prefix_width + self.width

    def tokens(self) -> np.ndarray:
        """(B, W) each row's text then its tails, padded with PAD_ID."""
        out = np.full((self.batch, self.width), PAD_ID, np.int32)
        for r, (fed, tails) in enumerate(zip(self.text.fed, self.tails)):
            row = [*fed, *(t for tail in tails for t in tail)]
            out[r, : len(row)] = row
        return out

    def segments(self) -> np.ndarray:
        """(B, W) where each slot's own part begins: 0 for a text token (it sees the text up
        to itself), a tail's first slot for its tokens, W for padding (it sees the text)."""
        out = np.full((self.batch, self.width), self.width, np.int32)
        for r, (n, tails) in enumerate(zip(self.text.lengths, self.tails)):
            out[r, :n] = 0
            at = int(n)
            for tail in tails:
                out[r, at : at + len(tail)] = at
                at += len(tail)
        return out

    def positions(self) -> np.ndarray:
        """(B, W) rotary position of every slot: a tail's restart at its text's end."""
        seg, n = self.segments(), self.text.lengths[:, None]
        own = np.arange(self.width)[None, :]
        after = np.where(seg == 0, own, n + np.maximum(own - seg, 0))
        return (self.text.shared[:, None] + after).astype(np.int32)

    def mask(self) -> np.ndarray:
        """(B, 1, W, P + W): a text token sees the row's shared prefix and the text up to
        itself; a tail token the prefix, the whole text and its own tail up to itself; a
        padding slot the prefix and the text."""
        P, W, t = self.text.prefix_width, self.width, self.text
        k = np.arange(P + W)[None, None, :]
        q = np.arange(W)[None, :, None]
        seg = self.segments()[:, :, None]
        rel = k - P
        text = (rel < t.lengths[:, None, None]) & (rel <= q)
        own = (rel >= seg) & (rel <= q)
        seen = np.where(rel < 0, k < t.shared[:, None, None], text | own)
        return seen[:, None]

    def last(self) -> np.ndarray:
        """(B, K) index of each tail's last token: its hidden state predicts the labels."""
        ends = [np.cumsum([len(t) for t in tails]) for tails in self.tails]
        return (self.text.lengths[:, None] + np.array(ends, np.int32) - 1).astype(np.int32)
