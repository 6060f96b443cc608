"""Files written whole or not at all: the one atomic writer, for caches here and outputs above.

It lives in the bottom layer so that runtime modules (the BLAS cache) can use it; io/sinks.py
keeps its own copy until it re-exports this one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ..errors import OutputError


def oserror(path: Path, e: OSError, what: str = "cannot write") -> OutputError:
    return OutputError(f"{path}: {what} ({e.strerror or e})")


def write_atomically(
    path: Path, write: Callable[[TextIO], None], failed: str = "cannot write"
) -> None:
    """`path` written whole or not at all: a new temporary file beside it (mkstemp opens with
    O_EXCL: no existing file is ever touched), fsync'd, mode 0644, renamed over `path`."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".mlxbatch-tmp")
    except OSError as e:
        raise oserror(path.parent, e, "cannot create a temporary file") from None
    try:
        with open(fd, "w", encoding="utf-8", newline="") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as e:  # Ctrl-C included: no temporary file is left behind
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise oserror(path, e, failed) from None
        raise
