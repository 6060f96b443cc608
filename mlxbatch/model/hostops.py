"""The forward's transcendental elementwise work on the host, for MLX's CPU device.

On the CPU, MLX evaluates `exp` one element at a time on one thread (measured here: 9.0 ns an
element, against 0.34 ns for NumPy's vectorised float32 `exp`), so SiLU and the attention
softmax cost more than the matmuls around them. With `host_kernels=True` the forward evaluates the
matmul that feeds each of them, runs the elementwise part in NumPy on the evaluated buffer,
and hands the result back to MLX: two synchronisation points a layer (the forward adds a
third, each layer's output: see qwen2.py), each a few hundred microseconds against tens of
milliseconds saved. Only for float32 on the CPU (NumPy has no
bfloat16, and on a GPU the MLX kernels are the fast ones).

The functions are the same mathematics as the MLX path, `g / (1 + exp(-g)) * u` and a
max-subtracted softmax, in float32; results differ from MLX's only in the last bits of
`exp`, so the gold loop (always pure MLX) stays an independent check of this path.

Batch invariance: a row's results here do not depend on the other rows of its batch, its
width or the key count. OpenBLAS picks a kernel by shape, and its kernels sum in different
orders (measured, scripts/batch_invariance.py): a small-matrix kernel (M*N*K <= 100^3), a
"direct" one (row-major A @ B with beta = 0, M*N*K < 28*512^2; never called here: products
are A @ B.T, or accumulate with beta = 1) and the general kernel, which splits K into blocks
of up to ~448 chosen from K. So every product here has rows added until M*N*K exceeds the
small bound (`padded_rows`): the general kernel, whose result for a row depends only on K. Attention sums over keys in fixed blocks of BLOCK slots (`addmm` into one
accumulator, beta=1, never the direct kernel) with the softmax denominator as an extra
ones column of V, so it is summed in the same order as the numerator; masked keys add exact
zeros. mx.fast.scaled_dot_product_attention (the GPU path) gives no such guarantee.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

_local = threading.local()
CHUNK = 1 << 18  # elements a host kernel works on at a time (1 MB of float32)
SMALL = 100**3  # M*N*K at or below which OpenBLAS may use its small-matrix kernel
BLOCK = 64  # key slots summed by one product (under the general kernel's K blocking)


@dataclass(frozen=True)
class Host:
    """A forward's host-kernel state: the attention mask in additive form, made once."""

    mask: np.ndarray  # float32 (B, 1, 1, L, S'): 0 where seen, -inf elsewhere (padded keys)
    start: int  # keys before this forward's own tokens: [0, start) and [start, S) are blocked apart
    keys: int  # S: real key slots


def available(dtype: mx.Dtype) -> bool:
    """Whether host elementwise kernels apply: the CPU device and float32 weights, unless
    `MLXBATCH_HOST_KERNELS=0` (to measure or rule them out)."""
    if os.environ.get("MLXBATCH_HOST_KERNELS", "1") == "0":
        return False
    return mx.default_device() == mx.cpu and dtype == mx.float32


def key_slots(start: int, keys: int) -> np.ndarray:
    """Where each of `keys` slots goes on the padded key axis: the slots before `start` (the
    cache) and from it (this forward's tokens) each padded to whole blocks, so a row's keys
    fall in the same blocks whatever the batch's width."""
    old = -(-start // BLOCK) * BLOCK
    idx = np.arange(keys)
    return np.where(idx < start, idx, idx - start + old)


def padded_keys(start: int, keys: int) -> int:
    return -(-start // BLOCK) * BLOCK + -(-(keys - start) // BLOCK) * BLOCK


def prepare(mask: mx.array | str | None, q_len: int, k_len: int, start: int | None = None) -> Host:
    """Host state for a forward of `q_len` queries over `k_len` keys under `mask`
    (bool (B, 1, L, S), "causal" or None), the keys from `start` (default: the last `q_len`)
    on being the forward's own tokens."""
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


def padded_rows(m: int, n: int, k: int) -> int:
    """Rows a product (m, k) @ (k, n) is run with: at least m, and enough for OpenBLAS's
    general kernel (see the module docstring)."""
    return max(m, SMALL // (n * k) + 1)


def pad_rows(x: mx.array, rows: int, axis: int = 0) -> mx.array:
    """`x` with zero rows appended along `axis` up to `rows`."""
    if x.shape[axis] >= rows:
        return x
    shape = list(x.shape)
    shape[axis] = rows - x.shape[axis]
    return mx.concatenate([x, mx.zeros(shape, x.dtype)], axis=axis)


def matmul_t(x: mx.array, w: mx.array, bias: mx.array | None = None) -> mx.array:
    """x (..., K) @ w.T (N, K) (+ bias), each row's result the same whatever the other rows."""
    lead, K = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    x2 = pad_rows(x2, padded_rows(M, w.shape[0], K))
    out = x2 @ w.T if bias is None else mx.addmm(bias, x2, w.T)  # as nn.Linear: bias as C
    return out[:M].reshape(*lead, w.shape[0])


def _writable(a: mx.array) -> np.ndarray:
    """The evaluated buffer of an array this module just made and alone holds, to work on in
    place and hand back as the same MLX array: no copy, and no fresh pages to fault in (a new
    20 MB NumPy buffer a call cost more than the arithmetic, measured)."""
    view = np.asarray(a)
    if not view.flags.writeable or view.dtype != np.float32:
        raise RuntimeError("host kernels need writable float32 MLX buffers")
    return view


def _scratch(shape: tuple[int, ...]) -> np.ndarray:
    """A float32 work buffer of `shape`, reused by this thread (one per CPU lane)."""
    n = int(np.prod(shape))
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < n:
        buf = _local.buf = np.empty(n, np.float32)
    return buf[:n].reshape(shape)


def silu_mul(g: mx.array, u: mx.array) -> mx.array:
    """SiLU(g) * u, as the MLX path writes it: g / (1 + exp(-g)) * u. `u` must be a fresh
    array (the up projection): the product is written into its buffer and `u` returned.
    Worked in row chunks that stay in the core's cache: five passes over a 40 MB array from
    memory cost more than the arithmetic (measured)."""
    mx.eval(g, u)
    n = g.shape[-1]
    a, b = np.asarray(g).reshape(-1, n), _writable(u).reshape(-1, n)
    step = max(1, CHUNK // n)
    for i in range(0, a.shape[0], step):
        x, y = a[i : i + step], b[i : i + step]
        t = _scratch(x.shape)
        np.negative(x, out=t)
        with np.errstate(over="ignore"):  # exp(-g) = inf for very negative g: SiLU -0, as MLX
            np.exp(t, out=t)
        np.add(t, 1, out=t)
        np.divide(x, t, out=t)
        np.multiply(t, y, out=y)
    return u


def _spread(a: mx.array, start: int, width: int) -> mx.array:
    """Keys or values (B, KV, S, d) laid out on the padded key axis (zeros in the padding)."""
    B, KV, S, d = a.shape
    old = -(-start // BLOCK) * BLOCK
    parts = [a[:, :, :start], mx.zeros((B, KV, old - start, d), a.dtype), a[:, :, start:]]
    parts.append(mx.zeros((B, KV, width - old - (S - start), d), a.dtype))
    return mx.concatenate(parts, axis=2)


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, host: Host) -> mx.array:
    """Grouped-query attention (B, H, L, hd) over keys/values (B, KV, S, hd), host softmax.

    Query head h reads KV head h // (H / KV), as `mx.fast.scaled_dot_product_attention` does.
    A query row with no visible key (never made by this package's layouts) gets zeros, not NaN.
    Each row's result is bit-identical whatever batch it is in (see the module docstring).
    """
    B, H, L, hd = q.shape
    KV, S = k.shape[1], k.shape[2]
    G, Sp = H // KV, host.mask.shape[-1]
    rows = G * L
    k = _spread(k, host.start, Sp)
    ones = mx.ones((B, KV, S, 1), v.dtype)  # the denominator, summed as the numerator is
    v = _spread(mx.concatenate([v, ones], axis=-1), host.start, Sp)  # (B, KV, S', hd + 1)
    M = max(padded_rows(rows, Sp, hd), padded_rows(rows, hd + 1, BLOCK))
    qs = pad_rows((q * scale).reshape(B, KV, rows, hd), M, axis=2)  # zero queries: scores 0
    scores = qs @ k.swapaxes(-1, -2)  # (B, KV, M, S')
    mx.eval(scores)
    s = _writable(scores)[:, :, :rows].reshape(B, KV, G, L, Sp)  # exp(scores) in place
    s += host.mask
    top = s.max(axis=-1, keepdims=True)
    top[~np.isfinite(top)] = 0  # fully masked rows: exp(-inf) = 0 below, then 0 / tiny = 0
    s -= top
    np.exp(s, out=s)
    acc = mx.zeros((B, KV, M, hd + 1), q.dtype)
    for a in range(0, Sp, BLOCK):  # one accumulator, block after block: a fixed order
        acc = mx.addmm(acc, scores[..., a : a + BLOCK], v[:, :, a : a + BLOCK])
    acc = acc[:, :, :rows]
    den = mx.maximum(acc[..., hd:], np.finfo(np.float32).tiny)
    return (acc[..., :hd] / den).reshape(B, H, L, hd)
