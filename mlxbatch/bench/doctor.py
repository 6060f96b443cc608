"""`mlxbatch doctor`: what this machine runs MLX on, and how fast its matmuls are."""

from __future__ import annotations

import os
import platform
import time

from ..runtime import blas, sgemm


def matmul_gflops(n: int, dtype, reps: int = 3) -> float:
    """Measured rate of an n x n x n matmul in `dtype` (best of `reps`)."""
    import mlx.core as mx

    a = mx.random.normal((n, n)).astype(dtype)
    b = mx.random.normal((n, n)).astype(dtype)
    mx.eval(a, b, a @ b)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(a @ b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def report(size: int = 1024) -> dict:
    import mlx.core as mx

    from ..model.load import default_dtype

    dtype = default_dtype()
    provider = sgemm.sgemm_provider()
    lib = provider["library"] or "unknown"
    fast = platform.system() != "Linux" or "openblas" in os.path.basename(lib)
    info = {
        "platform": f"{platform.system()} {platform.machine()}",
        "device": str(mx.default_device()),
        "device_name": mx.device_info().get("device_name", "?"),
        "mlx": mx.__version__,
        "dtype": str(dtype).split(".")[-1],
        "blas": lib,
        "blas_config": provider["config"],
        "blas_kernels": provider["corename"],
        "blas_threads": provider["threads"],
        "blas_activation": blas.ACTIVE.get("source", "none"),
        "blas_tried": blas.tried(),
        "fast_blas": fast,
        f"matmul_gflops_{str(dtype).split('.')[-1]}": round(matmul_gflops(size, dtype), 1),
    }
    from ..engine.calibration import cached_entries, describe
    from ..engine.planner import CostModel

    info["planner_calibrations"] = [
        f"{e.get('model_path', '?')} ({e.get('dtype', '?')}, {e.get('at', '?')}): "
        + describe(CostModel.from_dict(e["model"]))
        for e in cached_entries()
        if isinstance(e.get("model"), dict)
    ] or "none cached (mlxbatch doctor --calibrate --model DIR, or any bench run)"
    if mx.default_device() == mx.gpu:
        info["matmul_gflops_float32"] = round(matmul_gflops(size, mx.float32), 1)
    return info
