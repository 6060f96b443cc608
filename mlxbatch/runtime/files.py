"""Files written whole or not at all (the one atomic writer, for caches and outputs), appends
to a stream, and where the caches live."""

from __future__ import annotations

import io
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ..errors import OutputError


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/mlxbatch, default ~/.cache/mlxbatch (a relative one is ignored, as XDG says)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = str(Path.home() / ".cache")
    return Path(base) / "mlxbatch"


NAME_MAX, PATH_MAX = 255, 4096  # Linux's and macOS's (1024 there: checked by the OS itself)
CACHE_ROOM = 100  # what mlxbatch puts under the cache (blas-libs/<key>/.libopenblas.<pid>.map)


def cache_env_problem() -> str | None:
    """Why XDG_CACHE_HOME cannot hold mlxbatch's cache at all (a name or path too long), or None."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        return None  # ignored (cache_dir)
    raw = os.fsencode(base)
    longest = max(len(part) for part in raw.split(b"/"))
    if longest > NAME_MAX:
        why = f"one of its folder names is {longest} bytes long, more than the {NAME_MAX} a name may have"
    elif len(raw) + CACHE_ROOM > PATH_MAX:
        why = f"it is {len(raw)} bytes long, too long for the cache's files under it ({PATH_MAX - CACHE_ROOM} at most)"
    else:
        return None
    shown = base if len(base) <= 60 else base[:60] + "..."
    return (
        f"XDG_CACHE_HOME ({shown}) cannot hold mlxbatch's cache: {why}; set it to "
        "a shorter directory, or unset it (~/.cache)"
    )


def cache_problem() -> str | None:
    """Why mlxbatch's cache cannot be written (then every run redoes the probes), or None."""
    where = cache_dir()
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"the cache {where} cannot be made ({e.strerror or e})"
    if not os.access(where, os.W_OK | os.X_OK):
        return f"the cache {where} is not writable"
    return None


def oserror(path: Path, e: OSError, what: str = "cannot write") -> OutputError:
    return OutputError(f"{path}: {what} ({e.strerror or e})")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_straight(path: Path, text: str) -> None:
    """Append `text` to a device, FIFO or /dev/stdout (appending: a `>>` redirect is kept)."""
    try:
        with open(path, "a", encoding="utf-8", newline="") as f:
            f.write(text)
    except BrokenPipeError:  # its reader went away (`--json /dev/stdout | head`): exit 141
        raise
    except OSError as e:
        raise oserror(path, e) from None


def write_atomically(
    path: Path, write: Callable[[TextIO], None], failed: str = "cannot write"
) -> None:
    """`path` written whole or not at all (a temporary beside it, fsync'd, renamed over it); a
    link's target is written, an existing file keeps its mode."""
    path = Path(os.path.realpath(path))
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    try:
        # the name cut short: any name that fits the directory leaves room for the temporary's
        fd, tmp = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name[:200]}.", suffix=".mlxbatch-tmp"
        )
    except OSError as e:
        raise oserror(path.parent, e, "cannot create a temporary file") from None
    try:
        with open(fd, "w", encoding="utf-8", newline="") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:  # Ctrl-C included: no temporary file is left behind
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise oserror(path, e, failed) from None
        raise


CLOSED_STREAMS: set[int] = set()  # standard streams the caller closed (`>&-`): hold_closed_streams


def hold_closed_streams() -> None:
    """Open /dev/null on each standard stream the caller closed (`>&-`), so the next file opened
    does not become standard output; `ClosedStdout` refuses printing there."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            CLOSED_STREAMS.add(fd)
    for fd in sorted(CLOSED_STREAMS):
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    if 0 in CLOSED_STREAMS:
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    if 1 in CLOSED_STREAMS:
        sys.stdout = ClosedStdout()
    if 2 in CLOSED_STREAMS:
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115


class ClosedStdout(io.TextIOBase):
    """Standard output the caller closed: what a command prints there is refused in one line."""

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return 1

    def write(self, text: str) -> int:
        if not text:
            return 0
        raise OutputError(
            "standard output is closed (>&-): what this command prints would be "
            "lost; give -o FILE where it has one, or leave standard output open"
        )
