"""The output rows: a scored row, an error row, and how rows are written (strict JSONL, or
CSV/TSV with one score column a label)."""

from __future__ import annotations

import csv
import json
from typing import Any, TextIO


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)


def result_row(
    rid: Any, labels: tuple[str, ...], probs, extra: dict | None = None, abstained: bool = False
) -> dict:
    """A scored row; an abstaining one keeps its scores with `"label": null, "abstained": true`."""
    scores = {name: float(p) for name, p in zip(labels, probs)}
    if abstained:
        return {"id": rid, "label": None, "abstained": True, "scores": scores, **(extra or {})}
    best = max(range(len(labels)), key=lambda j: probs[j])
    return {"id": rid, "label": labels[best], "scores": scores, **(extra or {})}


def error_row(rid: Any, message: str, line: int | None = None) -> dict:
    """A row that could not be scored: its id (None when unreadable), its input line, why."""
    return {"id": rid, **({"line": line} if line else {}), "error": message}


def write_rows(f: TextIO, rows: list[dict], labels: tuple[str, ...], suffix: str) -> None:
    if suffix.lower() in (".csv", ".tsv"):
        extras = sorted({k for r in rows for k in r} - {"id", "label", "scores", "error"})
        w = csv.writer(f, delimiter="\t" if suffix.lower() == ".tsv" else ",")
        w.writerow(["id", "label", *(f"score_{x}" for x in labels), "error", *extras])
        for r in rows:
            s = r.get("scores") or {}
            label = r.get("label")
            w.writerow(["" if r["id"] is None else r["id"], "" if label is None else label,
                        *(s.get(x, "") for x in labels), r.get("error", ""),
                        *(dumps(r[k]) if k in r else "" for k in extras)])  # fmt: skip
    else:
        for r in rows:
            f.write(dumps(r) + "\n")
