"""The row layout every host-kernel product keeps (zero rows, rounding, operands past
OpenBLAS's small-matrix bound), so a row's bits do not depend on its batch."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

SMALL = 100**3  # M*N*K at or below which OpenBLAS may use its small-matrix kernel
BLOCK = 64  # key slots summed by one product (under the general kernel's K blocking)
EDGE = 8  # zero rows before and after a product's rows (Haswell's first and last 8 differ)
TILE = 240  # real rows a product at most: with the edges 256, one of OpenBLAS's row blocks
ROUND = 16  # a product's row count is a multiple of this


def tile_rows(m: int, n: int, k: int) -> int:
    """Rows a product of `m` <= TILE real rows with an (n, k) operand runs with: EDGE zero
    rows either side, rounded, past the small-matrix kernel where that fits."""
    rows = -(-(m + 2 * EDGE) // ROUND) * ROUND
    want = min(SMALL // (n * k) + 1, TILE + 2 * EDGE)
    return max(rows, -(-want // ROUND) * ROUND)


def min_cols(rows: int, k: int) -> int:
    """Columns an operand of depth `k` needs so that a `rows`-row product passes SMALL."""
    return SMALL // (rows * k) + 1


def pad_rows(x: mx.array, rows: int, axis: int = 0, front: int = 0) -> mx.array:
    """`x` with `front` zero rows before and zero rows after, up to `rows`, along `axis`."""
    after = rows - front - x.shape[axis]
    if after < 0 and front:
        raise ValueError(f"{x.shape[axis]} rows and {front} in front exceed {rows}")
    if front == 0 and after <= 0:
        return x
    shape = list(x.shape)
    parts = []
    for count in (front, after):
        shape[axis] = count
        parts.append(mx.zeros(shape, x.dtype) if count > 0 else None)
    return mx.concatenate([p for p in (parts[0], x, parts[1]) if p is not None], axis=axis)


def plain_rows(m: int, *sizes: int) -> int:
    """Rows a plain product of `m` real rows runs with: at least ROUND (OpenBLAS sends a one-row
    product to GEMV on some CPUs, another summation order) and past the small-matrix bound."""
    return max(m, ROUND, *(SMALL // size + 1 for size in sizes))


def writable(a: mx.array) -> np.ndarray:
    """The evaluated buffer of an array this module alone holds, to work on in place."""
    view = np.asarray(a)
    if not view.flags.writeable or view.dtype != np.float32:
        raise RuntimeError("host kernels need writable float32 MLX buffers")
    return view
