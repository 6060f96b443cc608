"""MLX's CPU quantized matmul against fp32 through the fast BLAS, at the Qwen2.5-0.5B MLP shape.

python scripts/quantized_matmul.py
"""

import time

import mlxbatch.runtime.blas as blas

blas.activate_in_process()
import mlx.core as mx  # noqa: E402


def rate(fn, flops, reps=3):
    mx.eval(fn())
    best = 1e9
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(fn())
        best = min(best, time.perf_counter() - t)
    return flops / best / 1e9


rows, d, inter = 512, 896, 4864  # a batch of 512 tokens through gate_proj
x = mx.random.normal((rows, d))
w = mx.random.normal((inter, d)) * 0.02
flops = 2 * rows * d * inter
print(
    f"fp32 matmul ({blas.ACTIVE.get('source', 'reference BLAS')}): "
    f"{rate(lambda: x @ w.T, flops):.1f} GFLOP/s"
)
for bits in (8, 4):
    wq, s, b = mx.quantize(w, group_size=64, bits=bits)

    def qmm(wq=wq, s=s, b=b, bits=bits):
        return mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=bits)

    print(f"{bits}-bit quantized_matmul (group 64): {rate(qmm, flops):.1f} GFLOP/s")
