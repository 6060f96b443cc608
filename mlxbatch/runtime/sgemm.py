"""Which library serves MLX's fp32 matmuls (`cblas_sgemm`) in this process, and its threads."""

from __future__ import annotations

import ctypes
import platform
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def sgemm_provider() -> dict:
    """Which shared library the process's `cblas_sgemm` resolves to, and its OpenBLAS config."""
    info: dict = {"library": None, "config": None, "corename": None, "threads": None}
    if platform.system() != "Linux":
        info["library"] = "Accelerate/Metal (macOS)" if platform.system() == "Darwin" else None
        return info
    import mlx.core  # noqa: F401  (libmlx's own dependencies must be loaded to resolve)

    libdl = ctypes.CDLL(None)
    addr = ctypes.cast(getattr(libdl, "cblas_sgemm", None), ctypes.c_void_p).value
    if addr:
        dl = _DlInfo()
        libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        if libdl.dladdr(ctypes.c_void_p(addr), ctypes.byref(dl)):
            info["library"] = dl.dli_fname.decode()
    if info["library"] and "openblas" in Path(info["library"]).name:
        ob = ctypes.CDLL(info["library"])
        for name in ("config", "corename"):
            fn = getattr(ob, f"openblas_get_{name}")
            fn.restype = ctypes.c_char_p
            info[name] = fn().decode()
        info["threads"] = ob.openblas_get_num_threads()
    return info


_OPENBLAS: dict = {}


def _serving_openblas():
    if "lib" not in _OPENBLAS:
        path = sgemm_provider()["library"] if platform.system() == "Linux" else None
        _OPENBLAS["lib"] = ctypes.CDLL(path) if path and "openblas" in Path(path).name else None
    return _OPENBLAS["lib"]


_single = {"holders": 0, "before": 1}
_single_lock = threading.Lock()


@contextmanager
def single_threaded() -> Iterator[None]:
    """OpenBLAS on one thread inside the block; the setting is process-wide, so concurrent
    callers share it and the last one out restores what the first found."""
    lib = _serving_openblas()
    if lib is None:
        yield
        return
    with _single_lock:
        if _single["holders"] == 0:
            _single["before"] = lib.openblas_get_num_threads()
            lib.openblas_set_num_threads(1)
        _single["holders"] += 1
    try:
        yield
    finally:
        with _single_lock:
            _single["holders"] -= 1
            if _single["holders"] == 0:
                lib.openblas_set_num_threads(_single["before"])
