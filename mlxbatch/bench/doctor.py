"""`mlxbatch doctor`: what this machine runs MLX on, and how fast its matmuls are."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from ..runtime import blas, sgemm
from ..runtime.files import cache_dir


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


def numpy_gflops(n: int, reps: int = 3) -> float:
    """The same product in NumPy (its own OpenBLAS), for the ratio taken in one run."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def report(size: int = 1024, config: dict | None = None) -> dict:
    """`config`: a model's config.json, whose dtype the `dtype` line then gives."""
    import mlx.core as mx

    from ..model import hostops
    from ..model.dtypes import CPU_DEFAULT, on_gpu, resolve_dtype

    cpu = not on_gpu()
    dtype, source = resolve_dtype(None, config or {}, not cpu)
    if config is None and not cpu:
        source = "each checkpoint's config.json dtype or torch_dtype (float16 where it names none)"
    provider = sgemm.sgemm_provider()
    lib = provider["library"] or "unknown"
    fast = platform.system() != "Linux" or "openblas" in os.path.basename(lib)
    if cpu:  # float32 here; interleaved with NumPy's, so a busy moment hits both alike
        rates = [(matmul_gflops(size, mx.float32), numpy_gflops(size)) for _ in range(2)]
        mine, numpy = max(r[0] for r in rates), max(r[1] for r in rates)
    else:
        mine = matmul_gflops(size, dtype)
    info = {
        "platform": f"{platform.system()} {platform.machine()}",
        "device": str(mx.default_device()),
        "device_name": mx.device_info().get("device_name", "?"),
        "mlx": mx.__version__,
        "dtype": str(dtype).split(".")[-1],
        "dtype_source": source
        if source != CPU_DEFAULT
        else f"{CPU_DEFAULT} (float16 and "
        "bfloat16 matmuls are far slower there; --dtype to choose)",
        "blas": lib,
        "blas_config": provider["config"],
        "blas_kernels": provider["corename"],
        "blas_threads": provider["threads"],
        "blas_activation": blas.ACTIVE.get("source", "none"),
        "host_layout": hostops.LAYOUT,  # the products' row layout, the fastest invariant one
        "blas_tried": blas.tried(),
        "fast_blas": fast,
        # on the CPU the rate the ratio below is of, measured beside NumPy's
        f"matmul_gflops_{str(dtype).split('.')[-1]}": round(mine, 1),
    }
    info["planner_calibrations"] = calibrations()
    if cpu:
        info["numpy_matmul_gflops_float32"] = round(numpy, 1)
        info["mlx_vs_numpy_matmul"] = round(mine / numpy, 2)
    else:
        info["matmul_gflops_float32"] = round(matmul_gflops(size, mx.float32), 1)
    return info


def calibrations() -> list[str] | str:
    """The planner's cached calibrations of models still on disk; the others counted in a line."""
    from ..engine.calibration import cached_entries

    entries = [e for e in cached_entries() if isinstance(e.get("model"), dict)]
    here = sorted(filter(_on_disk, entries), key=lambda e: (e["model_path"], str(e.get("at", ""))))
    lines = [
        f"{e['model_path']} ({e.get('dtype', '?')}, {e.get('at', '?')}): " + _described(e)
        for e in here
    ]
    if len(here) < len(entries):
        lines.append(
            f"{len(entries) - len(here)} more for models no longer on disk (all in "
            f"{cache_dir() / 'planner.json'})"
        )
    return lines or "none cached (mlxbatch doctor --calibrate --model DIR, or any bench run)"


def _on_disk(entry: dict) -> bool:
    path = entry.get("model_path")
    try:
        return isinstance(path, str) and Path(path).is_dir()
    except (OSError, ValueError):  # a path with a NUL byte: an edited cache
        return False


def _described(entry: dict) -> str:
    """A cached calibration in words; one edited by hand into nonsense says so."""
    from ..engine.calibration import describe
    from ..engine.planner import CostModel

    try:
        return describe(CostModel.from_dict(entry["model"]))
    except (TypeError, KeyError, ValueError):
        return "unreadable (edited?)"
