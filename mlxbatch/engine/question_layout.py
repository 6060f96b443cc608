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
