"""Streams and files: a path written straight (a character device, a FIFO, /dev/stdout) is
told apart from a file written whole, in the one place every output check and writer asks."""

from __future__ import annotations

import io
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ..runtime.files import write_atomically, write_straight


def is_stream(path: Path) -> bool:
    """A path written straight, never replaced: a character device or FIFO, or a link through
    /proc or /dev/fd (/dev/stdout into a redirect resolves to the redirect's file)."""
    hop = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on a chain of links
        if hop.startswith(("/proc/", "/dev/fd/")) or hop in ("/dev/stdout", "/dev/stderr"):
            return os.path.exists(hop)
        if not os.path.islink(hop):
            break
        hop = os.path.normpath(os.path.join(os.path.dirname(hop), os.readlink(hop)))
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def write_whole(path: Path, write: Callable[[TextIO], None], failed: str = "cannot write") -> None:
    """A user's output written whole or not at all, or straight where it is a stream."""
    if not is_stream(path):
        return write_atomically(path, write, failed)
    buf = io.StringIO()
    write(buf)
    if names_stdout(path):  # the stream itself: /dev/stdout cannot be opened on a socket (ENXIO)
        sys.stdout.write(buf.getvalue())
        sys.stdout.flush()
        return
    write_straight(path, buf.getvalue())


def report_stream(json_path: Path | None) -> TextIO:
    """Where a command's report for people goes: stdout, or stderr under `--json -`."""
    return sys.stderr if json_path is not None and names_stdout(json_path) else sys.stdout


def names_stdout(path: Path) -> bool:
    """Whether `path` is a name of this process's standard output (/dev/stdout, its fd 1)."""
    return os.path.abspath(path) in (
        "/dev/stdout",
        "/dev/fd/1",
        "/proc/self/fd/1",
        f"/proc/{os.getpid()}/fd/1",
    )
