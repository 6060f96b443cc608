"""Attention on the host: the softmax numerator in NumPy (MLX's CPU `exp` runs on one thread),
its products in the plain or the tiled layout of host_layout.py (hostops.py says which, why)."""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from .host_layout import BLOCK, EDGE, TILE, min_cols, pad_rows, plain_rows, tile_rows, writable


@dataclass(frozen=True)
class Host:
    """A forward's host-kernel state: the attention mask in additive form, made once."""

    mask: np.ndarray  # float32 (B, 1, 1, L, S'): 0 where seen, -inf elsewhere (padded keys)
    start: int  # keys before this forward's own tokens: [0, start) and [start, S) are blocked apart
    keys: int  # S: real key slots
    _tiled: dict = field(default_factory=dict, compare=False, repr=False)

    def tiled(self, group: int, tile: int) -> np.ndarray:
        """The mask laid out as the tiled scores, (B, 1, T, S'/BLOCK, tile, BLOCK), made once."""
        if (group, tile) not in self._tiled:
            B, _, _, L, Sp = self.mask.shape
            rows = group * L
            tiles = -(-rows // tile)
            out = np.zeros((B, 1, tiles * tile, Sp), np.float32)
            out[:, :, :rows] = np.broadcast_to(self.mask, (B, 1, group, L, Sp)).reshape(
                B, 1, rows, Sp
            )
            out = out.reshape(B, 1, tiles, tile, Sp // BLOCK, BLOCK).transpose(0, 1, 2, 4, 3, 5)
            self._tiled[(group, tile)] = out
        return self._tiled[(group, tile)]


def key_slots(start: int, keys: int) -> np.ndarray:
    """Each key slot's place on the padded key axis: cache and new tokens each padded to whole
    blocks, so a row's keys fall in the same blocks whatever the batch's width."""
    old = -(-start // BLOCK) * BLOCK
    idx = np.arange(keys)
    return np.where(idx < start, idx, idx - start + old)


def padded_keys(start: int, keys: int) -> int:
    return -(-start // BLOCK) * BLOCK + -(-(keys - start) // BLOCK) * BLOCK


def prepare(mask: mx.array | str | None, q_len: int, k_len: int, start: int | None = None) -> Host:
    """Host state for `q_len` queries over `k_len` keys under `mask` (bool (B, 1, L, S),
    "causal" or None), the keys from `start` (default: the last `q_len`) being new tokens."""
    start = k_len - q_len if start is None else start
    if mask is None:
        seen = np.ones((1, 1, q_len, k_len), bool)
    elif isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown mask {mask!r}")
        seen = np.arange(k_len)[None, :] <= (k_len - q_len + np.arange(q_len))[:, None]
        seen = seen[None, None]
    else:
        seen = np.asarray(mask)  # (B, 1, L, S) bool
    add = np.full((*seen.shape[:3], padded_keys(start, k_len)), -np.inf, np.float32)
    add[..., key_slots(start, k_len)] = np.where(seen, np.float32(0), np.float32(-np.inf))
    return Host(add[:, :, None], start, k_len)  # broadcast over the query heads of a KV head


def _spread(a: mx.array, start: int, width: int) -> mx.array:
    """Keys or values (B, KV, S, d) laid out on the padded key axis (zeros in the padding)."""
    B, KV, S, d = a.shape
    old = -(-start // BLOCK) * BLOCK
    parts = [a[:, :, :start], mx.zeros((B, KV, old - start, d), a.dtype), a[:, :, start:]]
    parts.append(mx.zeros((B, KV, width - old - (S - start), d), a.dtype))
    return mx.concatenate(parts, axis=2)


def _softmax_numerator(s: np.ndarray, axis) -> None:
    """exp(s - max) in place over `axis` (the keys); a fully masked row's exp(-inf) = 0."""
    top = s.max(axis=axis, keepdims=True)
    top[~np.isfinite(top)] = 0  # fully masked rows: exp(-inf) = 0 below, then 0 / tiny = 0
    s -= top
    np.exp(s, out=s)


def plain_attention(q, k, v, scale: float, host: Host) -> mx.array:
    """Grouped-query attention (B, H, L, hd) over keys/values (B, KV, S, hd), a KV head's query
    rows as one padded product (the plain layout); a row with no visible key gets zeros."""
    B, H, L, hd = q.shape
    KV, S = k.shape[1], k.shape[2]
    G, Sp = H // KV, host.mask.shape[-1]
    rows = G * L
    k = _spread(k, host.start, Sp)
    ones = mx.ones((B, KV, S, 1), v.dtype)  # the denominator, summed as the numerator is
    v = _spread(mx.concatenate([v, ones], axis=-1), host.start, Sp)  # (B, KV, S', hd + 1)
    M = plain_rows(rows, Sp * hd, (hd + 1) * BLOCK)
    qs = pad_rows((q * scale).reshape(B, KV, rows, hd), M, axis=2)  # zero queries: scores 0
    scores = qs @ k.swapaxes(-1, -2)  # (B, KV, M, S')
    mx.eval(scores)
    s = writable(scores)[:, :, :rows].reshape(B, KV, G, L, Sp)  # exp(scores) in place
    s += host.mask
    _softmax_numerator(s, -1)
    acc = mx.zeros((B, KV, M, hd + 1), q.dtype)
    for a in range(0, Sp, BLOCK):  # one accumulator, block after block: a fixed order
        acc = mx.addmm(acc, scores[..., a : a + BLOCK], v[:, :, a : a + BLOCK])
    acc = acc[:, :, :rows]
    den = mx.maximum(acc[..., hd:], np.finfo(np.float32).tiny)
    return (acc[..., :hd] / den).reshape(B, H, L, hd)


def tiled_attention(q, k, v, scale: float, host: Host) -> mx.array:
    """`plain_attention` with query rows in tiles between zero rows and every product one block
    of BLOCK keys, so its shape is the same whatever the key count (the tiled layout)."""
    B, H, L, hd = q.shape
    KV, S = k.shape[1], k.shape[2]
    G, Sp = H // KV, host.mask.shape[-1]
    rows = G * L
    tiles = -(-rows // TILE)
    span = rows if tiles == 1 else TILE  # real rows a tile
    R = tile_rows(span, BLOCK, hd)
    d = max(hd, min_cols(R, BLOCK))  # the depth of the scores and the width of V, zero-padded
    k = pad_rows(_spread(k, host.start, Sp), d, axis=-1)  # (B, KV, S', d)
    ones = mx.ones((B, KV, S, 1), v.dtype)  # the denominator, summed as the numerator is
    v = _spread(pad_rows(mx.concatenate([v, ones], axis=-1), d + 1, axis=-1), host.start, Sp)
    qs = pad_rows((q * scale).reshape(B, KV, rows, hd), tiles * span, axis=2)
    qs = pad_rows(qs.reshape(B, KV, tiles, span, hd), R, axis=3, front=EDGE)
    qs = pad_rows(qs, d, axis=-1)[:, :, :, None]  # (B, KV, T, 1, R, d): scores per key block
    blocks = k.reshape(B, KV, 1, Sp // BLOCK, BLOCK, d)
    scores = (blocks @ qs.swapaxes(-1, -2)).swapaxes(-1, -2)  # (B, KV, T, S'/BLOCK, R, BLOCK)
    mx.eval(scores)
    s = writable(scores)[:, :, :, :, EDGE : EDGE + span]  # a view: exp(scores) in place
    s += host.tiled(G, span)  # (B, 1, T, S'/BLOCK, span, BLOCK)
    _softmax_numerator(s, (3, 5))
    acc = mx.zeros((B, KV, tiles, d + 1, R), q.dtype)  # transposed: rows are OpenBLAS's A rows
    vt = v.reshape(B, KV, 1, Sp // BLOCK, BLOCK, d + 1).swapaxes(-1, -2)
    for i in range(Sp // BLOCK):  # one accumulator, block after block: a fixed order
        acc = mx.addmm(acc, vt[:, :, :, i], scores[:, :, :, i].swapaxes(-1, -2))
    acc = acc.swapaxes(-1, -2)[:, :, :, EDGE : EDGE + span].reshape(B, KV, tiles * span, d + 1)
    acc = acc[:, :, :rows]
    den = mx.maximum(acc[..., hd : hd + 1], np.finfo(np.float32).tiny)
    return (acc[..., :hd] / den).reshape(B, H, L, hd)
