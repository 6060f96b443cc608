"""Where results go: a crash-safe journal behind a file (batches appended and fsync'd, then the
rows written in order by an atomic rename), or an ordered stream (docs/guarantees.md)."""

from __future__ import annotations

import fcntl
import os
import struct
import sys
from pathlib import Path
from typing import Protocol

from ..errors import OutputError, ResumeError
from ..runtime.files import oserror, write_atomically
from .journal_lines import JOURNAL_VERSION, checked_head, journal_entry
from .rowindex import RowIndex
from .rows import dumps, write_rows
from .sources import read_by_a_run

JOURNAL_MAGIC = b'{"mlxbatch_journal"'


def _first_line(fd: int) -> bytes:
    """The file's first line, newline included, read by offset (a read would move `fd`)."""
    line = b""
    while True:
        chunk = os.pread(fd, 65536, len(line))
        if not chunk or b"\n" in chunk:
            return line + chunk.split(b"\n", 1)[0] + (b"\n" if chunk else b"")
        line += chunk


def _unwritten(first: bytes) -> bool:
    """Whether a journal's first line is a header never finished: no rows, so start over."""
    if first.endswith(b"\n"):
        return False
    first = first.rstrip(b"\0")
    return JOURNAL_MAGIC.startswith(first) or first.startswith(JOURNAL_MAGIC)


def is_journal(path: Path) -> bool:
    """Whether `path` is a file that an mlxbatch run wrote as its journal."""
    try:
        with open(path, "rb") as f:
            return f.read(len(JOURNAL_MAGIC)) == JOURNAL_MAGIC
    except OSError:
        return False


def lock_holder(path: Path) -> int | None:
    """The pid of another process holding a write lock on `path`, if any."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return _lock_holder(fd)
    finally:
        os.close(fd)


class Sink(Protocol):
    """Where finished rows go: `done` holds what is already there (by input row index)."""

    header: dict
    done: dict[int, dict]

    def append(self, rows: list[tuple[int, dict]]) -> None: ...
    def finish(self, n_rows: int, labels: tuple[str, ...]) -> None: ...
    def close(self) -> None: ...
    def abandon(self) -> None: ...


def journal_path(output: Path) -> Path:
    """OUTPUT.part; for an output that is a link, beside the file it names: two names of one
    output share one journal, so its lock stops a second run through the other name."""
    if output.is_symlink():
        output = Path(os.path.realpath(output))
    return output.with_name(output.name + ".part")


def _lock_holder(fd: int) -> int | None:
    if sys.platform == "darwin":
        fmt, order = "qqihh", ("start", "len", "pid", "type", "whence")
    else:
        fmt, order = "hhqqi4x", ("type", "whence", "start", "len", "pid")
    values = {"type": fcntl.F_WRLCK, "whence": 0, "start": 0, "len": 0, "pid": 0}
    try:
        res = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(fmt, *(values[k] for k in order)))
    except OSError:
        return None
    got = dict(zip(order, struct.unpack(fmt, res)))
    return got["pid"] if got["type"] != fcntl.F_UNLCK else None


class Journal:
    """Append-only, fsync'd JSONL of {"row": index, "result": {...}} lines behind a header;
    `done` says which rows it holds (a `RowIndex`: offsets, not rows)."""

    def __init__(
        self,
        output: Path,
        header: dict,
        resume: bool,
        n_rows: int | None = None,
        labels: tuple[str, ...] | None = None,
        min_confidence: float | None = None,
    ):
        """`n_rows`, `labels`, `min_confidence`: the job's, which resumed rows must fit."""
        self.output, self.path = output, journal_path(output)
        self.n_rows, self.labels, self.min_confidence = n_rows, labels, min_confidence
        self.done = RowIndex(-1)
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            fresh = True
        except FileExistsError:
            fresh = False
            self.fd = self._open_existing()
        except OSError as e:
            raise oserror(self.path, e, "cannot create the journal") from None
        self._lock()
        self.done.fd = self.fd
        if not fresh and _unwritten(_first_line(self.fd)):
            os.ftruncate(self.fd, 0)  # a header never finished (a full disk): no rows to lose
            fresh = True
        self.made = fresh  # this run wrote the header
        if fresh:
            self.header = header
            self._write((dumps({"mlxbatch_journal": JOURNAL_VERSION, **header}) + "\n").encode())
        elif not resume:
            os.close(self.fd)
            raise ResumeError(
                f"{self.path} holds an interrupted run: add --resume to continue it, "
                "or delete it to start over"
            )
        else:
            self.header = self._load(header)

    def _open_existing(self) -> int:
        if not self.path.is_file() or self.path.is_symlink():
            raise OutputError(f"{self.path}: exists and is not an mlxbatch journal; move it away")
        try:
            fd = os.open(self.path, os.O_RDWR)
        except OSError as e:
            raise oserror(self.path, e, "cannot open the journal") from None
        first = _first_line(fd)
        if not first.startswith(JOURNAL_MAGIC) and not _unwritten(first):
            os.close(fd)
            raise OutputError(
                f"{self.path}: exists and was not written by mlxbatch; move it away or choose "
                "another -o"
            )
        return fd

    def _lock(self) -> None:
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pid = _lock_holder(self.fd)
            os.close(self.fd)
            who = f" (pid {pid})" if pid else ""
            raise OutputError(f"another run is writing this output{who}: {self.output}") from None

    def _write(self, data: bytes) -> int:
        """Append `data`, durably; returns the offset it starts at."""
        try:
            start = os.lseek(self.fd, 0, os.SEEK_END)
            while data:
                data = data[os.write(self.fd, data) :]
            os.fsync(self.fd)
        except OSError as e:
            raise oserror(self.path, e) from None
        return start

    def _load(self, header: dict) -> dict:
        size = os.fstat(self.fd).st_size
        raw = os.pread(self.fd, size, 0)
        lines = raw.split(b"\n")
        complete, tail = lines[:-1], lines[-1]  # tail: bytes after the last newline
        try:
            head = checked_head(self.path, complete[0] if complete else b"", header)
        except ResumeError:
            os.close(self.fd)
            raise
        good = len(complete[0]) + 1
        too_long = (header.get("settings") or {}).get("too_long")  # None: not recorded
        truncating = None if too_long is None else too_long == "truncate"
        for n, line in enumerate(complete[1:], start=2):
            entry = journal_entry(line, self.n_rows, self.labels, self.min_confidence, truncating)
            if isinstance(entry, str) and line and not line.strip(b"\0"):
                break  # zeros: blocks a crash left unwritten; everything from here is redone
            if not isinstance(entry, str) and entry[0] in self.done:
                entry = "repeats a row"
            if isinstance(entry, str):
                os.close(self.fd)
                raise ResumeError(
                    f"{self.path}: line {n} {entry} (edited?); delete the journal to start over"
                )
            self.done.add(entry[0], good)
            good += len(line) + 1
        if good != len(raw) or tail:
            os.ftruncate(self.fd, good)  # drop the half-written remainder
        return {k: v for k, v in head.items() if k != "mlxbatch_journal"}

    def append(self, rows: list[tuple[int, dict]]) -> None:
        fresh, seen = [], set()
        for i, r in rows:
            if i not in self.done and i not in seen:
                fresh.append((i, r))
                seen.add(i)
        if not fresh:
            return
        lines = [(dumps({"row": i, "result": r}) + "\n").encode("utf-8") for i, r in fresh]
        offset = self._write(b"".join(lines))  # encoded once: the offsets count these bytes
        for (i, _), line in zip(fresh, lines):
            self.done.add(i, offset)
            offset += len(line)

    def finish(self, n_rows: int, labels: tuple[str, ...]) -> None:
        """Write OUTPUT in input order (rows read back one at a time), then drop the journal."""
        missing = [i for i in range(n_rows) if i not in self.done]
        if missing:
            raise RuntimeError(f"rows {missing[:10]} have no result; not writing {self.output}")
        if read_by_a_run(self.output):  # since the check before the run began
            raise OutputError(
                f"{self.output} is being read by another mlxbatch run (as its "
                "input); not replacing it: the journal keeps every row, --resume "
                "once that run is done"
            )
        rows = (self.done[i] for i in range(n_rows))
        write_atomically(
            self.output,
            lambda f: write_rows(f, rows, labels, self.output.name),
            "cannot write (the journal keeps every row)",
        )
        self._unlink_own()
        self.close()

    def abandon(self) -> None:
        """Close on failure; a journal this run made without rows would only refuse the next run."""
        if self.fd >= 0 and self.made and len(self.done) == 0:
            self._unlink_own()
        self.close()

    def _unlink_own(self) -> None:
        """Remove the journal only if its name still holds the file this run opened."""
        mine = os.fstat(self.fd)
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return
        if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            self.path.unlink()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1


def recorded_header(output: Path, header: dict | None) -> dict | None:
    """The header of OUTPUT's journal (checked against `header` when given), or None."""
    path = journal_path(output)
    if not path.is_file():
        return None
    try:
        with open(path, "r+b") as f:
            pid = _lock_holder(f.fileno())
            first = f.readline()
    except OSError as e:
        raise oserror(path, e, "cannot read the journal") from None
    if pid:
        raise OutputError(f"another run is writing this output (pid {pid}): {output}")
    if _unwritten(first):
        return None  # no header, no rows: the run starts over
    if not first.endswith(b"\n"):
        first = b""
    head = checked_head(path, first, header)
    if not isinstance(head.get("settings"), dict):
        raise ResumeError(f"{path}: the journal header has no settings; delete it to start over")
    return {k: v for k, v in head.items() if k != "mlxbatch_journal"}
