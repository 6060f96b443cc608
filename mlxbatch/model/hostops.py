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
width or the key count, under any of OpenBLAS's x86 kernel families tested (Haswell/Zen,
SandyBridge, Nehalem; SkylakeX by the probe where there is AVX-512). OpenBLAS's kernels sum in
orders that depend on where a row sits (measured, scripts/batch_invariance.py and
runtime/probe.py): with a row as a column of the B operand (`x @ w.T`), Haswell's gives
positions 0-5 and 6-11 of each 12-row group other bits; as a row of the A operand, the first
and last 8 rows of a product, and rows past its first row block (~256 rows), differ from the
rest; SkylakeX has a small-matrix kernel (M*N*K <= 100^3) and a "direct" one. So every
product here is `w @ x.T`, x's rows in tiles of at most TILE rows between EDGE zero rows
(`matmul_t`), the row count a multiple of ROUND, and operands padded past the small-matrix
bound; then a row's bits depend only on the product's other dimensions, which the model
fixes. Attention runs one product per block of BLOCK keys (a fixed shape) with the query rows
tiled alike, into one accumulator (beta=1) block after block, with the softmax denominator as
an extra ones column of V, so it is summed in the same order as the numerator; masked keys
add exact zeros. That is the "tiled" layout. Where the BLAS probe finds the "plain" one
invariant too (SkylakeX's and SandyBridge's kernels), it runs instead: `x @ w.T` in one
product, its rows padded past the small-matrix bound and to at least ROUND, and attention's
query rows as one block; under SkylakeX on one thread its matmuls took 0.58 s of CPU where
the tiled ones took 0.94 (1.61x; 1,201 rows through the 0.5B model's q/k/v, gate/up and down
shapes on a Zen 5). The layout follows the BLAS this process loaded, decided once with it
(`LAYOUT`, and `matmul_t` / `attention` bound from `KERNELS`); each (family, layout) is
checked at the BLAS probe (model/invariance.py), and one that fails is not used.
mx.fast.scaled_dot_product_attention (the GPU path) gives no such guarantee.
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

__all__ = ["BLOCK", "CHUNK", "EDGE", "KERNELS", "LAYOUT", "ROUND", "SMALL", "TILE", "Host",
           "attention", "available", "key_slots", "matmul_t", "padded_keys", "prepare",
           "silu_mul"]  # fmt: skip

_local = threading.local()


def _loaded_layout() -> str:
    from ..runtime import blas

    layout = blas.ACTIVE.get("layout")
    return layout if layout in LAYOUTS else TILED


LAYOUT = _loaded_layout()  # the BLAS is chosen before mlx (and this module) is imported
CHUNK = 1 << 18  # elements a host kernel works on at a time (1 MB of float32)


def available(dtype: mx.Dtype) -> bool:
    """Whether host elementwise kernels apply: the CPU device and float32 weights, unless
    `MLXBATCH_HOST_KERNELS=0` (to measure or rule them out)."""
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
    """x (..., K) @ w.T (N, K) (+ bias) computed as w @ x.T, so x's rows are OpenBLAS's A rows,
    TILE at a time between EDGE zero rows (see the module docstring); w gets zero rows where
    the product would be small (the tiled layout)."""
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
    """SiLU(g) * u, as the MLX path writes it: g / (1 + exp(-g)) * u. `u` must be a fresh
    array (the up projection): the product is written into its buffer and `u` returned.
    Worked in row chunks that stay in the core's cache: five passes over a 40 MB array from
    memory cost more than the arithmetic (measured)."""
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


# each layout's (matmul_t, attention); a row's result is bit-identical whatever batch it is in
# under the kernel families the probe found the layout invariant for (see the module docstring)
KERNELS = {"plain": (_plain_matmul_t, plain_attention),
           "tiled": (_tiled_matmul_t, tiled_attention)}  # fmt: skip
matmul_t, attention = KERNELS[LAYOUT]  # bound once, with the BLAS this process loaded
