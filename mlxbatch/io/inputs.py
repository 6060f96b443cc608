"""Read and validate input rows (JSONL, CSV, TSV, text, Parquet; compressed or not; a file or
stdin), streamed, each keeping its number and line so errors and outputs can name it."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError, unicode_problem
from .formats import Record, json_kind, parse
from .ids import NUMBER, TEXT, DuplicateIds, IdTable, canonical
from .parquet import parse_parquet
from .sources import open_source

FORMATS = ("auto", "jsonl", "csv", "tsv", "text", "parquet")


@dataclass
class Row:
    number: int  # 1-based line (JSONL, text) or data row (CSV, TSV, Parquet)
    id: Any  # None when the row's id could not be read
    text: str | None  # None when the row is bad
    error: str | None = None
    line: int = 0  # the physical line the row starts on
    fields: dict = field(default_factory=dict)  # other requested fields (gold labels, ...)
    others: tuple = ()  # its fields beyond the text, the id and those requested (if asked)


class RowStream:
    """The rows of one input, read and checked as they are iterated (once): one row at a time,
    plus a digest of every id seen; a file-level problem found later raises InputError."""

    def __init__(
        self,
        path: str,
        text_field: str = "text",
        id_field: str | None = None,
        fmt: str = "auto",
        fields: tuple[str, ...] = (),
        output_format: str = "jsonl",
        duplicates: DuplicateIds | None = None,
        list_others: bool = False,
    ):
        source = open_source(path)
        try:
            if fmt == "parquet" or (fmt == "auto" and source.parquet):
                parsed = parse_parquet(source.stream, path, text_field, id_field, fields)
            else:
                parsed = parse(source.stream, path, source.name, fmt, text_field)
        except BaseException:
            source.close()
            raise
        self.source, self.path, self.format = source, path, parsed.format
        self.text_field, self.fields, self.output_format = text_field, fields, output_format
        self._records, self._columns = parsed.records, parsed.columns
        self._list_others = list_others  # an examples file's: not every row of every input
        self.id_field = id_field
        self._ids_from_first = id_field is None and parsed.columns is None and self.format != "text"
        if id_field is None and parsed.columns is not None and "id" in parsed.columns:
            self.id_field = "id"
        # ids seen so far, as digests (ids.py); none on a second pass given `duplicates`
        self._checking = duplicates is None
        # made at the first id: a stream opened only to detect a format holds none
        self._seen: IdTable | None = None
        self.duplicates = DuplicateIds() if duplicates is None else duplicates
        self._started = False

    def __enter__(self) -> RowStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.source.close()

    def __iter__(self) -> Iterator[Row]:
        if self._started:
            raise RuntimeError(f"{self.path}: a RowStream is read once")
        self._started, count = True, 0
        try:
            for record in self._records:
                count += 1
                yield self._row(record)
        finally:
            self.close()
        if not count:
            raise InputError(f"{self.path}: empty input (no rows)")

    def windows(self, size: int) -> Iterator[list[Row]]:
        """The rows in lists of `size` (the last one shorter), read as each is asked for."""
        rows = iter(self)
        while window := list(itertools.islice(rows, size)):
            yield window

    def _row(self, record: Record) -> Row:
        n, line, obj, err = record
        if obj is not None and self._ids_from_first:  # the first object decides, once
            self._ids_from_first, self._first = False, n
            self.id_field = "id" if "id" in obj else None
        # ids are row numbers only when the input has no id field: then they cannot collide
        numbered = self.id_field is None and not self._ids_from_first
        row = Row(n, n if numbered else None, None, err, line)
        if obj is None:
            return row
        row.fields = {k: obj[k] for k in self.fields if k in obj}
        if self._list_others:
            row.others = self._others(obj)
        if self.id_field is not None:
            row.error = self._id_problem(obj, n)
            if row.error:
                return row
            row.id = obj[self.id_field]
        elif "id" in obj and self.format == "jsonl":
            row.error = (
                f"an 'id' field, where line {self._first} has none; give every row an "
                "id or none, or name the id field with --id-field"
            )
            return row
        row.text, row.error = _text(obj.get(self.text_field), self.text_field)
        return row

    def _others(self, obj: dict) -> tuple:
        known = (self.text_field, self.id_field or "id", *self.fields)
        # a table's header: a Parquet row holds only the columns asked for
        return tuple(k for k in self._columns or obj if k not in known)

    def _id_problem(self, obj: dict, n: int) -> str | None:
        if self.id_field not in obj:
            return f"missing id field {self.id_field!r}"
        rid = obj[self.id_field]
        if isinstance(rid, bool) or not isinstance(rid, (str, int, float)):
            return f"id {_short(rid)} is not a string or number"
        if isinstance(rid, float) and not math.isfinite(rid):
            return f"id {rid} is not a finite number"
        if isinstance(rid, str) and (problem := unicode_problem(rid)):
            return f"id {_short(rid)} holds {problem}"
        key = rid
        if self.output_format in ("csv", "tsv"):  # written as text: 1 and "1" are one id there
            key = rid if isinstance(rid, str) else repr(rid)
            if self.output_format == "tsv" and any(c in key for c in "\t\n\r"):
                return f"id {_short(rid)} holds a tab or line break, which a TSV output cannot hold"
        kind = TEXT if isinstance(rid, str) else NUMBER
        if not self._checking:  # an earlier pass found the duplicates
            seen = self.duplicates.get(n)
        else:
            self._seen = self._seen or IdTable()
            if (seen := self._seen.first(canonical(key), n, kind)) is not None:
                self.duplicates.add(n, *seen)
        if seen is None:
            return None
        first, first_kind = seen
        if self.output_format in ("csv", "tsv") and first_kind != kind:  # one id once text
            other = key if first_kind == TEXT else _number(key)
            return (
                f"duplicate id {rid!r} (first at {first} as {other!r}; the two are "
                f"one id in a {self.output_format.upper()} output: write JSONL)"
            )
        return f"duplicate id {rid!r} (first at {first})"


def _number(text: str) -> int | float:
    """The number whose repr is `text`."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def _text(text: Any, text_field: str) -> tuple[str | None, str | None]:
    if text is None:
        return None, f"missing text field {text_field!r}"
    if not isinstance(text, str):
        return None, f"text field {text_field!r} is {json_kind(text)}, not a string"
    if not text.strip():
        return None, "empty text"
    if problem := unicode_problem(text):
        return None, f"text holds {problem}"
    return text, None


def open_rows(
    path: str,
    text_field: str = "text",
    id_field: str | None = None,
    fmt: str = "auto",
    fields: tuple[str, ...] = (),
    output_format: str = "jsonl",
    duplicates: DuplicateIds | None = None,
    list_others: bool = False,
) -> RowStream:
    """The rows of `path` ('-' for stdin) as a stream, each valid or carrying its error; ids
    equal as text are duplicates for a csv/tsv `output_format`; `list_others`: each row names
    its fields beyond the text, the id and `fields` (`Row.others`)."""
    return RowStream(
        path, text_field, id_field, fmt, fields, output_format, duplicates, list_others
    )


def read_rows(
    path: str,
    text_field: str = "text",
    id_field: str | None = None,
    fmt: str = "auto",
    fields: tuple[str, ...] = (),
    output_format: str = "jsonl",
) -> tuple[list[Row], str]:
    """All rows of `path` (or '-' for stdin), each valid or carrying its error; and the format."""
    stream = open_rows(path, text_field, id_field, fmt, fields, output_format)
    return list(stream), stream.format


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe_errors(
    rows: list[Row],
    source: str,
    fmt: str,
    limit: int = 30,
    total: int | None = None,
    bad_total: int | None = None,
) -> str:
    """A line naming the first bad row, then an indented line per bad row (of `bad_total`)."""
    unit = "row" if fmt in ("csv", "tsv", "parquet") else "line"
    bad = [r for r in rows if r.error]
    first, n_bad = bad[0], bad_total if bad_total is not None else len(bad)
    lines = [
        f"{source}: {n_bad} of {total if total is not None else len(rows)} rows are "
        f"invalid (first: {unit} {first.number}: {first.error})"
    ]
    lines += [f"  {source}: {unit} {r.number}: {r.error}" for r in bad[:limit]]
    if n_bad > limit:
        lines.append(f"  ... and {n_bad - limit} more")
    return "\n".join(lines)
