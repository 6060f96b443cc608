"""Read and validate input rows (JSONL, CSV, TSV, plain text, stdin), reporting every bad row.

Nothing here loads a model: the whole input is checked first. Each row keeps its number (the
line in JSONL/text files, the data row in CSV/TSV files) and the line it starts on, so errors
and outputs can name it. A UTF-8 byte-order mark is dropped in every format. Blank lines are
not rows. Ids come from `--id-field`; when it is not given, from an `id` field if the input has
one, else they are the row numbers. The parsers never merge or alter rows silently: a CSV that
ends inside a quoted field is an error naming the row where the quote opened, and TSV is split
on tabs only (no quoting).
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError, unicode_problem

FORMATS = ("auto", "jsonl", "csv", "tsv", "text")
BOM = b"\xef\xbb\xbf"
csv.field_size_limit(2**31 - 1)  # a long ticket is not an error; the token limit decides


@dataclass
class Row:
    number: int  # 1-based line (JSONL, text) or data row (CSV, TSV)
    id: Any  # None when the row's id could not be read
    text: str | None  # None when the row is bad
    error: str | None = None
    line: int = 0  # the physical line the row starts on
    fields: dict = field(default_factory=dict)  # other requested fields (gold labels, ...)


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


def _jsonl_rows(data: bytes, source: str) -> list[tuple[int, int, dict | None, str | None]]:
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


def _csv_rows(
    data: bytes, text_field: str, source: str
) -> list[tuple[int, int, dict | None, str | None]]:
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


def _tsv_rows(
    data: bytes, text_field: str, source: str
) -> list[tuple[int, int, dict | None, str | None]]:
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


def _text_rows(data: bytes, text_field: str) -> list[tuple[int, int, dict | None, str | None]]:
    return [(n, n, None if err else {text_field: line}, err) for n, line, err in _lines(data)]


def read_source(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{path}: a directory, not an input file")
    if not p.exists():
        raise InputError(f"{path}: no such file")
    try:
        return p.read_bytes()
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror})") from None


def read_rows(
    path: str, text_field: str = "text", id_field: str | None = None, fmt: str = "auto",
    fields: tuple[str, ...] = (),
) -> tuple[list[Row], str]:  # fmt: skip
    """All rows of `path` (or '-' for stdin), each valid or carrying its error; and the format.
    `fields`: other columns to keep on each row (absent ones are simply missing)."""
    data = read_source(path)
    if data.startswith(BOM):
        data = data[len(BOM) :]
    for magic, what, fix in FOREIGN:
        if data.startswith(magic):
            raise InputError(f"{path}: {what}; mlxbatch reads UTF-8 text: {fix}")
    fmt = detect_format(path, data[:4096], fmt, text_field)
    if fmt == "jsonl":
        parsed = _jsonl_rows(data, path)
    elif fmt == "csv":
        parsed = _csv_rows(data, text_field, path)
    elif fmt == "tsv":
        parsed = _tsv_rows(data, text_field, path)
    else:
        parsed = _text_rows(data, text_field)
    if not parsed:
        raise InputError(f"{path}: empty input (no rows)")
    explicit_id = id_field is not None
    if not explicit_id and fmt != "text" and any(o and "id" in o for _, _, o, _ in parsed):
        id_field = "id"
    rows, seen = [], {}
    for n, line, obj, err in parsed:
        # ids are row numbers only when the input has no id field: they cannot collide then
        row = Row(n, n if id_field is None else None, None, err, line)
        rows.append(row)
        if obj is None:
            continue
        row.fields = {k: obj[k] for k in fields if k in obj}
        if id_field is not None:
            if id_field not in obj:
                row.error = f"missing id field {id_field!r}"
                continue
            rid = obj[id_field]
            if isinstance(rid, bool) or not isinstance(rid, (str, int, float)):
                row.error = f"id {_short(rid)} is not a string or number"
                continue
            if isinstance(rid, float) and not math.isfinite(rid):
                row.error = f"id {rid} is not a finite number"
                continue
            if isinstance(rid, str) and (problem := unicode_problem(rid)):
                row.error = f"id {_short(rid)} holds {problem}"
                continue
            if rid in seen:
                row.error = f"duplicate id {rid!r} (first at {seen[rid]})"
                continue
            row.id = rid
            seen[rid] = n
        text = obj.get(text_field)
        if text is None:
            row.error = f"missing text field {text_field!r}"
        elif not isinstance(text, str):
            row.error = f"text field {text_field!r} is a {type(text).__name__}, not a string"
        elif not text.strip():
            row.error = "empty text"
        elif problem := unicode_problem(text):
            row.error = f"text holds {problem}"
        else:
            row.text = text
    return rows, fmt


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe_errors(rows: list[Row], source: str, fmt: str, limit: int = 30) -> str:
    """One summary line naming the first bad row, then one indented line per bad row."""
    unit = "row" if fmt in ("csv", "tsv") else "line"
    bad = [r for r in rows if r.error]
    first = bad[0]
    lines = [f"{source}: {len(bad)} of {len(rows)} rows are invalid (first: {unit} "
             f"{first.number}: {first.error})"]  # fmt: skip
    lines += [f"  {source}: {unit} {r.number}: {r.error}" for r in bad[:limit]]
    if len(bad) > limit:
        lines.append(f"  ... and {len(bad) - limit} more")
    return "\n".join(lines)
