"""Where an output may go, checked before anything is read or written: never the input (or a
link to it, or the file behind standard input), never over a directory or a device file by
rename; `-` is standard output, character devices and FIFOs are written straight."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import OutputError
from .sinks import OrderedStream, journal_path, oserror


def output_kind(output: Path) -> str:
    """ "stdout" for `-`, "stream" for character devices and FIFOs, else "file"."""
    if str(output) == "-":
        return "stdout"
    real = os.path.realpath(output)
    if real.startswith(("/dev/", "/proc/")) and os.path.exists(real):
        return "stream"  # /dev/stdout and friends: never a journal or a rename there
    try:
        mode = os.stat(output).st_mode
    except FileNotFoundError:
        return "file"
    except OSError as e:
        raise oserror(output, e, "cannot be used as output") from None
    if stat.S_ISDIR(mode):
        raise OutputError(f"{output}: is a directory; -o takes a file path")
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return "stream"
    if not stat.S_ISREG(mode):
        raise OutputError(f"{output}: not a regular file, a character device or a FIFO")
    return "file"


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(output: Path, inputs: list[Path], resume: bool) -> str:
    """Refuse, before anything is read or written, an output that could destroy data."""
    kind = output_kind(output)
    for path in inputs:
        for candidate, role in ((output, "-o"), (journal_path(output), "the journal of -o")):
            if _same_file(candidate, path):
                raise OutputError(
                    f"{role} ({candidate}) is the input file {path}; choose another -o"
                )
    if kind != "file":
        if resume:
            raise OutputError(f"--resume needs a regular output file, not {output}")
        return kind
    parent = output.parent if str(output.parent) else Path(".")
    if not parent.exists():
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise oserror(parent, e, "cannot create the output directory") from None
    if not parent.is_dir():
        raise OutputError(f"{output}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{output}: the directory {parent} is not writable")
    if output.exists() and not os.access(output, os.W_OK):
        raise OutputError(f"{output}: exists and is not writable")
    return kind


def open_stream(output: Path, n_rows: int, labels: tuple[str, ...], header: dict) -> OrderedStream:
    """Standard output, or a character device / FIFO opened for writing (always JSONL)."""
    if str(output) == "-":
        return OrderedStream(n_rows, labels, header)
    try:
        stream = open(output, "w", encoding="utf-8", newline="")  # noqa: SIM115
    except OSError as e:
        raise oserror(output, e) from None
    return OrderedStream(n_rows, labels, header, stream)
