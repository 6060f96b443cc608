"""Where results go: a crash-safe journal behind a file, or an ordered stream.

For a regular output file, every finished batch is appended to `OUTPUT.part` in one write and
fsync'd, each line tagged with its input row index; the journal's first line records the run's
fingerprint and settings. When every row is in, the rows are written to OUTPUT in input order
(JSONL, or CSV/TSV by extension) through a new temporary file and an atomic rename, and the
journal is removed. `--resume` re-reads the journal, drops a half-written last line, and
re-plans the same batches from the recorded settings, so resumed scores are bit-identical.

Safety, by construction: the journal and the temporary file are created with O_EXCL (an
existing file is never overwritten: one that mlxbatch did not write is refused); the journal is
locked while a run writes it, so a second run on the same output is refused with the first
one's pid; `-o -` is standard output, and character devices and FIFOs are written straight
(no journal, no rename). Every line written is strict JSON (no NaN).
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TextIO

from ..errors import OutputError, ResumeError
from .rows import dumps, write_rows

JOURNAL_VERSION = 1


class Sink(Protocol):
    """Where finished rows go: `done` holds what is already there (by input row index)."""

    header: dict
    done: dict[int, dict]

    def append(self, rows: list[tuple[int, dict]]) -> None: ...
    def finish(self, n_rows: int, labels: tuple[str, ...]) -> None: ...
    def close(self) -> None: ...


def journal_path(output: Path) -> Path:
    return output.with_name(output.name + ".part")


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


def _lock_holder(fd: int) -> int | None:
    """The pid holding a write lock on `fd`'s file, if another process does."""
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
    """Append-only, fsync'd JSONL of {"row": index, "result": {...}} lines behind a header."""

    def __init__(self, output: Path, header: dict, resume: bool):
        self.output, self.path = output, journal_path(output)
        self.done: dict[int, dict] = {}
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            fresh = True
        except FileExistsError:
            fresh = False
            self.fd = self._open_existing()
        except OSError as e:
            raise oserror(self.path, e, "cannot create the journal") from None
        self._lock()
        if fresh:
            self.header = header
            self._write(dumps({"mlxbatch_journal": JOURNAL_VERSION, **header}) + "\n")
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
        with os.fdopen(os.dup(fd), "rb") as f:
            first = f.readline()
        if not first.startswith(b'{"mlxbatch_journal"'):
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

    def _write(self, text: str) -> None:
        try:
            os.lseek(self.fd, 0, os.SEEK_END)
            data = text.encode("utf-8")
            while data:
                data = data[os.write(self.fd, data) :]
            os.fsync(self.fd)
        except OSError as e:
            raise oserror(self.path, e) from None

    def _load(self, header: dict) -> dict:
        size = os.fstat(self.fd).st_size
        raw = os.pread(self.fd, size, 0)
        lines = raw.split(b"\n")
        complete, tail = lines[:-1], lines[-1]  # tail: bytes after the last newline
        head = _checked_head(self.path, complete[0] if complete else b"", header)
        good = len(complete[0]) + 1
        for line in complete[1:]:
            try:
                entry = json.loads(line)
                self.done[int(entry["row"])] = entry["result"]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                break  # a torn write: everything from here on is redone
            good += len(line) + 1
        if good != len(raw) or tail:
            os.ftruncate(self.fd, good)  # drop the half-written remainder
        return {k: v for k, v in head.items() if k != "mlxbatch_journal"}

    def append(self, rows: list[tuple[int, dict]]) -> None:
        fresh = [(i, r) for i, r in rows if i not in self.done]
        if not fresh:
            return
        self._write("".join(dumps({"row": i, "result": r}) + "\n" for i, r in fresh))
        self.done.update(fresh)

    def finish(self, n_rows: int, labels: tuple[str, ...]) -> None:
        """Write OUTPUT in input order (a new temporary file, atomic rename), drop the journal."""
        missing = [i for i in range(n_rows) if i not in self.done]
        if missing:
            raise RuntimeError(f"rows {missing[:10]} have no result; not writing {self.output}")
        rows = [self.done[i] for i in range(n_rows)]
        write_atomically(self.output, lambda f: write_rows(f, rows, labels, self.output.suffix),
                         "cannot write (the journal keeps every row)")  # fmt: skip
        self.path.unlink()
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1


def _checked_head(path: Path, first_line: bytes, header: dict) -> dict:
    try:
        head = json.loads(first_line) if first_line else None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError):
        head = None
    if not isinstance(head, dict) or head.get("mlxbatch_journal") != JOURNAL_VERSION:
        raise ResumeError(f"{path}: not an mlxbatch journal; delete it to start over")
    if head.get("fingerprint") != header.get("fingerprint"):
        raise ResumeError(
            f"{path} was written for a different input, model, labels, prompt or settings; "
            "delete it to start over"
        )
    return head


def recorded_header(output: Path, header: dict) -> dict | None:
    """The header of OUTPUT's journal (checked against `header`), or None when there is none."""
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
    if not first.endswith(b"\n"):
        first = b""
    head = _checked_head(path, first, header)
    if not isinstance(head.get("settings"), dict):
        raise ResumeError(f"{path}: the journal header has no settings; delete it to start over")
    return {k: v for k, v in head.items() if k != "mlxbatch_journal"}


class OrderedStream:
    """Writes JSONL rows to a stream (stdout by default) in input order, as soon as all earlier
    rows are known. No journal: nothing to resume."""

    def __init__(self, n_rows: int, labels: tuple[str, ...], header: dict,
                 stream: TextIO | None = None):  # fmt: skip
        self.done: dict[int, dict] = {}
        self.header = header
        self.next, self.n, self.labels = 0, n_rows, labels
        self.stream = stream

    def append(self, rows: list[tuple[int, dict]]) -> None:
        self.done.update(rows)
        start = self.next
        while self.next in self.done:
            self.next += 1
        if self.next > start:
            out = self.stream or sys.stdout
            try:
                write_rows(out, [self.done[i] for i in range(start, self.next)], self.labels, "")
                out.flush()
            except BrokenPipeError:
                raise
            except OSError as e:
                name = getattr(out, "name", "standard output")
                raise OutputError(f"{name}: cannot write ({e.strerror or e})") from None

    def finish(self, n_rows: int, labels: tuple[str, ...]) -> None:
        if self.next != self.n:
            raise RuntimeError(f"only {self.next} of {self.n} rows were printed")
        self.close()

    def close(self) -> None:
        if self.stream is not None and not self.stream.closed:
            try:
                self.stream.close()
            except OSError:
                pass  # the write error was reported already
