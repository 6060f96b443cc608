"""Read and validate input rows (JSONL, CSV, TSV, plain text, stdin), reporting every bad row.

Nothing here loads a model: the whole input is checked first. Each row keeps its number (the
line in JSONL/text files, the data row in CSV/TSV files) and the line it starts on, so errors
and outputs can name it (the formats and their parsers: formats.py). Ids come from
`--id-field`; when it is not given, from an `id` field if the input has one, else they are
the row numbers.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError, unicode_problem
from .formats import parse

FORMATS = ("auto", "jsonl", "csv", "tsv", "text")


@dataclass
class Row:
    number: int  # 1-based line (JSONL, text) or data row (CSV, TSV)
    id: Any  # None when the row's id could not be read
    text: str | None  # None when the row is bad
    error: str | None = None
    line: int = 0  # the physical line the row starts on
    fields: dict = field(default_factory=dict)  # other requested fields (gold labels, ...)


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
    parsed, fmt = parse(read_source(path), path, fmt, text_field)
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
