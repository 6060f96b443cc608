"""An input as a stream of bytes, decompressed on the fly by its magic bytes (gzip, bzip2, xz,
zstd), never unpacked to disk or held whole; Parquet is recognised here."""

from __future__ import annotations

import bz2
import fcntl
import gzip
import importlib.util
import io
import lzma
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import InputError
from ..runtime.files import CLOSED_STREAMS

BUFFER = 1 << 16
COMPRESSIONS = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd"}
_BZIP2 = re.compile(rb"BZh[1-9]1AY&SY")


def compression_of(head: bytes) -> str | None:
    """The compression whose magic bytes `head` starts with, or None."""
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(b"\xfd7zXZ\x00"):
        return "xz"
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "zstd"
    if len(head) >= 4 and head[0] & 0xF0 == 0x50 and head[1:4] == b"\x2a\x4d\x18":
        return "zstd"  # a skippable frame first (pzstd writes one): 0x184D2A50-5F, little-endian
    if _BZIP2.match(head):
        return "bzip2"
    return None


class Rejoined(io.RawIOBase):
    """`head` (bytes already read) then the rest of `rest`: a peek that works on pipes."""

    def __init__(self, head: bytes, rest, owned: bool = True):
        self.head, self.rest, self.owned = memoryview(head), rest, owned

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.head:
            n = min(len(b), len(self.head))
            b[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        return self.rest.readinto(b)

    def close(self) -> None:
        if not self.closed and self.owned:  # standard input is left open
            self.rest.close()
        super().close()


def peek(stream: BinaryIO, size: int, owned: bool = True) -> tuple[bytes, BinaryIO]:
    """The first `size` bytes of `stream` (fewer at its end) and a stream that still starts there."""
    head = stream.read(size)
    return head, io.BufferedReader(Rejoined(head, stream, owned), BUFFER)


@dataclass
class Source:
    """An opened input: `stream` yields its (decompressed) bytes; `name` lacks the .gz etc."""

    stream: BinaryIO
    name: str
    compression: str | None = None
    parquet: bool = False
    raw: BinaryIO | None = None  # the file under a decompressor, which leaves it open

    def close(self) -> None:
        self.stream.close()
        if self.raw is not None:
            self.raw.close()


def open_source(path: str) -> Source:
    """`path` ('-' for standard input) opened for streaming; refused by name if it cannot be."""
    if path == "-" and 0 in CLOSED_STREAMS:  # it reads as /dev/null now, not an empty input
        raise InputError("-: standard input is closed (<&-); give INPUT a file, or open it")
    raw = sys.stdin.buffer if path == "-" else _open_file(path)
    head, stream = peek(raw, 16, owned=path != "-")
    name = path
    if Path(path).suffix.lower() in COMPRESSIONS:
        name = path[: -len(Path(path).suffix)]
    kind = compression_of(head)
    if kind is None:
        parquet = head.startswith(b"PAR1") or Path(name).suffix.lower() in (".parquet", ".pq")
        return Source(stream, name, None, parquet)
    inner = _decompressed(stream, kind, path)
    try:
        magic = inner.peek(4)[:4]
    except read_errors() as e:  # named here: a decompressor read on after its error finds EOF
        stream.close()
        raise InputError(
            f"{path}: the data cannot be read ({kind}: {e or type(e).__name__}); "
            "is the file cut short or corrupt?"
        ) from None
    if Path(name).suffix.lower() in (".parquet", ".pq") or magic == b"PAR1":
        stream.close()
        raise InputError(
            f"{path}: a {kind}-compressed Parquet file; Parquet compresses its own "
            "columns and is read by seeking: decompress it first"
        )
    return Source(inner, name, kind, raw=stream)


def _open_file(path: str) -> BinaryIO:
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{path}: a directory, not an input file")
    if not p.exists():
        raise InputError(f"{path}: no such file")
    try:
        f = open(p, "rb", buffering=BUFFER)  # noqa: SIM115  (the RowStream closes it)
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror})") from None
    try:  # a shared lock while it is read: another run's -o will not replace it (read_by_a_run)
        fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        pass  # a file being replaced (an exclusive lock) is refused by its writer, not here
    return f


def hold_for_reading(path: str | Path) -> BinaryIO | None:
    """`path` open under an input's shared lock, so no other run's -o replaces it."""
    try:
        return _open_file(str(path))
    except InputError:
        return None  # the reading names the problem


def read_by_a_run(path: str | Path) -> bool:
    """Whether another mlxbatch run holds `path` open as its input (the shared lock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False  # no flock on this file system: nothing to learn
    finally:
        os.close(fd)  # releases the probe's lock with it
    return False


def _decompressed(stream: BinaryIO, kind: str, path: str) -> BinaryIO:
    if kind == "gzip":  # several concatenated members (`cat a.gz b.gz`) read as one
        return io.BufferedReader(gzip.GzipFile(fileobj=stream, mode="rb"), BUFFER)
    if kind == "bzip2":
        return io.BufferedReader(bz2.BZ2File(stream, "rb"), BUFFER)
    if kind == "xz":
        return io.BufferedReader(lzma.LZMAFile(stream, "rb"), BUFFER)
    if importlib.util.find_spec("zstandard") is None:
        raise InputError(
            f"{path}: zstd-compressed; reading it needs the zstandard package: "
            "pip install 'mlxbatch[zstd]' (or: zstdcat FILE | mlxbatch classify -)"
        )
    return io.BufferedReader(ZstdFrames(stream), BUFFER)


class ZstdFrames(io.RawIOBase):
    """zstd frames one after another, decompressed as read; EOFError on a frame cut short. Fed
    1 KiB at a time, which bounds one step at 32 MiB (RLE blocks expand 4 bytes to 128 KiB)."""

    STEP = 1024

    def __init__(self, raw: BinaryIO):
        import zstandard

        self.raw, self.zstd = raw, zstandard.ZstdDecompressor()
        self.out, self.at = b"", 0  # decompressed, not yet returned from `at` on
        self.frame, self.pending = self.zstd.decompressobj(), False  # pending: a frame begun

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while self.at == len(self.out):
            data = self.raw.read(self.STEP)
            if not data:
                if self.pending:
                    raise EOFError("a zstd frame ended before its end was reached")
                return 0
            self.out, self.at, self.pending = self.frame.decompress(data), 0, True
            while self.frame.eof:  # the next frame starts in what this one left over
                rest, self.frame, self.pending = (
                    self.frame.unused_data,
                    self.zstd.decompressobj(),
                    False,
                )
                if rest:
                    self.out, self.pending = self.out + self.frame.decompress(rest), True
        n = min(len(b), len(self.out) - self.at)
        b[:n] = memoryview(self.out)[self.at : self.at + n]
        self.at += n
        return n


def read_errors() -> tuple[type[BaseException], ...]:
    """What reading a (decompressing) stream raises on corrupt or cut-short data."""
    import zlib

    errors: tuple = (OSError, EOFError, zlib.error, lzma.LZMAError)
    if "zstandard" in sys.modules:
        errors += (sys.modules["zstandard"].ZstdError,)
    return errors
