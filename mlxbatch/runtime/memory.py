"""How much memory this process can use now."""

from __future__ import annotations

import os
import platform
import subprocess


def total_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


LIMIT_ENV = "MLXBATCH_MEMORY_LIMIT"  # a cap in bytes (or with a K/M/G suffix), e.g. 8G


def _limit() -> int | None:
    raw = os.environ.get(LIMIT_ENV, "").strip().upper()
    if not raw:
        return None
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(raw[-1], 1)
    try:
        value = int(float(raw.rstrip("KMG")) * scale)  # inf: OverflowError, nan: ValueError
    except (ValueError, OverflowError):
        value = 0
    if value < 1:
        from ..errors import UsageError

        raise UsageError(f"{LIMIT_ENV}={raw!r} is not a positive size such as 8G or 512M")
    return value


def available_bytes() -> int:
    """MemAvailable on Linux, unified memory on a Mac, capped by MLXBATCH_MEMORY_LIMIT."""
    found = _available()
    limit = _limit()
    return min(found, limit) if limit is not None else found


def available_source() -> str:
    """What sets `available_bytes()`, as a message names it: the cap where it is the smaller."""
    limit = _limit()
    if limit is not None and limit <= _available():
        return f"{LIMIT_ENV}={os.environ[LIMIT_ENV].strip()}"
    return "the free memory"


def amount(n: int | float) -> str:
    """Bytes in words at a scale that shows them: '22.9 GiB', '37.4 MiB', '1.0 KiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def _available() -> int:
    if platform.system() == "Linux":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
    if platform.system() == "Darwin":
        try:
            import mlx.core as mx

            info = mx.device_info()
            if "max_recommended_working_set_size" in info:
                return int(info["max_recommended_working_set_size"])
        except Exception:  # no Metal device: fall back to physical memory
            pass
        out = subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True)
        if out.returncode == 0:
            return int(out.stdout.strip())
    return total_bytes()


def keep_freed_buffers(nbytes: int, ceiling: int | None = None) -> None:
    """Let MLX keep up to `nbytes` of freed buffers for reuse (never lowered but to `ceiling`):
    with its small CPU default each large intermediate's pages fault in again."""
    import mlx.core as mx

    previous = mx.set_cache_limit(nbytes)
    if previous > nbytes:
        mx.set_cache_limit(previous if ceiling is None else min(previous, max(nbytes, ceiling)))


def return_freed_memory() -> None:
    """Give freed memory back to the system (glibc's malloc_trim): the resident size stays flat."""
    if platform.system() != "Linux":
        return
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
