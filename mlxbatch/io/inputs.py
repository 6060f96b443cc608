"""Read and validate input rows (JSONL, CSV, plain text, stdin), reporting every bad row.

Nothing here loads a model: the whole input is checked first. Each row keeps its number
(the line in JSONL/text files, the data row in CSV files) so errors and outputs can name it.
Whitespace-only lines in JSONL and text files are not rows. Ids come from `--id-field`; when
it is not given, from an `id` field if the input has one, else they are the row numbers.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError

FORMATS = ("auto", "jsonl", "csv", "text")


@dataclass
class Row:
    number: int  # 1-based line (JSONL, text) or data row (CSV)
    id: Any
    text: str | None  # None when the row is bad
    error: str | None = None


def detect_format(name: str, head: bytes, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    suffix = Path(name).suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return "csv"
    if name == "-" and head.lstrip().startswith(b"{"):
        return "jsonl"
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


def _jsonl_rows(data: bytes, text_field: str) -> list[tuple[int, dict | None, str | None]]:
    rows = []
    for n, line, err in _lines(data):
        if err:
            rows.append((n, None, err))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            rows.append((n, None, f"invalid JSON ({e.msg} at column {e.colno})"))
            continue
        if not isinstance(obj, dict):
            rows.append((n, None, f"a JSON {type(obj).__name__}, not an object"))
            continue
        rows.append((n, obj, None))
    return rows


def _csv_rows(
    data: bytes, text_field: str, source: str
) -> list[tuple[int, dict | None, str | None]]:
    try:
        decoded = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        bad = [n for n, _, err in _lines(data) if err]
        raise InputError(f"{source}: bytes that are not UTF-8 on line(s) {bad[:20]}") from None
    delim = "\t" if source.lower().endswith(".tsv") else ","
    reader = csv.reader(io.StringIO(decoded, newline=""), delimiter=delim)
    header = next(reader, None)
    if not header:
        raise InputError(f"{source}: empty file (no CSV header)")
    header = [h.strip() for h in header]
    if text_field not in header:
        raise InputError(
            f"{source}: the CSV header has no {text_field!r} column (columns: {header}); "
            "use --text-field to name the text column"
        )
    rows = []
    for n, rec in enumerate(reader, start=1):
        if not any(x.strip() for x in rec):
            rows.append((n, None, "empty CSV row"))
        elif len(rec) != len(header):
            rows.append((n, None, f"{len(rec)} fields where the header has {len(header)}"))
        else:
            rows.append((n, dict(zip(header, rec)), None))
    return rows


def _text_rows(data: bytes, text_field: str) -> list[tuple[int, dict | None, str | None]]:
    return [(n, None if err else {text_field: line}, err) for n, line, err in _lines(data)]


def read_rows(
    path: str, text_field: str = "text", id_field: str | None = None, fmt: str = "auto"
) -> tuple[list[Row], str]:
    """All rows of `path` (or '-' for stdin), each valid or carrying its error; and the format."""
    if path == "-":
        data = sys.stdin.buffer.read()
    else:
        p = Path(path)
        if not p.is_file():
            raise InputError(f"{path}: no such file")
        data = p.read_bytes()
    fmt = detect_format(path, data[:64], fmt)
    if fmt == "jsonl":
        parsed = _jsonl_rows(data, text_field)
    elif fmt == "csv":
        parsed = _csv_rows(data, text_field, path)
    else:
        parsed = _text_rows(data, text_field)
    if not parsed:
        raise InputError(f"{path}: empty input (no rows)")
    explicit_id = id_field is not None
    if not explicit_id and fmt != "text" and any(o and "id" in o for _, o, _ in parsed):
        id_field = "id"
    rows, seen = [], {}
    for n, obj, err in parsed:
        row = Row(n, n, None, err)
        rows.append(row)
        if obj is None:
            continue
        if id_field is not None:
            if id_field not in obj:
                row.error = f"missing id field {id_field!r}"
                continue
            rid = obj[id_field]
            if isinstance(rid, bool) or not isinstance(rid, (str, int, float)):
                row.error = f"id {rid!r} is not a string or number"
                continue
            row.id = rid
            if rid in seen:
                row.error = f"duplicate id {rid!r} (first at {seen[rid]})"
                continue
            seen[rid] = n
        text = obj.get(text_field)
        if text is None:
            row.error = f"missing text field {text_field!r}"
        elif not isinstance(text, str):
            row.error = f"text field {text_field!r} is a {type(text).__name__}, not a string"
        elif not text.strip():
            row.error = "empty text"
        else:
            row.text = text
    return rows, fmt


def describe_errors(rows: list[Row], source: str, fmt: str, limit: int = 30) -> str:
    unit = "row" if fmt == "csv" else "line"
    bad = [r for r in rows if r.error]
    lines = [f"{source}: {unit} {r.number}: {r.error}" for r in bad[:limit]]
    if len(bad) > limit:
        lines.append(f"... and {len(bad) - limit} more")
    lines.append(f"{len(bad)} of {len(rows)} rows are invalid")
    return "\n".join(lines)
