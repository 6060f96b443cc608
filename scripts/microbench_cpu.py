"""The CPU measurements behind the host kernels and the kept buffers (docs/benchmarks.md, "Where a batch's time goes").

    python scripts/microbench_cpu.py

One thread (OpenBLAS single-threaded, as each CPU lane runs), Qwen2.5-0.5B shapes, 1,536 rows
(one lane of a 32 x 96 batch); best of five. Prints: MLX's and NumPy's `exp` per element;
SiLU x up on MLX's kernels, compiled, and as the host kernel; attention with MLX's softmax
and with the host softmax; the projections separate and fused; an addition on large arrays
with MLX's default 32 MB buffer cache and with the freed buffers kept.
"""

from __future__ import annotations

import time

from mlxbatch.runtime import blas, sgemm

blas.activate_in_process()

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlxbatch.model import hostops  # noqa: E402


def best(f, n: int = 5) -> float:
    f()
    out = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        f()
        out = min(out, time.perf_counter() - t)
    return out * 1e3


def main() -> None:
    R, D, N, H, KV, hd, P = 1536, 896, 4864, 14, 2, 64, 43
    B, L = 16, 96
    key = iter(mx.random.split(mx.random.key(0), 32))

    def rnd(*shape):
        return mx.random.normal(shape, key=next(key))

    g, u, x = rnd(R, N), rnd(R, N), rnd(R, D)
    wq, wk, wv, wg, wu, wd = (
        rnd(H * hd, D),
        rnd(KV * hd, D),
        rnd(KV * hd, D),
        rnd(N, D),
        rnd(N, D),
        rnd(D, N),
    )
    wqkv, wgu = mx.concatenate([wq, wk, wv]), mx.concatenate([wg, wu])
    q, k, v = rnd(B, H, L, hd), rnd(B, KV, P + L, hd), rnd(B, KV, P + L, hd)
    mask = mx.array(np.tril(np.ones((L, P + L), bool), P))[None, None]
    mask = mx.broadcast_to(mask, (B, 1, L, P + L))
    mx.eval(g, u, x, wq, wk, wv, wg, wu, wd, wqkv, wgu, q, k, v, mask)
    gn = np.array(g)
    print(
        f"one thread, {R} rows (MLX {mx.__version__}, BLAS {blas.ACTIVE.get('source', 'reference')})"
    )
    with sgemm.single_threaded():
        n = g.size
        print(
            f"exp per element: MLX {best(lambda: mx.eval(mx.exp(g))) / n * 1e6:.2f} ns, "
            f"NumPy {best(lambda: np.exp(gn)) / n * 1e6:.2f} ns"
        )
        silu = mx.compile(lambda a, b: a / (1 + mx.exp(-a)) * b)
        print(
            f"SiLU x up: MLX {best(lambda: mx.eval(g / (1 + mx.exp(-g)) * u)):.1f} ms, "
            f"mx.compile {best(lambda: mx.eval(silu(g, u))):.1f} ms, host kernel "
            f"{best(lambda: mx.eval(hostops.silu_mul(g, u + 0))) - best(lambda: mx.eval(u + 0)):.1f} ms"
        )
        host = hostops.prepare(mask, L, P + L)
        sdpa = best(
            lambda: mx.eval(mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask))
        )
        mine = best(lambda: mx.eval(hostops.attention(q, k, v, 0.125, host.mask)))
        print(
            f"attention ({B} x {L} behind {P}): MLX sdpa {sdpa:.1f} ms, host softmax {mine:.1f} ms"
        )
        sep = best(lambda: mx.eval(x @ wq.T, x @ wk.T, x @ wv.T))
        print(
            f"q, k, v projections: separate {sep:.1f} ms, fused {best(lambda: mx.eval(x @ wqkv.T)):.1f} ms"
        )
        sep = best(lambda: mx.eval(x @ wg.T, x @ wu.T))
        print(
            f"gate, up: separate {sep:.1f} ms, fused {best(lambda: mx.eval(x @ wgu.T)):.1f} ms; "
            f"down {best(lambda: mx.eval(g @ wd.T)):.1f} ms"
        )
    big = rnd(2048, N)
    mx.eval(big)
    before = mx.set_cache_limit(32 << 20)
    fresh = best(lambda: mx.eval(big + 0))
    mx.set_cache_limit(1 << 30)
    kept = best(lambda: mx.eval(big + 0))
    mx.set_cache_limit(before)
    print(
        f"a + 0 on 2,048 x {N} (40 MB): {fresh:.1f} ms with a 32 MB buffer cache (MLX's CPU "
        f"default), {kept:.1f} ms with freed buffers kept"
    )


if __name__ == "__main__":
    main()
