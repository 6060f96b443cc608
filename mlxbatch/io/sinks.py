"""Crash-safe output: a journal written as results arrive, the final file in input order.

While a run is going, every finished batch is appended to `OUTPUT.part` in one write and
fsync'd, each line tagged with its input row index. The journal's first line records the
run's fingerprint and settings. When every row is in, the rows are written to OUTPUT in
input order (JSONL, or CSV by extension) through a temporary file and an atomic rename, and
the journal is removed. `--resume` re-reads the journal, drops a half-written last line, and
re-plans the same batches from the recorded settings, so resumed scores are bit-identical.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path
from typing import Any, Protocol, TextIO

from ..errors import ResumeError

JOURNAL_VERSION = 1


def result_row(rid: Any, labels: tuple[str, ...], probs, extra: dict | None = None) -> dict:
    scores = {name: float(p) for name, p in zip(labels, probs)}
    best = max(range(len(labels)), key=lambda j: probs[j])
    return {"id": rid, "label": labels[best], "scores": scores, **(extra or {})}


def error_row(rid: Any, message: str) -> dict:
    return {"id": rid, "error": message}


class Sink(Protocol):
    """Where finished rows go: `done` holds what is already there (by input row index)."""

    header: dict
    done: dict[int, dict]

    def append(self, rows: list[tuple[int, dict]]) -> None: ...
    def finish(self, n_rows: int, labels: tuple[str, ...]) -> None: ...
    def close(self) -> None: ...


def journal_path(output: Path) -> Path:
    return output.with_name(output.name + ".part")


class Journal:
    """Append-only, fsync'd JSONL of {"row": index, "result": {...}} lines behind a header."""

    def __init__(self, output: Path, header: dict, resume: bool):
        self.output, self.path = output, journal_path(output)
        self.done: dict[int, dict] = {}
        if self.path.exists() and not resume:
            raise ResumeError(
                f"{self.path} holds an interrupted run: add --resume to continue it, "
                "or delete it to start over"
            )
        if resume and self.path.exists():
            self.header = self._load(header)
        else:
            self.header = header
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "w", encoding="utf-8") as f:
                f.write(json.dumps({"mlxbatch_journal": JOURNAL_VERSION, **header}) + "\n")
                f.flush()
                os.fsync(f.fileno())
        self._file = open(self.path, "a", encoding="utf-8")

    def _load(self, header: dict) -> dict:
        raw = self.path.read_bytes()
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
            with open(self.path, "r+b") as f:  # drop the half-written remainder
                f.truncate(good)
        return {k: v for k, v in head.items() if k != "mlxbatch_journal"}

    def append(self, rows: list[tuple[int, dict]]) -> None:
        fresh = [(i, r) for i, r in rows if i not in self.done]
        if not fresh:
            return
        self._file.write("".join(json.dumps({"row": i, "result": r}) + "\n" for i, r in fresh))
        self._file.flush()
        os.fsync(self._file.fileno())
        self.done.update(fresh)

    def finish(self, n_rows: int, labels: tuple[str, ...]) -> None:
        """Write OUTPUT in input order (atomic rename), then remove the journal."""
        missing = [i for i in range(n_rows) if i not in self.done]
        if missing:
            raise RuntimeError(f"rows {missing[:10]} have no result; not writing {self.output}")
        tmp = self.output.with_name(self.output.name + ".tmp")
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            write_rows(f, [self.done[i] for i in range(n_rows)], labels, self.output.suffix)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.output)
        self.close()
        self.path.unlink()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def _checked_head(path: Path, first_line: bytes, header: dict) -> dict:
    try:
        head = json.loads(first_line) if first_line else None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
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
    with open(path, "rb") as f:
        first = f.readline()
    if not first.endswith(b"\n"):
        first = b""
    head = _checked_head(path, first, header)
    if not isinstance(head.get("settings"), dict):
        raise ResumeError(f"{path}: the journal header has no settings; delete it to start over")
    return {k: v for k, v in head.items() if k != "mlxbatch_journal"}


def write_rows(f: TextIO, rows: list[dict], labels: tuple[str, ...], suffix: str) -> None:
    if suffix.lower() in (".csv", ".tsv"):
        extras = sorted({k for r in rows for k in r} - {"id", "label", "scores", "error"})
        w = csv.writer(f, delimiter="\t" if suffix.lower() == ".tsv" else ",")
        w.writerow(["id", "label", *(f"score_{x}" for x in labels), "error", *extras])
        for r in rows:
            s = r.get("scores", {})
            w.writerow([r["id"], r.get("label", ""), *(s.get(x, "") for x in labels),
                        r.get("error", ""), *(json.dumps(r[k]) if k in r else "" for k in extras)])  # fmt: skip
    else:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


class OrderedStream:
    """Writes rows to a stream (stdout by default) in input order, as soon as all earlier rows
    are known. No journal: nothing to resume."""

    def __init__(self, n_rows: int, labels: tuple[str, ...], header: dict,
                 stream: TextIO | None = None, suffix: str = ""):  # fmt: skip
        self.done: dict[int, dict] = {}
        self.header = header
        self.next, self.n, self.labels = 0, n_rows, labels
        self.stream, self.suffix = stream, suffix

    def append(self, rows: list[tuple[int, dict]]) -> None:
        self.done.update(rows)
        start = self.next
        while self.next in self.done:
            self.next += 1
        if self.next > start:
            out = self.stream or sys.stdout
            write_rows(
                out, [self.done[i] for i in range(start, self.next)], self.labels, self.suffix
            )
            out.flush()

    def finish(self, n_rows: int, labels: tuple[str, ...]) -> None:
        if self.next != self.n:
            raise RuntimeError(f"only {self.next} of {self.n} rows were printed")

    def close(self) -> None:
        pass
