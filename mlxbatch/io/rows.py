"""The output rows (scored, error) and their writing in the format the output's name says:
strict JSONL, or CSV/TSV with one score column a label (TSV unquoted, so a tab is refused)."""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from ..engine.questions import AnswerColumns, Questions
from ..errors import OutputError
from .ids import JsonNumber
from .streams import is_stream

OUTPUT_SUFFIXES = (".jsonl", ".jsonl.gz", ".csv", ".csv.gz", ".tsv", ".tsv.gz")
_KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv"}
# Suffixes of formats mlxbatch does not write: refused rather than filled with JSONL.
FOREIGN_SUFFIXES = {
    ".json",
    ".parquet",
    ".pq",
    ".xlsx",
    ".xlsm",
    ".xls",
    ".ods",
    ".txt",
    ".text",
    ".xml",
    ".yaml",
    ".yml",
    ".html",
    ".htm",
    ".md",
    ".arrow",
    ".feather",
    ".orc",
    ".avro",
    ".pkl",
    ".pickle",
    ".npy",
    ".npz",
    ".h5",
    ".hdf5",
    ".sqlite",
    ".db",
    ".zst",
    ".bz2",
    ".xz",
    ".zip",
    ".tar",
    ".tgz",
    ".7z",
    ".pdf",
    ".doc",
    ".docx",
    ".png",
    ".svg",
    ".jpg",
    ".jpeg",
    # model weights, tokenizers and code: an output must never replace them
    ".safetensors",
    ".gguf",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".onnx",
    ".model",
    ".jinja",
    ".py",
    ".sh",
    ".js",
    ".c",
    ".h",
    ".cpp",
    ".rs",
    ".go",
    ".java",
    ".toml",
    ".ini",
    ".cfg",
}


def output_format(name: str) -> tuple[str, bool]:
    """("jsonl" | "csv" | "tsv", gzip-compressed) for an output `name`, by its suffix (none or
    an unknown one: JSONL); a suffix of a format mlxbatch does not write is refused."""
    suffixes = [x.lower() for x in Path(name).suffixes]
    compressed = bool(suffixes) and suffixes[-1] == ".gz"
    suffix = (suffixes[-2] if len(suffixes) > 1 else "") if compressed else (suffixes or [""])[-1]
    if suffix in _KINDS:
        return _KINDS[suffix], compressed
    if compressed or suffix in FOREIGN_SUFFIXES:
        raise OutputError(
            f"{name}: mlxbatch writes {', '.join(OUTPUT_SUFFIXES)} (or a name "
            f"without a suffix, as JSONL), not {''.join(suffixes[-2:])}"
        )
    return "jsonl", False


def output_format_of(path: Path) -> tuple[str, bool]:
    """`output_format` of a path, refusing also a link to a target not named as an output."""
    fmt = output_format(str(path))
    if os.path.islink(path) and not is_stream(path):  # /dev/stdout into a redirect is no file
        real = os.path.realpath(path)
        try:
            output_format(real)
        except OutputError:
            raise OutputError(
                f"{path} links to {real}, which is not an output mlxbatch "
                f"writes ({', '.join(OUTPUT_SUFFIXES)}, or a name without a "
                "suffix); choose another path"
            ) from None
    return fmt


def dumps(obj: Any) -> str:
    """Strict JSON; a number read as `JsonNumber` is written back as it was given."""
    held: list[str] = []
    text = json.dumps(_held(obj, held), ensure_ascii=False, allow_nan=False)
    for i, number in enumerate(held):
        text = text.replace(f'"{_HOLD}{i}{_HOLD}"', number, 1)
    return text


_HOLD = "\ue000"  # a private-use character around each placeholder's index


def _held(obj: Any, held: list[str]) -> Any:
    """`obj` with each JsonNumber swapped for a numbered placeholder string (its text in `held`)."""
    if isinstance(obj, JsonNumber):
        held.append(obj.text)
        return f"{_HOLD}{len(held) - 1}{_HOLD}"
    if isinstance(obj, dict):
        return {k: _held(v, held) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_held(v, held) for v in obj]
    return obj


def loads(text: str | bytes) -> Any:
    """`json.loads`, numbers with a fraction or exponent kept as written (`dumps` writes them)."""
    return json.loads(text, parse_float=JsonNumber)


def result_row(
    rid: Any,
    label: str | None,
    scores: dict[str, float],
    extra: dict | None = None,
    abstained: bool = False,
    answers: dict | None = None,
) -> dict:
    """A scored row (`"label": null, "abstained": true` when abstaining; `answers` alone)."""
    if answers is not None:
        return {"id": rid, "answers": answers, **(extra or {})}
    if abstained:
        return {"id": rid, "label": None, "abstained": True, "scores": scores, **(extra or {})}
    return {"id": rid, "label": label, "scores": scores, **(extra or {})}


def error_row(rid: Any, message: str, line: int | None = None) -> dict:
    """A row that could not be scored: its id (None when unreadable), its input line, why."""
    return {"id": rid, **({"line": line} if line else {}), "error": message}


def read_results(path: Path, questions: Questions | None = None) -> list[dict]:
    """The rows of a `classify` output (a table's ids as text); OSError or ValueError if not.
    `questions`: those of a `--questions` output, whose table has a column each."""
    from .sources import open_source

    kind = results_format(path)
    source = open_source(str(path))
    try:
        if kind == "jsonl":
            return [loads(line) for line in source.stream if line.strip()]
        text = io.TextIOWrapper(source.stream, encoding="utf-8", newline="")
        if questions is not None:
            return _answers_results(text, kind, AnswerColumns.of(questions))
        return _table_results(text, kind)
    except (EOFError, zlib.error) as e:
        raise ValueError(f"cut short or corrupt ({e})") from None
    finally:
        source.close()


def results_format(path: Path) -> str:
    """The format an output named `path` was written in: "jsonl", "csv" or "tsv"."""
    try:
        return output_format(str(path))[0]
    except OutputError:
        return "jsonl"  # a name of another format: read as JSONL, refused by its content


def _table_results(text: TextIO, kind: str) -> list[dict]:
    """A CSV/TSV output's rows as the JSONL rows they were written from (`_result_table`)."""
    lines = _table_lines(text, kind)
    header = next(lines, None)
    if not header or header[:2] != ["id", "label"] or "error" not in header:
        raise ValueError(f"the header is not that of a {kind.upper()} output ({header!r:.80})")
    at = header.index("error")
    labels = [h.removeprefix("score_") for h in header[2:at]]

    def scored(cells: list[str]) -> dict:
        scores = {x: float(v) for x, v in zip(labels, cells[2:at])}
        return {"label": cells[1] or None, "scores": scores}

    return _table_rows(lines, header, at, scored)


def _answers_results(text: TextIO, kind: str, columns: AnswerColumns) -> list[dict]:
    """A CSV/TSV output of questions' rows as the JSONL rows they were written from
    (`_answers_table`): an empty label with finite scores is an abstention."""
    lines = _table_lines(text, kind)
    header = next(lines, None)
    names = [name for name, _ in columns.questions]
    if not header or header[: 1 + len(names) + len(columns)] != ["id", *names, *columns]:
        raise ValueError(
            f"the header is not that of a {kind.upper()} output of these questions ({header!r:.80})"
        )
    at = header.index("error", 1 + len(names) + len(columns))

    def scored(cells: list[str]) -> dict:
        scores = iter(float(v) for v in cells[1 + len(names) : at])
        return {
            "answers": {
                name: _answer(said, {x: next(scores) for x in xs}, name in columns.multi)
                for said, (name, xs) in zip(cells[1 : 1 + len(names)], columns.questions)
            }
        }

    return _table_rows(lines, header, at, scored)


def _table_rows(lines, header: list[str], at: int, scored) -> list[dict]:
    """A table output's rows: the id, an error (column `at`) or what `scored` reads from the
    cells, then the extra columns after the error (JSON each)."""
    out = []
    for cells in lines:
        if len(cells) != len(header):
            raise ValueError(f"row {len(out) + 1}: {len(cells)} cells for {len(header)} columns")
        row: dict = {"id": cells[0] or None}
        if cells[at]:
            row["error"] = cells[at]
        else:
            row |= scored(cells)
        row |= {k: json.loads(v) for k, v in zip(header[at + 1 :], cells[at + 1 :]) if v}
        out.append(row)
    return out


def _answer(said: str, scores: dict, multi: bool) -> dict:
    """One question's answer from its cell: a multi-label question's tags joined by `;`, or
    a label (or none)."""
    if multi:
        return {"labels": said.split(";") if said else [], "scores": scores}
    if said:
        return {"label": said, "scores": scores}
    if all(math.isfinite(v) for v in scores.values()):
        return {"label": None, "abstained": True, "scores": scores}
    return {"label": None, "scores": scores}


def _table_lines(text: TextIO, kind: str):
    return csv.reader(text) if kind == "csv" else (x.rstrip("\r\n").split("\t") for x in text)


def text_id(value) -> str:
    """An id as a CSV/TSV output writes it."""
    return (
        value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)
    )


def write_rows(f: TextIO, rows: Iterable[dict], labels: tuple[str, ...], name: str) -> None:
    """`rows` to `f` in the format of the output `name` ("" for JSONL); gzip needs `f.buffer`.
    JSONL streams `rows`; a CSV/TSV table holds them all, for its columns and id checks."""
    kind, compressed = output_format(name) if name else ("jsonl", False)
    if kind == "jsonl":
        write = lambda out: out.writelines(dumps(r) + "\n" for r in rows)  # noqa: E731
    else:
        rows = list(rows)
        header, table = _result_table(rows, labels)
        _check_text_ids(rows, name, kind)
        write = lambda out: _write_table(out, header, table, kind, name)  # noqa: E731
    _write(f, write, compressed)


def write_records(f: TextIO, records: list[dict], name: str) -> None:
    """Records with the first one's keys to `f` in the format of `name`."""
    kind, compressed = output_format(name)
    if kind == "jsonl":
        write = lambda out: out.writelines(dumps(r) + "\n" for r in records)  # noqa: E731
    else:
        header = list(records[0]) if records else []
        table = ([r.get(k, "") for k in header] for r in records)
        write = lambda out: _write_table(out, header, table, kind, name)  # noqa: E731
    _write(f, write, compressed)


def _write(f: TextIO, write, compressed: bool) -> None:
    if not compressed:
        write(f)
        return
    f.flush()  # mtime 0: the same rows give the same bytes
    with gzip.GzipFile(fileobj=f.buffer, mode="wb", mtime=0, filename="") as z:
        text = io.TextIOWrapper(z, encoding="utf-8", newline="")
        write(text)
        text.flush()
        text.detach()  # closing the GzipFile writes its end; `f` stays open


def _result_table(rows: list[dict], labels: tuple[str, ...]):
    if isinstance(labels, AnswerColumns):
        return _answers_table(rows, labels)
    extras = sorted({k for r in rows for k in r} - {"id", "label", "scores", "error"})
    header = ["id", "label", *(f"score_{x}" for x in labels), "error", *extras]
    table = (
        [
            "" if r["id"] is None else r["id"],
            "" if r.get("label") is None else r["label"],
            *((r.get("scores") or {}).get(x, "") for x in labels),
            r.get("error", ""),
            *(dumps(r[k]) if k in r else "" for k in extras),
        ]
        for r in rows
    )
    return header, table


def _answers_table(rows: list[dict], columns: AnswerColumns):
    """A column per question (its label, or its tags joined by `;`), then a score column per
    label or tag (`question_label`), then the error and any extra field."""
    extras = sorted({k for r in rows for k in r} - {"id", "answers", "error"})
    names = [name for name, _ in columns.questions]
    header = ["id", *names, *columns, "error", *extras]

    def cells(r: dict) -> list:
        answers = r.get("answers") or {}
        said = []
        for name in names:
            a = answers.get(name) or {}
            said.append(";".join(a["labels"]) if "labels" in a else a.get("label") or "")
        scores = [
            ((answers.get(name) or {}).get("scores") or {}).get(x, "")
            for name, xs in columns.questions
            for x in xs
        ]
        return [
            "" if r["id"] is None else r["id"],
            *said,
            *scores,
            r.get("error", ""),
            *(dumps(r[k]) if k in r else "" for k in extras),
        ]

    return header, (cells(r) for r in rows)


def _check_text_ids(rows: list[dict], name: str, kind: str) -> None:
    """Refuse ids 1 and "1" together: two in JSONL, one in CSV/TSV text."""
    seen: dict[str, Any] = {}
    for n, r in enumerate(rows, 1):
        if r["id"] is None:
            continue
        key = r["id"] if isinstance(r["id"], str) else repr(r["id"])
        if key in seen and seen[key] != r["id"]:
            raise OutputError(
                f"{name}: ids {seen[key]!r} and {r['id']!r} (row {n}) would both be "
                f"written as {key} in {kind.upper()}; write .jsonl to keep them "
                "apart"
            )
        seen[key] = r["id"]


def _write_table(out: TextIO, header: list[str], table, kind: str, name: str) -> None:
    if kind == "csv":
        w = csv.writer(out)
        w.writerow(header)
        w.writerows(table)
        return
    for n, values in enumerate([header, *table]):
        cells = [text_id(v) for v in values]
        for column, cell in zip(header, cells):
            if "\t" in cell or "\n" in cell or "\r" in cell:
                where = "the header" if n == 0 else f"row {n}"
                raise OutputError(
                    f"{name}: {where}, column {column!r}: a tab or line break, "
                    "which TSV (no quoting) cannot hold; write .csv or .jsonl"
                )
        out.write("\t".join(cells) + "\n")
