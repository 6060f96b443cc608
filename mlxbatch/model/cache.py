"""The batched KV cache of a padded batch behind a shared prefix (its mask: engine/layout.py).

Cache layout (slots along axis 2):
    keys[layer], values[layer]: (B, n_kv_heads, capacity, head_dim)
    [0, P)            shared prefix, identical in every row (broadcast from a B=1 prefill)
    [P, P + W)        each row's own tokens, left-aligned, padded to the batch width W
    [P + W, ...)      teacher-forced label tokens (multi-token labels only)
Slots [0, offset) are filled; `crop(P)` drops everything after the prefix in O(1), and
`use_rows(B)` makes the first B rows the cache, so one buffer serves every smaller batch.
"""

from __future__ import annotations

import mlx.core as mx


class KVCache:
    def __init__(self, keys: list[mx.array], values: list[mx.array], offset: int = 0):
        self.keys, self.values, self.offset = keys, values, offset
        self.rows = keys[0].shape[0]  # rows in use: [0, rows) of the buffers

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
        return self.rows

    @property
    def allocated(self) -> int:
        return self.keys[0].shape[0]

    def use_rows(self, n: int) -> None:
        """Make the first `n` rows of the buffers the cache's rows (their filled slots kept)."""
        if not 1 <= n <= self.allocated:
            raise ValueError(f"cannot use {n} rows of a cache with {self.allocated}")
        self.rows = n

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def update(self, layer: int, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Write k, v (B, KV, L, hd) at [offset, offset + L); return slots [0, offset + L)."""
        end = self.offset + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"KV cache overflow: {end} slots needed, capacity {self.capacity}")
        B = self.rows
        if k.shape[0] != B:
            raise ValueError(f"KV cache holds {B} rows, the update has {k.shape[0]}")
        if B == self.allocated:
            self.keys[layer][:, :, self.offset : end, :] = k
            self.values[layer][:, :, self.offset : end, :] = v
            return self.keys[layer][:, :, :end, :], self.values[layer][:, :, :end, :]
        self.keys[layer][:B, :, self.offset : end, :] = k
        self.values[layer][:B, :, self.offset : end, :] = v
        return self.keys[layer][:B, :, :end, :], self.values[layer][:B, :, :end, :]

    def advance(self, n: int) -> None:
        self.offset += n

    def crop(self, n: int) -> None:
        """Forget every slot from `n` on; the buffers stay for reuse."""
        if not 0 <= n <= self.offset:
            raise ValueError(f"cannot crop a cache at offset {self.offset} to {n}")
        self.offset = n

    def expand(self, batch: int, capacity: int) -> KVCache:
        """A new cache of `batch` rows whose first `offset` slots are this B=1 cache's."""
        if self.allocated != 1:
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
            a = mx.repeat(a[: self.rows, :, : self.offset], repeats, axis=0)
            pad = mx.zeros((a.shape[0], a.shape[1], capacity - self.offset, a.shape[3]), a.dtype)
            return mx.concatenate([a, pad], axis=2)

        return KVCache([rep(k) for k in self.keys], [rep(v) for v in self.values], self.offset)
