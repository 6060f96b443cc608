"""CSV (RFC 4180) and TSV (tabs only, unquoted) records, streamed, behind a checked header."""

from __future__ import annotations

import csv
from collections.abc import Iterator

from ..errors import InputError
from .caps import ROW_BYTES, size

# a long ticket is not an error (the token limit decides); a field past the row cap is
csv.field_size_limit(ROW_BYTES)
Record = tuple[int, int, dict | None, str | None]  # number, line, object, error


def _strict(lines: Iterator[bytes], source: str) -> Iterator[str]:
    """Decoded lines (line ends kept); bytes that are not UTF-8 are the file's error."""
    for n, raw in enumerate(lines, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(
                f"{source}: line {n}: bytes that are not UTF-8 (at column {e.start + 1})"
            ) from None


def _check_header(
    header: list[str] | None, text_field: str, source: str, kind: str, by_content: bool = False
) -> list[str]:
    if not header or not any(h.strip() for h in header):
        raise InputError(f"{source}: empty file (no {kind} header)")
    header = [h.strip() for h in header]
    first: dict[str, int] = {}
    for i, name in enumerate(header, 1):
        if name and name in first:  # a dict per row would keep only the last
            raise InputError(
                f"{source}: the {kind} header repeats the column {name!r} (columns "
                f"{first[name]} and {i}); rename one"
            )
        first.setdefault(name, i)
    if text_field not in header:
        if len(header) == 1 and text_field in [h.strip().strip('"') for h in header[0].split(";")]:
            raise InputError(
                f"{source}: the {kind} header is separated by ';' ({header[0]!r}); "
                "save it with commas, or with tabs as .tsv"
            )
        shown = header if len(header) <= 20 else [*header[:20], f"... {len(header)} in all"]
        hint = ", or --input-format text to read each line as a text" if by_content else ""
        raise InputError(
            f"{source}: the {kind} header has no {text_field!r} column (columns: "
            f"{shown}); use --text-field to name the text column{hint}"
        )
    return header


def csv_rows(
    lines: Iterator[bytes], text_field: str, source: str, by_content: bool
) -> tuple[list[str], Iterator[Record]]:
    reader = csv.reader(_strict(lines, source), strict=True)
    try:
        first = next(reader, None)
    except csv.Error as e:
        raise InputError(f"{source}: line 1: the header is not valid CSV ({e})") from None
    header = _check_header(first, text_field, source, "CSV", by_content)
    return header, _csv_records(reader, header, source)


def _csv_records(reader, header: list[str], source: str) -> Iterator[Record]:
    n, start = 0, reader.line_num + 1
    try:
        for rec in reader:
            if rec:  # a blank line is not a row
                n += 1
                if len(rec) != len(header):
                    yield n, start, None, f"{len(rec)} fields where the header has {len(header)}"
                else:
                    yield n, start, dict(zip(header, rec)), None
            start = reader.line_num + 1
    except csv.Error as e:
        if "end of data" in str(e) or "EOF" in str(e):
            raise InputError(
                f"{source}: line {start}: a quoted field of data row {n + 1} is never closed "
                "(the file ends inside quotes); fix the quote or use TSV"
            ) from None
        if "field larger than field limit" in str(e):
            raise InputError(
                f"{source}: line {start}: data row {n + 1} has a field longer than "
                f"{size(ROW_BYTES)}, the cap on one row (a quote never closed?)"
            ) from None
        raise InputError(
            f"{source}: line {start}: data row {n + 1} is not valid CSV ({e})"
        ) from None


def tsv_rows(
    lines: Iterator[bytes], text_field: str, source: str, by_content: bool
) -> tuple[list[str], Iterator[Record]]:
    """Tab-separated values, split on tabs only: quotes are ordinary characters."""
    text = _strict(lines, source)
    first = next(text, "").rstrip("\n").rstrip("\r")
    header = _check_header(first.split("\t"), text_field, source, "TSV", by_content)
    return header, _tsv_records(text, header)


def _tsv_records(text: Iterator[str], header: list[str]) -> Iterator[Record]:
    n = 0
    for i, line in enumerate(text, start=2):
        line = line.rstrip("\n").rstrip("\r")
        if not line.strip():
            continue
        n += 1
        rec = line.split("\t")
        if len(rec) != len(header):
            yield n, i, None, f"{len(rec)} fields where the header has {len(header)}"
        else:
            yield n, i, dict(zip(header, rec)), None
