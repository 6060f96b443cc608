"""The row layout of one batch behind the shared prefix: host-side arrays, no MLX, no model.

A batch of B prompts is laid out in the KV cache (see `model/cache.py`) as
    [0, P)           the shared prefix; row r attends to its first `shared[r]` slots
    [P, P + W)       row r's own fed tokens, left-aligned, `lengths[r]` of them, W = max
    [P + W, P+W+T)   T teacher-forced label tokens (multi-token labels only), per label
From it come the token matrix, the rotary positions and the boolean mask of the row pass,
and the same three for the label pass (every row repeated once per label).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAD_ID = 0  # any in-vocabulary id: padded slots are masked out of every row


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def split(prompt: list[int], prefix: list[int]) -> tuple[int, list[int]]:
    """(prefix slots this row shares, the tokens it feeds itself): less than the whole prefix
    where BPE merges the text's start with the prefix's end; at least one token is fed."""
    k = min(common_prefix_len(prompt, prefix), len(prompt) - 1)
    return k, prompt[k:]


def batch_mask(
    prefix_width: int,
    prefix_lens: np.ndarray,
    lengths: np.ndarray,
    width: int,
    q_start: int,
    q_len: int,
) -> np.ndarray:
    """Which cache slot each query may attend to: bool (B, 1, q_len, q_start + q_len).

    Row r sees prefix slots [0, prefix_lens[r]) of the shared [0, P) (its own prompt may
    diverge from the shared prefix at the end), its `lengths[r]` real tokens in
    [P, P + width) (the rest of that region is padding), and label slots [P + width, ...),
    all causally. Padding queries see at least the row's real tokens: no softmax row is empty.
    """
    k = np.arange(q_start + q_len)[None, None, :]
    q = (q_start + np.arange(q_len))[None, :, None]
    n = np.asarray(lengths)[:, None, None]
    p = np.asarray(prefix_lens)[:, None, None]
    rel = k - prefix_width
    valid = np.where(rel < 0, k < p, (rel >= width) | (rel < n))
    return (valid & (k <= q))[:, None]


@dataclass(frozen=True)
class RowLayout:
    prefix_width: int  # P: filled slots of the shared prefix cache
    shared: np.ndarray  # (B,) prefix slots each row attends to
    fed: tuple[tuple[int, ...], ...]  # each row's own tokens
    label_slots: int  # T: teacher-forced label tokens after the row's tokens

    @classmethod
    def build(cls, prompts: list[list[int]], prefix: list[int], label_slots: int) -> RowLayout:
        parts = [split(p, prefix) for p in prompts]
        shared = np.array([k for k, _ in parts], np.int32)
        return cls(len(prefix), shared, tuple(tuple(s) for _, s in parts), label_slots)

    @property
    def batch(self) -> int:
        return len(self.fed)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(s) for s in self.fed], np.int32)

    @property
    def width(self) -> int:
        return max(len(s) for s in self.fed)

    @property
    def capacity(self) -> int:
        """Cache slots a row needs: prefix, own tokens, label tokens."""
        return self.prefix_width + self.width + self.label_slots

    def tokens(self) -> np.ndarray:
        """(B, W) fed tokens, padded with PAD_ID."""
        out = np.full((self.batch, self.width), PAD_ID, np.int32)
        for r, s in enumerate(self.fed):
            out[r, : len(s)] = s
        return out

    def positions(self) -> np.ndarray:
        """(B,) rotary position of each row's first fed token."""
        return self.shared

    def mask(self) -> np.ndarray:
        P, W = self.prefix_width, self.width
        return batch_mask(P, self.shared, self.lengths, W, P, W)

    def last(self) -> np.ndarray:
        """(B,) index of each row's last real token: its hidden state predicts the label."""
        return self.lengths - 1

    # The label pass: row r * J + j feeds label j's teacher tokens behind row r.
    def label_positions(self, n_labels: int) -> np.ndarray:
        return np.repeat(self.shared + self.lengths, n_labels)

    def label_mask(self, n_labels: int) -> np.ndarray:
        P, W, T = self.prefix_width, self.width, self.label_slots
        shared = np.repeat(self.shared, n_labels)
        return batch_mask(P, shared, np.repeat(self.lengths, n_labels), W, P + W, T)
