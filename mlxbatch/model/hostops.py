"""The forward's elementwise work (SiLU, softmax) and its matmuls on the host, for MLX's CPU
device in float32, laid out so that a row's bits never depend on its batch.

MLX's CPU `exp` runs on one thread, so each SiLU and softmax goes to NumPy on the evaluated
buffer. OpenBLAS sums in orders that depend on where a row sits in a product, so every product
uses a layout the BLAS probe found batch-invariant: "tiled" or the faster "plain" one
(docs/how-it-works.md, "Batch invariance on the CPU").
"""

from __future__ import annotations

import threading

import mlx.core as mx
import numpy as np

from ..runtime import flags
from ..runtime.probe import LAYOUTS, TILED
from .host_attention import Host, key_slots, padded_keys, plain_attention, prepare, tiled_attention
from .host_layout import (
    BLOCK,
    EDGE,
    ROUND,
    SMALL,
    TILE,
    min_cols,
    pad_rows,
    plain_rows,
    tile_rows,
    writable,
)

__all__ = [
    "BLOCK",
    "CHUNK",
    "EDGE",
    "KERNELS",
    "LAYOUT",
    "ROUND",
    "SMALL",
    "TILE",
    "Host",
    "attention",
    "available",
    "key_slots",
    "matmul_t",
    "padded_keys",
    "prepare",
    "silu_mul",
]

_local = threading.local()


def _loaded_layout() -> str:
    from ..runtime import blas

    layout = blas.ACTIVE.get("layout")
    return layout if layout in LAYOUTS else TILED


LAYOUT = _loaded_layout()  # the BLAS is chosen before mlx (and this module) is imported
CHUNK = 1 << 18  # elements a host kernel works on at a time (1 MB of float32)


def available(dtype: mx.Dtype) -> bool:
    """Whether host kernels apply: CPU, float32, and not `MLXBATCH_HOST_KERNELS=0`."""
    if not flags.flag(flags.HOST_KERNELS):
        return False
    return mx.default_device() == mx.cpu and dtype == mx.float32


def _plain_matmul_t(x: mx.array, w: mx.array, bias: mx.array | None = None) -> mx.array:
    """x (..., K) @ w.T (N, K) (+ bias) as one product, x's rows padded (the plain layout)."""
    lead, K = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    x2 = pad_rows(x2, plain_rows(M, w.shape[0] * K))
    out = x2 @ w.T if bias is None else mx.addmm(bias, x2, w.T)  # as nn.Linear: bias as C
    return out[:M].reshape(*lead, w.shape[0])


def _tiled_matmul_t(x: mx.array, w: mx.array, bias: mx.array | None = None) -> mx.array:
    """x (..., K) @ w.T (N, K) (+ bias) as w @ x.T, x's rows TILE at a time between EDGE zero
    rows, w padded past the small-matrix kernels (the tiled layout)."""
    lead, K = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, K)
    M, N = x2.shape[0], w.shape[0]
    outs = []
    for a in range(0, max(M, 1), TILE):
        part = x2[a : a + TILE]
        m = part.shape[0]
        rows = tile_rows(m, N, K)
        wp = pad_rows(w, max(N, min_cols(rows, K)))
        xp = pad_rows(part, rows, front=EDGE)
        if bias is None:
            y = wp @ xp.T  # (N', rows)
        else:  # as nn.Linear: the bias as C, each row's start
            y = mx.addmm(pad_rows(bias, wp.shape[0])[:, None], wp, xp.T)
        outs.append(y[:N, EDGE : EDGE + m].T)
    out = outs[0] if len(outs) == 1 else mx.concatenate(outs)
    return out.reshape(*lead, N)


def _scratch(shape: tuple[int, ...]) -> np.ndarray:
    """A float32 work buffer of `shape`, reused by this thread (one per CPU lane)."""
    n = int(np.prod(shape))
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < n:
        buf = _local.buf = np.empty(n, np.float32)
    return buf[:n].reshape(shape)


def silu_mul(g: mx.array, u: mx.array) -> mx.array:
    """SiLU(g) * u, as the MLX path writes it: g / (1 + exp(-g)) * u, written into `u`'s
    buffer (a fresh array: the up projection) in row chunks that stay in the core's cache."""
    mx.eval(g, u)
    n = g.shape[-1]
    a, b = np.asarray(g).reshape(-1, n), writable(u).reshape(-1, n)
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


# each layout's (matmul_t, attention), bit-identical per row where the probe passed it
KERNELS = {"plain": (_plain_matmul_t, plain_attention), "tiled": (_tiled_matmul_t, tiled_attention)}
matmul_t, attention = KERNELS[LAYOUT]  # bound once, with the BLAS this process loaded
