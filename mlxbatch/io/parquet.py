"""Parquet input (the optional `pyarrow`), one record batch at a time, only the columns a run
uses; standard input is read whole (Parquet keeps its index at the end)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import BinaryIO

from ..errors import InputError
from .formats import Record, Records

BATCH_ROWS = 8192


def parse_parquet(
    stream: BinaryIO, source: str, text_field: str, id_field: str | None, fields: tuple[str, ...]
) -> Records:
    if importlib.util.find_spec("pyarrow") is None:
        raise InputError(
            f"{source}: a Parquet file; reading it needs pyarrow: pip install 'mlxbatch[parquet]'"
        )
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        data = pa.BufferReader(stream.read()) if source == "-" else source
        f = pq.ParquetFile(data)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{source}: not a readable Parquet file ({e})") from None
    columns = f.schema_arrow.names
    first: dict[str, int] = {}
    for i, name in enumerate(columns, 1):
        if name in first:
            raise InputError(
                f"{source}: the Parquet file repeats the column {name!r} (columns "
                f"{first[name]} and {i}); rename one"
            )
        first[name] = i
    if text_field not in columns:
        shown = columns if len(columns) <= 20 else [*columns[:20], f"... {len(columns)} in all"]
        raise InputError(
            f"{source}: the Parquet file has no {text_field!r} column (columns: "
            f"{shown}); use --text-field to name the text column"
        )
    wanted = [c for c in columns if c in (text_field, id_field or "id", *fields)]
    return Records("parquet", columns, _records(f, wanted, source))


def _records(f, columns: list[str], source: str) -> Iterator[Record]:
    import pyarrow as pa

    n = 0
    try:
        for batch in f.iter_batches(batch_size=BATCH_ROWS, columns=columns):
            for obj in batch.to_pylist():
                n += 1
                yield n, n, obj, None
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{source}: row {n + 1}: the Parquet data cannot be read ({e})") from None
