"""The batched KV cache and the attention mask of a padded batch behind a shared prefix.

Cache layout (slots along axis 2):
    keys[layer], values[layer]: (B, n_kv_heads, capacity, head_dim)
    [0, P)            shared prefix, identical in every row (broadcast from a B=1 prefill)
    [P, P + W)        each row's own tokens, left-aligned, padded to the batch width W
    [P + W, ...)      teacher-forced label tokens (multi-token labels only)
Slots [0, offset) are filled; `crop(P)` drops everything after the prefix in O(1).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np


class KVCache:
    def __init__(self, keys: list[mx.array], values: list[mx.array], offset: int = 0):
        self.keys, self.values, self.offset = keys, values, offset

    @classmethod
    def allocate(
        cls, n_layers: int, batch: int, n_kv_heads: int, head_dim: int, capacity: int, dtype
    ) -> KVCache:
        shape = (batch, n_kv_heads, capacity, head_dim)
        return cls(
            [mx.zeros(shape, dtype) for _ in range(n_layers)],
            [mx.zeros(shape, dtype) for _ in range(n_layers)],
        )

    @property
    def batch(self) -> int:
        return self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def update(self, layer: int, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Write k, v (B, KV, L, hd) at [offset, offset + L); return slots [0, offset + L)."""
        end = self.offset + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"KV cache overflow: {end} slots needed, capacity {self.capacity}")
        self.keys[layer][:, :, self.offset : end, :] = k
        self.values[layer][:, :, self.offset : end, :] = v
        return self.keys[layer][:, :, :end, :], self.values[layer][:, :, :end, :]

    def advance(self, n: int) -> None:
        self.offset += n

    def crop(self, n: int) -> None:
        """Forget every slot from `n` on; the buffers stay for reuse."""
        if not 0 <= n <= self.offset:
            raise ValueError(f"cannot crop a cache at offset {self.offset} to {n}")
        self.offset = n

    def expand(self, batch: int, capacity: int) -> KVCache:
        """A new cache of `batch` rows whose first `offset` slots are this B=1 cache's."""
        if self.batch != 1:
            raise ValueError("only a batch-1 (prefix) cache can be expanded")
        if capacity < self.offset:
            raise ValueError(f"capacity {capacity} is below the prefix length {self.offset}")

        def grow(a: mx.array) -> mx.array:
            head = mx.broadcast_to(
                a[:, :, : self.offset], (batch, a.shape[1], self.offset, a.shape[3])
            )
            tail = mx.zeros((batch, a.shape[1], capacity - self.offset, a.shape[3]), a.dtype)
            return mx.concatenate([head, tail], axis=2)

        return KVCache([grow(k) for k in self.keys], [grow(v) for v in self.values], self.offset)

    def repeat_rows(self, repeats: int, capacity: int) -> KVCache:
        """Each row repeated `repeats` times (row r -> rows r*repeats ...), filled slots kept."""

        def rep(a: mx.array) -> mx.array:
            a = mx.repeat(a[:, :, : self.offset], repeats, axis=0)
            pad = mx.zeros((a.shape[0], a.shape[1], capacity - self.offset, a.shape[3]), a.dtype)
            return mx.concatenate([a, pad], axis=2)

        return KVCache([rep(k) for k in self.keys], [rep(v) for v in self.values], self.offset)


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
