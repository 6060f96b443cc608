"""Size caps on what mlxbatch reads, far above any real use, so an endless or runaway file
ends in one line and exit 2 instead of a MemoryError."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError

ROW_BYTES = 32 << 20  # one input line or CSV/TSV record
PROMPT_FILE_BYTES = 1 << 20  # --system-prompt-file
LABELS_FILE_BYTES = 1 << 20  # --labels-file
EXAMPLES_BYTES, EXAMPLES_ROWS = 4 << 20, 1000  # --examples: their texts together, their rows
API_KEY_BYTES = 64 << 10  # --api-key-file


def size(n: int) -> str:
    """A cap in words: '32 MiB', '64 KiB'."""
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def read_capped(path: str | Path, cap: int, what: str) -> bytes:
    """The bytes of `path`; a file over `cap` is refused naming `what` (OSError is the caller's)."""
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise InputError(
            f"{what} {path}: larger than {size(cap)}, the cap on this file (is it the right file?)"
        )
    return data
