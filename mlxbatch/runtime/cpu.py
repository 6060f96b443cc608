"""What this CPU is and runs: its flags and model name, and the OpenBLAS kernel families
(`OPENBLAS_CORETYPE`) it can execute, for the BLAS's choice and to check the user's own."""

from __future__ import annotations

import os
import platform
from pathlib import Path

CORETYPE = "OPENBLAS_CORETYPE"
AVX512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}  # OpenBLAS's SkylakeX needs

# what each kernel family a user may name in OPENBLAS_CORETYPE executes (x86_64)
FAMILY_NEEDS = {
    "skylakex": AVX512,
    "cooperlake": AVX512 | {"avx512_bf16"},
    "sapphirerapids": AVX512 | {"avx512_bf16"},
    "haswell": {"avx2", "fma"},
    "zen": {"avx2", "fma"},
    "sandybridge": {"avx"},
}

# pre-AVX families OPENBLAS_CORETYPE can name
OLD_X86 = (
    "katmai",
    "coppermine",
    "northwood",
    "prescott",
    "banias",
    "core2",
    "penryn",
    "dunnington",
    "nehalem",
    "atom",
)


def flags() -> set[str]:
    """The CPU's feature flags (x86's `flags`, aarch64's `Features`); empty where unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):  # x86 / aarch64
            return set(line.split(":", 1)[1].split())
    return set()


def model_name() -> str:
    """The CPU's model name (for the caches' keys and `doctor`), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "?"


def families() -> list[str]:
    """OpenBLAS kernel families this CPU can run, fastest kind first."""
    have = flags()
    if platform.machine() in ("aarch64", "arm64"):
        return ["ARMV8"]
    out = []
    if AVX512 <= have:
        out.append("SkylakeX")
    if {"avx2", "fma"} <= have:
        out.append("Haswell")
    if "avx" in have:
        out.append("SandyBridge")
    return out + ["Nehalem"]


def unrunnable_coretype() -> str | None:
    """Why the user's OPENBLAS_CORETYPE cannot run here (OpenBLAS would die of SIGILL), or None."""
    family = os.environ.get(CORETYPE, "")
    needs = FAMILY_NEEDS.get(family.lower())
    if not needs or platform.machine() not in ("x86_64", "AMD64"):
        return None
    have = flags()
    missing = needs - have
    if not have or not missing:  # unknown flags (no /proc/cpuinfo): OpenBLAS is trusted
        return None
    runs = ", ".join(f for f in families() if f != "Nehalem") or "none but Nehalem"
    return (
        f"{CORETYPE}={family} names OpenBLAS kernels for instructions this CPU lacks "
        f"({', '.join(sorted(missing))}): OpenBLAS would die of SIGILL; unset it, or name "
        f"a family this CPU runs ({runs})"
    )


def slow_coretype() -> str | None:
    """A note when the user's OPENBLAS_CORETYPE picks slower pre-AVX kernels, else None."""
    family = os.environ.get(CORETYPE, "")
    fast = [f for f in families() if f != "Nehalem"]
    if family.lower() not in OLD_X86 or not fast or platform.machine() != "x86_64":
        return None
    return (
        f"note: {CORETYPE}={family} picks OpenBLAS kernels older than this CPU runs (its "
        f"fastest: {fast[0]}): fp32 products run several times slower; unset it"
    )
