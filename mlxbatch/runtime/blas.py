"""Give MLX's Linux CPU backend an optimised BLAS (OpenBLAS) instead of the bundled netlib one.

The `mlx-cpu` wheel links `cblas_sgemm` from a bundled reference BLAS (a few GFLOP/s). Symbols
resolve through the global scope first, so an OpenBLAS loaded before `libmlx.so` (LD_PRELOAD on
a re-exec, or ctypes RTLD_GLOBAL in-process) takes over every fp32 matmul. This module must not
import mlx: it runs before it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.metadata
import os
import platform
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_MARK = "MLXBATCH_BLAS_ACTIVE"  # set in the re-exec'd child: never re-exec twice
_SAVED = "MLXBATCH_SAVED_"  # original LD_* values, restored for our own subprocesses
_OFF = "MLXBATCH_NO_FAST_BLAS"  # user escape hatch
# cmeel-openblas 0.3.31 is built for TARGET=SKYLAKEX only (no DYNAMIC_ARCH): AVX-512 required.
_SKYLAKEX_FLAGS = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


@dataclass(frozen=True)
class BlasPlan:
    library: str  # path of the OpenBLAS to load
    lib_dirs: tuple[str, ...]  # directories its dependencies are found in
    env: tuple[tuple[str, str], ...]  # extra environment (OPENBLAS_CORETYPE for Debian builds)
    source: str  # "cmeel-openblas" or "system"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _dist_path(dist: str, rel: str) -> Path | None:
    try:
        path = Path(str(importlib.metadata.distribution(dist).locate_file(rel)))
    except importlib.metadata.PackageNotFoundError:
        return None
    return path if path.exists() else None


def _gfortran_dir() -> str | None:
    """A directory holding a `libgfortran.so.5` that cmeel's OpenBLAS can load.

    The system's copy if present; else a symlink, in a cache directory, to the gfortran
    runtime that the mlx-cpu wheel already bundles under a hashed name.
    """
    if ctypes.util.find_library("gfortran"):
        return ""  # the loader finds it on its own
    libs = _dist_path("mlx-cpu", "mlx_cpu.libs")
    found = sorted(glob.glob(str(libs / "libgfortran*.so.5*"))) if libs else []
    if not found:
        return None
    for base in (Path.home() / ".cache" / "mlxbatch", Path(tempfile.gettempdir()) / "mlxbatch"):
        link_dir = base / "blas-libs"
        link = link_dir / "libgfortran.so.5"
        try:
            link_dir.mkdir(parents=True, exist_ok=True)
            if not link.exists() or os.path.realpath(link) != os.path.realpath(found[0]):
                tmp = link_dir / f".libgfortran.{os.getpid()}"
                tmp.unlink(missing_ok=True)
                tmp.symlink_to(found[0])
                os.replace(tmp, link)  # atomic: concurrent ranks never see a half-made link
            return str(link_dir)
        except OSError:
            continue
    return None


def plan() -> BlasPlan | None:
    """Which OpenBLAS to use on this machine, or None (not Linux, opted out, none usable)."""
    if platform.system() != "Linux" or os.environ.get(_OFF):
        return None
    flags = _cpu_flags()
    cmeel = _dist_path("cmeel-openblas", "cmeel.prefix/lib/libopenblas.so.0")
    if cmeel and _SKYLAKEX_FLAGS <= flags:
        gf_dir = _gfortran_dir()
        if gf_dir is not None:
            libs = _dist_path("mlx-cpu", "mlx_cpu.libs")
            dirs = tuple(d for d in (gf_dir, str(libs) if libs else "") if d)
            return BlasPlan(str(cmeel), dirs, (), "cmeel-openblas")
    system = ctypes.util.find_library("openblas")
    if system:
        env: tuple[tuple[str, str], ...] = ()
        if "OPENBLAS_CORETYPE" not in os.environ:
            # Debian's 0.3.21 misdetects recent CPUs (as Prescott): name the kernel family.
            core = "SkylakeX" if _SKYLAKEX_FLAGS <= flags else "Haswell" if "avx2" in flags else ""
            env = (("OPENBLAS_CORETYPE", core),) if core else ()
        return BlasPlan(system, (), env, "system")
    return None


def reexec_with_fast_blas() -> None:
    """Re-exec this process with OpenBLAS preloaded, once; a no-op where nothing applies."""
    if os.environ.get(_MARK) or "mlx.core" in sys.modules:
        return
    p = plan()
    if p is None:
        return
    env = dict(os.environ)
    for key in ("LD_PRELOAD", "LD_LIBRARY_PATH"):
        env[_SAVED + key] = os.environ.get(key, "")
    env["LD_PRELOAD"] = ":".join(x for x in (p.library, os.environ.get("LD_PRELOAD", "")) if x)
    env["LD_LIBRARY_PATH"] = ":".join(
        x for x in (*p.lib_dirs, os.environ.get("LD_LIBRARY_PATH", "")) if x
    )
    env.update(dict(p.env))
    env[_MARK] = p.source
    argv = [sys.executable, *sys.orig_argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


def restore_environment() -> None:
    """In the re-exec'd child: hand our own subprocesses the user's LD_* values back."""
    for key in ("LD_PRELOAD", "LD_LIBRARY_PATH"):
        saved = os.environ.pop(_SAVED + key, None)
        if saved is None:
            continue
        if saved:
            os.environ[key] = saved
        else:
            os.environ.pop(key, None)


def activate_in_process() -> bool:
    """Best effort for library users: load OpenBLAS globally before mlx is imported.

    Works when the loader can find `libgfortran.so.5` on its own (a system libgfortran5); else
    only the CLI's re-exec can supply it. Returns whether an OpenBLAS is now loaded.
    """
    if "mlx.core" in sys.modules or os.environ.get(_MARK):
        return bool(os.environ.get(_MARK))
    p = plan()
    if p is None:
        return False
    for key, value in p.env:
        os.environ.setdefault(key, value)
    try:
        ctypes.CDLL(p.library, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    os.environ[_MARK] = p.source + " (in-process)"
    return True


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
    """The OpenBLAS serving MLX's matmuls, as a ctypes library, or None."""
    if "lib" not in _OPENBLAS:
        path = sgemm_provider()["library"] if platform.system() == "Linux" else None
        _OPENBLAS["lib"] = ctypes.CDLL(path) if path and "openblas" in Path(path).name else None
    return _OPENBLAS["lib"]


@contextmanager
def single_threaded() -> Iterator[None]:
    """OpenBLAS on one thread inside the block (for code that runs one stream per core)."""
    lib = _serving_openblas()
    if lib is None:
        yield
        return
    before = lib.openblas_get_num_threads()
    lib.openblas_set_num_threads(1)
    try:
        yield
    finally:
        lib.openblas_set_num_threads(before)
