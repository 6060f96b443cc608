"""A job's input, read in windows: a list, or a file read twice (a scan: count, fingerprint,
bad rows; then window by window), so no pass holds more than one window. Stdin is held whole."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import InputError, JobError
from .ids import DuplicateIds
from .inputs import Row, describe_errors, open_rows, read_rows
from .sources import hold_for_reading

BAD_KEPT = 30  # bad rows a scan keeps for the refusal message (it counts all of them)


@dataclass(frozen=True)
class JobInput:
    # every row again, in input order; given the scan's duplicate ids (see `scan`), a file's
    # second pass keeps no table of ids
    reopen: Callable[[DuplicateIds | None], Iterable[Row]]
    source: str  # the input's name, for messages
    fmt: str
    identity: tuple | None = None  # a file's (device, inode, size, mtime) when first opened
    held: BinaryIO | None = None  # the file open under the shared lock for the whole job

    def close(self) -> None:
        """The job is over: its input may be written again (see `sources.hold_for_reading`)."""
        if self.held is not None:
            self.held.close()

    def check_unchanged(self) -> None:
        """Refuse a file changed since first read: its windows would mix two versions."""
        if self.identity is not None and _identity(self.source) != self.identity:
            raise InputError(
                f"{self.source}: changed while the job read it; nothing after the "
                "change was written (finished batches are kept: --resume once the "
                "file is final)"
            )

    @classmethod
    def of_rows(cls, rows: list[Row], source: str = "input", fmt: str = "jsonl") -> JobInput:
        return cls(lambda duplicates=None: rows, source, fmt)

    @classmethod
    def of_file(
        cls,
        path: str,
        text_field: str = "text",
        id_field: str | None = None,
        fmt: str = "auto",
        fields: tuple[str, ...] = (),
        output_format: str = "jsonl",
    ) -> JobInput:
        """`path` read afresh at each pass; what cannot be read twice (stdin, a pipe) is held."""
        if path == "-" or not _regular(path):
            rows, found = read_rows(path, text_field, id_field, fmt, fields, output_format)
            return cls.of_rows(rows, path, found)
        held = hold_for_reading(path)  # before the first reading: the one that is checked
        # an empty input is refused now, before the model loads
        try:
            first = open_rows(
                path, text_field, id_field, fmt, fields, output_format, DuplicateIds()
            )
            found = first.format
            try:
                next(iter(first), None)
            finally:
                first.close()
        except BaseException:  # refused: the lock goes with it, not when the error is freed
            if held is not None:
                held.close()
            raise
        identity = _identity(path)

        def reopen(duplicates: DuplicateIds | None = None) -> Iterable[Row]:
            if _identity(path) != identity:
                raise InputError(
                    f"{path}: changed while the job read it; nothing after the change was written"
                )
            return open_rows(path, text_field, id_field, fmt, fields, output_format, duplicates)

        return cls(reopen, path, found, identity, held)

    def windows(
        self, size: int, scanned: Scan | None = None, chars: int | None = None
    ) -> Iterator[tuple[int, list[Row]]]:
        """(first row's index, rows) of `size` rows, or fewer reaching `chars` characters."""
        rows, start = iter(self.reopen(scanned.duplicates if scanned else None)), 0
        while window := _window(rows, size, chars):
            yield start, window
            start += len(window)


def window_full(rows: int, chars: int, size: int, limit: int | None) -> bool:
    """Whether a window of `rows` rows whose texts hold `chars` characters ends there."""
    return rows >= size or (limit is not None and chars >= limit)


def _window(rows: Iterator[Row], size: int, limit: int | None) -> list[Row]:
    window, chars = [], 0
    for row in rows:
        window.append(row)
        chars += len(row.text or "")
        if window_full(len(window), chars, size, limit):
            break
    return window


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True  # open_rows names the problem


def _identity(path: str) -> tuple:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


@dataclass(frozen=True)
class Scan:
    rows: int
    digest: str  # the fingerprint's input part
    bad: list[Row]  # the first BAD_KEPT bad rows, each with its reason
    bad_count: int
    duplicates: DuplicateIds | None = None  # the rows with a duplicate id (a file's scan)

    def refuse_bad_rows(self, on_error: str, source: str, fmt: str) -> None:
        """Under --on-error fail, any bad row stops the job before anything is computed."""
        if on_error != "fail" or not self.bad_count:
            return
        first, *rest = describe_errors(
            self.bad, source, fmt, total=self.rows, bad_total=self.bad_count
        ).split("\n")
        raise JobError(
            "\n".join(
                [
                    first + "; nothing was computed (--on-error skip writes an error row for each)",
                    *rest,
                ]
            )
        )


def scan(
    job_input: JobInput,
    refused: Callable[[list[Row]], list[str | None]] | None = None,
    chunk: int = 4096,
) -> Scan:
    """One pass over the input: rows counted and hashed, bad rows counted, the first few kept."""
    h, count, bad, bad_count = hashlib.sha256(), 0, [], 0
    stream = job_input.reopen(None)
    rows = iter(stream)
    while block := list(itertools.islice(rows, chunk)):
        reasons = refused(block) if refused else [None] * len(block)
        for row, reason in zip(block, reasons):
            count += 1
            hash_row(h, row)
            error = row.error or reason
            if error:
                bad_count += 1
                if len(bad) < BAD_KEPT:
                    bad.append(dataclasses.replace(row, error=error))
    return Scan(count, h.hexdigest()[:16], bad, bad_count, getattr(stream, "duplicates", None))


def hash_row(h, row: Row) -> None:
    """Add one input row (id, text, error) to the input's hash (a job's fingerprint part)."""
    h.update(json.dumps([row.id, row.text, row.error]).encode())
