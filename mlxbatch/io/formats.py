"""Bytes to records: the input format (named, by extension, else by content) and its parser.

Each record is (row number, line it starts on, the parsed object or None, an error or None):
the row number is the line in JSONL/text files and the data row in CSV/TSV files. A UTF-8
byte-order mark is dropped in every format; blank lines are not records. The parsers never
merge or alter rows silently: a CSV that ends inside a quoted field is an error naming the
row where the quote opened, and TSV is split on tabs only (no quoting).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from ..errors import InputError

BOM = b"\xef\xbb\xbf"
csv.field_size_limit(2**31 - 1)  # a long ticket is not an error; the token limit decides
Record = tuple[int, int, dict | None, str | None]  # number, line, object, error


def parse(
    data: bytes, source: str, fmt: str = "auto", text_field: str = "text"
) -> tuple[list[Record], str]:
    """The records of `data` (read from `source`, '-' for stdin) and the format they were in."""
    if data.startswith(BOM):
        data = data[len(BOM) :]
    for magic, what, fix in FOREIGN:
        if data.startswith(magic):
            raise InputError(f"{source}: {what}; mlxbatch reads UTF-8 text: {fix}")
    fmt = detect_format(source, data[:4096], fmt, text_field)
    if fmt == "jsonl":
        return _jsonl_rows(data, source), fmt
    if fmt == "csv":
        return _csv_rows(data, text_field, source), fmt
    if fmt == "tsv":
        return _tsv_rows(data, text_field, source), fmt
    return _text_rows(data, text_field), fmt


def detect_format(name: str, head: bytes, fmt: str, text_field: str = "text") -> str:
    """The format named, else by extension, else by content: stdin, and names with another or
    no suffix (`tickets`, `data.jsonl.bak`, `/dev/fd/63` from a shell's `<(...)`), which would
    otherwise classify each JSON line or CSV record as one text and exit 0."""
    if fmt != "auto":
        return fmt
    suffix = Path(name).suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return suffix[1:]
    if suffix == ".txt":
        return "text"
    first = head.lstrip()
    if first.startswith(b"{"):
        return "jsonl"
    header = first.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", "replace")
    if text_field in [h.strip().strip('"') for h in header.split("\t")] and "\t" in header:
        return "tsv"
    if text_field in [h.strip().strip('"') for h in header.split(",")] and "," in header:
        return "csv"
    return "text"


def _lines(data: bytes) -> list[tuple[int, str | None, str | None]]:
    """(line number, text or None, error or None) for each non-blank line."""
    out = []
    for n, raw in enumerate(data.split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as e:
            out.append((n, None, f"bytes that are not UTF-8 at column {e.start + 1}"))
            continue
        if line.strip():
            out.append((n, line, None))
    return out


def _json_object(line: str) -> tuple[dict | None, str | None]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        return None, f"invalid JSON ({e.msg} at column {e.colno})"
    except RecursionError:
        return None, "invalid JSON (nested too deeply)"
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        return None, f"invalid JSON ({str(e).split(';')[0]})"
    if not isinstance(obj, dict):
        return None, f"a JSON {type(obj).__name__}, not an object"
    return obj, None


def _jsonl_rows(data: bytes, source: str) -> list[Record]:
    if data.lstrip().startswith(b"["):
        raise InputError(
            f"{source}: a JSON array; mlxbatch reads JSON Lines (one object per line). "
            "Convert it with: jq -c '.[]' FILE > FILE.jsonl"
        )
    rows = []
    for n, line, err in _lines(data):
        obj, err = (None, err) if err else _json_object(line)
        rows.append((n, n, obj, err))
    return rows


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        bad = [n for n, _, err in _lines(data) if err]
        raise InputError(f"{source}: bytes that are not UTF-8 on line(s) {bad[:20]}") from None


# Inputs that are not UTF-8 text at all, named instead of reported line by line.
FOREIGN = (
    (b"\xff\xfe", "UTF-16 text (byte order mark FF FE)", "iconv -f UTF-16 -t UTF-8 FILE > FILE.utf8"),
    (b"\xfe\xff", "UTF-16 text (byte order mark FE FF)", "iconv -f UTF-16 -t UTF-8 FILE > FILE.utf8"),
    (b"\x1f\x8b", "gzip-compressed", "zcat FILE | mlxbatch classify - ..."),
    (b"PK\x03\x04", "a zip archive (an .xlsx workbook?)", "export or unzip it to CSV or JSONL"),
)  # fmt: skip


def _check_header(header: list[str] | None, text_field: str, source: str, kind: str) -> list[str]:
    if not header or not any(h.strip() for h in header):
        raise InputError(f"{source}: empty file (no {kind} header)")
    header = [h.strip() for h in header]
    if text_field not in header:
        if len(header) == 1 and text_field in [h.strip().strip('"') for h in header[0].split(";")]:
            raise InputError(f"{source}: the {kind} header is separated by ';' ({header[0]!r}); "
                             "save it with commas, or with tabs as .tsv")  # fmt: skip
        raise InputError(
            f"{source}: the {kind} header has no {text_field!r} column (columns: {header}); "
            "use --text-field to name the text column"
        )
    return header


def _csv_rows(data: bytes, text_field: str, source: str) -> list[Record]:
    reader = csv.reader(io.StringIO(_decode(data, source), newline=""), strict=True)
    try:
        header = _check_header(next(reader, None), text_field, source, "CSV")
        rows, n, start = [], 0, reader.line_num + 1
        for rec in reader:
            if rec:  # a blank line is not a row
                n += 1
                if len(rec) != len(header):
                    rows.append((n, start, None, f"{len(rec)} fields where the header has {len(header)}"))  # fmt: skip
                else:
                    rows.append((n, start, dict(zip(header, rec)), None))
            start = reader.line_num + 1
    except csv.Error as e:
        where = f"data row {n + 1}" if "header" in locals() else "the header"
        if "end of data" in str(e) or "EOF" in str(e):
            raise InputError(
                f"{source}: line {start}: a quoted field of {where} is never closed (the "
                "file ends inside quotes); fix the quote or use TSV"
            ) from None
        raise InputError(f"{source}: line {start}: {where} is not valid CSV ({e})") from None
    return rows


def _tsv_rows(data: bytes, text_field: str, source: str) -> list[Record]:
    """Tab-separated values, split on tabs only: quotes are ordinary characters."""
    lines = _decode(data, source).split("\n")
    header = _check_header(lines[0].rstrip("\r").split("\t"), text_field, source, "TSV")
    rows, n = [], 0
    for i, line in enumerate(lines[1:], start=2):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        n += 1
        rec = line.split("\t")
        if len(rec) != len(header):
            rows.append((n, i, None, f"{len(rec)} fields where the header has {len(header)}"))
        else:
            rows.append((n, i, dict(zip(header, rec)), None))
    return rows


def _text_rows(data: bytes, text_field: str) -> list[Record]:
    return [(n, n, None if err else {text_field: line}, err) for n, line, err in _lines(data)]
