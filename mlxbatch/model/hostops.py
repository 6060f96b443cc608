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

import os
import threading
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from ..runtime.probe import LAYOUTS, TILED

_local = threading.local()


def _loaded_layout() -> str:
    from ..runtime import blas

    layout = blas.ACTIVE.get("layout")
    return layout if layout in LAYOUTS else TILED


LAYOUT = _loaded_layout()  # the BLAS is chosen before mlx (and this module) is imported
CHUNK = 1 << 18  # elements a host kernel works on at a time (1 MB of float32)
SMALL = 100**3  # M*N*K at or below which OpenBLAS may use its small-matrix kernel
BLOCK = 64  # key slots summed by one product (under the general kernel's K blocking)
EDGE = 8  # zero rows before and after a product's rows (Haswell's first and last 8 differ)
TILE = 240  # real rows a product at most: with the edges 256, one of OpenBLAS's row blocks
ROUND = 16  # a product's row count is a multiple of this


@dataclass(frozen=True)
class Host:
    """A forward's host-kernel state: the attention mask in additive form, made once."""

    mask: np.ndarray  # float32 (B, 1, 1, L, S'): 0 where seen, -inf elsewhere (padded keys)
    start: int  # keys before this forward's own tokens: [0, start) and [start, S) are blocked apart
    keys: int  # S: real key slots
    _tiled: dict = field(default_factory=dict, compare=False, repr=False)

    def tiled(self, group: int, tile: int) -> np.ndarray:
        """The mask laid out as `attention` lays out the scores: the query rows of `group`
        heads (head-major) in tiles of `tile` rows, the keys in blocks, (B, 1, T, S'/BLOCK,
        tile, BLOCK); rows past the last query 0 (their outputs are dropped). Made once per
        forward (every layer reads it)."""
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


def tile_rows(m: int, n: int, k: int) -> int:
    """Rows (a multiple of ROUND, at most TILE + 2 * EDGE) a product of `m` <= TILE real rows
    with an (n, k) operand is run with: EDGE zero rows either side, and enough to stay off
    OpenBLAS's small-matrix kernel where that fits (`min_cols` covers the rest)."""
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


def _plain_rows(m: int, *sizes: int) -> int:
    """Rows a plain product of `m` real rows runs with: at least ROUND (OpenBLAS 0.3.28+ sends
    a one-row product to GEMV on ARM64, RISC-V and POWER, OpenMathLib/OpenBLAS#4814, which
    sums in another order) and past the small-matrix bound for each (n * k) in `sizes`."""
    return max(m, ROUND, *(SMALL // size + 1 for size in sizes))


def _plain_matmul_t(x: mx.array, w: mx.array, bias: mx.array | None = None) -> mx.array:
    """x (..., K) @ w.T (N, K) (+ bias) as one product, x's rows padded (the plain layout)."""
    lead, K = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    x2 = pad_rows(x2, _plain_rows(M, w.shape[0] * K))
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


def _softmax_numerator(s: np.ndarray, axis) -> None:
    """exp(s - max) in place over `axis` (the keys); a fully masked row's exp(-inf) = 0."""
    top = s.max(axis=axis, keepdims=True)
    top[~np.isfinite(top)] = 0  # fully masked rows: exp(-inf) = 0 below, then 0 / tiny = 0
    s -= top
    np.exp(s, out=s)


def _plain_attention(q, k, v, scale: float, host: Host) -> mx.array:
    """Grouped-query attention (B, H, L, hd) over keys/values (B, KV, S, hd), host softmax: the
    query rows of a KV head as one product's rows, padded (the plain layout); the same
    block-by-block accumulation as the tiled layout.

    Query head h reads KV head h // (H / KV), as `mx.fast.scaled_dot_product_attention` does.
    A query row with no visible key (never made by this package's layouts) gets zeros, not NaN.
    """
    B, H, L, hd = q.shape
    KV, S = k.shape[1], k.shape[2]
    G, Sp = H // KV, host.mask.shape[-1]
    rows = G * L
    k = _spread(k, host.start, Sp)
    ones = mx.ones((B, KV, S, 1), v.dtype)  # the denominator, summed as the numerator is
    v = _spread(mx.concatenate([v, ones], axis=-1), host.start, Sp)  # (B, KV, S', hd + 1)
    M = _plain_rows(rows, Sp * hd, (hd + 1) * BLOCK)
    qs = pad_rows((q * scale).reshape(B, KV, rows, hd), M, axis=2)  # zero queries: scores 0
    scores = qs @ k.swapaxes(-1, -2)  # (B, KV, M, S')
    mx.eval(scores)
    s = _writable(scores)[:, :, :rows].reshape(B, KV, G, L, Sp)  # exp(scores) in place
    s += host.mask
    _softmax_numerator(s, -1)
    acc = mx.zeros((B, KV, M, hd + 1), q.dtype)
    for a in range(0, Sp, BLOCK):  # one accumulator, block after block: a fixed order
        acc = mx.addmm(acc, scores[..., a : a + BLOCK], v[:, :, a : a + BLOCK])
    acc = acc[:, :, :rows]
    den = mx.maximum(acc[..., hd:], np.finfo(np.float32).tiny)
    return (acc[..., :hd] / den).reshape(B, H, L, hd)


def _tiled_attention(q, k, v, scale: float, host: Host) -> mx.array:
    """`_plain_attention`'s result with the query rows as OpenBLAS's A rows, in tiles between
    zero rows, and every product one block of BLOCK keys, so its shape is the same whatever
    the key count (the tiled layout)."""
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
    s = _writable(scores)[:, :, :, :, EDGE : EDGE + span]  # a view: exp(scores) in place
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


# each layout's (matmul_t, attention); a row's result is bit-identical whatever batch it is in
# under the kernel families the probe found the layout invariant for (see the module docstring)
KERNELS = {"plain": (_plain_matmul_t, _plain_attention),
           "tiled": (_tiled_matmul_t, _tiled_attention)}  # fmt: skip
matmul_t, attention = KERNELS[LAYOUT]  # bound once, with the BLAS this process loaded
