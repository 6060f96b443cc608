"""The forward's transcendental elementwise work on the host, for MLX's CPU device.

On the CPU, MLX evaluates `exp` one element at a time on one thread (measured here: 9.0 ns an
element, against 0.34 ns for NumPy's vectorised float32 `exp`), so SiLU and the attention
softmax cost more than the matmuls around them. With `host=True` the forward evaluates the
matmul that feeds each of them, runs the elementwise part in NumPy on the evaluated buffer,
and hands the result back to MLX: two synchronisation points a layer (the forward adds a
third, each layer's output: see qwen2.py), each a few hundred microseconds against tens of
milliseconds saved. Only for float32 on the CPU (NumPy has no
bfloat16, and on a GPU the MLX kernels are the fast ones).

The functions are the same mathematics as the MLX path, `g / (1 + exp(-g)) * u` and a
max-subtracted softmax, in float32; results differ from MLX's only in the last bits of
`exp`, so the gold loop (always pure MLX) stays an independent check of this path.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

_local = threading.local()
CHUNK = 1 << 18  # elements a host kernel works on at a time (1 MB of float32)


@dataclass(frozen=True)
class Host:
    """A forward's host-kernel state: the attention mask in additive form, made once."""

    mask: np.ndarray | None  # float32 (B, 1, 1, L, S): 0 where seen, -inf elsewhere; None: all


def available(dtype: mx.Dtype) -> bool:
    """Whether host elementwise kernels apply: the CPU device and float32 weights, unless
    `MLXBATCH_HOST_KERNELS=0` (to measure or rule them out)."""
    if os.environ.get("MLXBATCH_HOST_KERNELS", "1") == "0":
        return False
    return mx.default_device() == mx.cpu and dtype == mx.float32


def prepare(mask: mx.array | str | None, q_len: int, k_len: int) -> Host:
    """Host state for a forward of `q_len` queries over `k_len` keys under `mask`
    (bool (B, 1, L, S), "causal" or None)."""
    if mask is None:
        return Host(None)
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown mask {mask!r}")
        seen = np.arange(k_len)[None, :] <= (k_len - q_len + np.arange(q_len))[:, None]
        seen = seen[None, None]
    else:
        seen = np.asarray(mask)  # (B, 1, L, S) bool
    add = np.where(seen, np.float32(0), np.float32(-np.inf))
    return Host(add[:, :, None])  # broadcast over the query heads sharing a KV head


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


def attention(
    q: mx.array, k: mx.array, v: mx.array, scale: float, mask: np.ndarray | None
) -> mx.array:
    """Grouped-query attention (B, H, L, hd) over keys/values (B, KV, S, hd), host softmax.

    Query head h reads KV head h // (H / KV), as `mx.fast.scaled_dot_product_attention` does.
    A query row with no visible key (never made by this package's layouts) gets zeros, not NaN.
    """
    B, H, L, hd = q.shape
    KV, S = k.shape[1], k.shape[2]
    G = H // KV
    scores = (q * scale).reshape(B, KV, G * L, hd) @ k.swapaxes(-1, -2)  # (B, KV, G*L, S)
    mx.eval(scores)
    s = _writable(scores).reshape(B, KV, G, L, S)  # the probabilities replace the scores
    if mask is not None:
        s += mask
    top = s.max(axis=-1, keepdims=True)
    top[~np.isfinite(top)] = 0  # fully masked rows: exp(-inf) = 0 below, then 0 / tiny = 0
    s -= top
    np.exp(s, out=s)
    total = s.sum(axis=-1, keepdims=True)
    np.maximum(total, np.finfo(np.float32).tiny, out=total)
    s /= total
    return (scores @ v).reshape(B, H, L, hd)
