"""Bytes to records, streamed one line (or CSV record) at a time: the input format (named, by
extension, else by content) and its parser, which never merges or alters rows silently."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import InputError
from .caps import ROW_BYTES, size
from .ids import JsonNumber
from .sources import BUFFER, peek, read_errors
from .tables import Record, csv_rows, tsv_rows

BOM = b"\xef\xbb\xbf"
HEAD, HEAD_MAX = 1 << 16, 1 << 20  # detection reads this much, more to finish a long header


@dataclass
class Records:
    """A parsed input: its format, its header (CSV, TSV, Parquet; None otherwise), its records."""

    format: str
    columns: list[str] | None
    records: Iterator[Record]


def parse(
    stream: BinaryIO, source: str, name: str, fmt: str = "auto", text_field: str = "text"
) -> Records:
    """The records of `stream`, lazily (`name` without a compression suffix); a file-level
    problem is raised here or, past the first lines, when iteration reaches it."""
    size = HEAD
    try:
        head, stream = peek(stream, size)
        while len(head) == size < HEAD_MAX and not re.search(rb"[\r\n]", head):
            size *= 4  # a header of hundreds of columns: read on to its end
            head, stream = peek(stream, size)
    except read_errors() as e:
        raise InputError(
            f"{source}: the data cannot be read ({e}); is the file cut short or corrupt?"
        ) from None
    at_end = len(head) < size
    if head.startswith(BOM):
        head = head[len(BOM) :]
        stream.read(len(BOM))
    for magic, what, fix in FOREIGN:
        if head.startswith(magic):
            raise InputError(f"{source}: {what}; mlxbatch reads UTF-8 text: {fix}")
    detected = detect_format(name, head, fmt, text_field, at_end)
    by_content = fmt == "auto" and Path(name).suffix.lower() not in SUFFIXES
    lines = _raw_lines(stream, b"\r" in head and b"\n" not in head, source)
    if detected == "jsonl":
        if re.match(rb"\s*\[", head):
            raise InputError(
                f"{source}: a JSON array; mlxbatch reads JSON Lines (one object per line). "
                "Convert it with: jq -c '.[]' FILE > FILE.jsonl"
            )
        return Records("jsonl", None, _jsonl_rows(lines))
    if detected in ("csv", "tsv"):
        reader = csv_rows if detected == "csv" else tsv_rows
        header, records = reader(lines, text_field, source, by_content)
        return Records(detected, header, records)
    return Records("text", None, _text_rows(lines, text_field))


SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".txt": "text",
}


def detect_format(
    name: str, head: bytes, fmt: str, text_field: str = "text", at_end: bool = False
) -> str:
    """The format named, else by extension, else by content (stdin, `tickets`, `/dev/fd/63`): a
    first line is a CSV/TSV header when it names the text field, or holds two or more distinct
    column names and the next lines have as many fields (`at_end`: `head` is the whole input)."""
    if fmt != "auto":
        return fmt
    suffix = Path(name).suffix.lower()
    if suffix in SUFFIXES:
        return SUFFIXES[suffix]
    first = head.lstrip()
    if first.startswith(b"{") or re.match(rb"\[\s*[\[{]", first):
        return "jsonl"
    text = first.decode("utf-8", "replace")
    lines = re.split("\r\n|\n|\r", text)
    if not at_end:
        lines = lines[:-1]  # the last may be cut short
    if _tabular(lines, "\t", text_field):
        return "tsv"
    if _tabular(lines, ",", text_field):
        return "csv"
    return "text"


_NAME = re.compile(r"[\w.\-/#()]+( [\w.\-/#()]+){0,2}")


def _tabular(lines: list[str], sep: str, text_field: str) -> bool:
    if lines and lines[0].strip().strip('"') == text_field:
        return sep == ","  # a one-column CSV
    if not lines or sep not in lines[0]:
        return False
    sample = lines[:50]
    if sep == "\t":  # blank lines are no records, as csv.reader has them: else a TSV's final
        records = [line.split("\t") for line in sample if line]  # newline made it text
    else:
        records = []
        try:
            records.extend(csv.reader(sample))
        except csv.Error:
            records = records[:-1]
    if len(lines) > len(sample):
        records = records[:-1]  # its quoted field may go on past the sample
    names = [h.strip().strip('"') for h in records[0]] if records else []
    if text_field in names:
        return True
    data = [r for r in records[1:] if r]
    return (
        len(names) >= 2
        and len(set(names)) == len(names)
        and bool(data)
        and all(_NAME.fullmatch(h) and any(c.isalpha() for c in h) for h in records[0])
        and all(len(r) == len(names) for r in data)
    )


def _raw_lines(stream: BinaryIO, cr_only: bool, source: str) -> Iterator[bytes]:
    """The lines of `stream`, each with its line end; a failed read names the line."""
    n = 0
    try:
        if not cr_only:
            while raw := stream.readline(ROW_BYTES + 1):  # capped: /dev/zero has no line end
                n += 1
                _check_length(raw, n, source)
                yield raw
            return
        rest = b""
        while chunk := stream.read(BUFFER):
            *lines, rest = (rest + chunk).split(b"\r")
            for raw in lines:
                n += 1
                _check_length(raw, n, source)
                yield raw + b"\r"
            _check_length(rest, n + 1, source)
        if rest:
            yield rest
    except read_errors() as e:
        raise InputError(
            f"{source}: line {n + 1}: the data cannot be read ({e}); is the file "
            "cut short or corrupt?"
        ) from None


def _check_length(raw: bytes, n: int, source: str) -> None:
    if len(raw) > ROW_BYTES:
        raise InputError(
            f"{source}: line {n}: longer than {size(ROW_BYTES)}, the cap on one "
            "line (is it a text file?)"
        )


def _decoded(raw: bytes) -> tuple[str | None, str | None]:
    try:
        return raw.decode("utf-8").rstrip("\n").rstrip("\r"), None
    except UnicodeDecodeError as e:
        return None, f"bytes that are not UTF-8 at column {e.start + 1}"


class _RepeatedKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_float=JsonNumber)


def json_kind(x) -> str:
    """A value's kind in JSON's words ("a number", "null")."""
    kinds = {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
        int: "a number",
        float: "a number",
    }
    return kinds.get(type(x), f"a {type(x).__name__}")


def _json_object(line: str) -> tuple[dict | None, str | None]:
    try:
        obj = _DECODER.decode(line)
    except _RepeatedKey as e:
        return None, f"the key {e.args[0]!r} appears twice in one JSON object"
    except json.JSONDecodeError as e:
        # (json's "Invalid control character at" already ends in "at")
        return None, f"invalid JSON ({e.msg.removesuffix(' at')} at column {e.colno})"
    except RecursionError:
        return None, "invalid JSON (nested too deeply)"
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        return None, f"invalid JSON ({str(e).split(';')[0]})"
    if not isinstance(obj, dict):
        return None, f"not a JSON object but {json_kind(obj)}"
    return obj, None


def _jsonl_rows(lines: Iterator[bytes]) -> Iterator[Record]:
    for n, raw in enumerate(lines, 1):
        line, err = _decoded(raw)
        if err:
            yield n, n, None, err
        elif line.strip():
            obj, err = _json_object(line)
            yield n, n, obj, err


def _text_rows(lines: Iterator[bytes], text_field: str) -> Iterator[Record]:
    for n, raw in enumerate(lines, 1):
        line, err = _decoded(raw)
        if err or line.strip():
            yield n, n, None if err else {text_field: line}, err


# Inputs that are not UTF-8 text at all, named instead of reported line by line.
FOREIGN = (
    (
        b"\xff\xfe",
        "UTF-16 text (byte order mark FF FE)",
        "iconv -f UTF-16 -t UTF-8 FILE > FILE.utf8",
    ),
    (
        b"\xfe\xff",
        "UTF-16 text (byte order mark FE FF)",
        "iconv -f UTF-16 -t UTF-8 FILE > FILE.utf8",
    ),
    (b"PK\x03\x04", "a zip archive (an .xlsx workbook?)", "export or unzip it to CSV or JSONL"),
)
