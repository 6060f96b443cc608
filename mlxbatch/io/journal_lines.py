"""A journal read back: its header checked to be this run's (saying which fingerprint part
differs), and each line checked to be a row this job's run writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..engine.adjust import Adjustment
from ..errors import ResumeError
from ..runtime.blas import LAYOUT_ENV, TILED
from .ids import JsonNumber
from .questions import questions_change
from .rows import loads

JOURNAL_VERSION = 1


SCORED_FIELDS = {"id", "label", "scores", "abstained", "truncated"}  # rows.result_row's


def journal_entry(
    line: bytes,
    n_rows: int | None = None,
    labels: tuple[str, ...] | None = None,
    min_confidence: float | None = None,
    truncating: bool | None = None,
) -> tuple[int, dict] | str:
    """A journal line's (row index, result row), or why it is not one this job's run writes
    (its label, abstention and truncation must agree with the job's)."""
    try:
        entry = loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError):
        entry = None
    if not isinstance(entry, dict) or set(entry) != {"row", "result"}:
        return "is not a row that mlxbatch wrote"
    row, result = entry["row"], entry["result"]
    if type(row) is not int or row < 0 or (n_rows is not None and row >= n_rows):
        return f"names row {row!r}, not a row of the input (0 to {(n_rows or 1) - 1})"[:200]
    if not isinstance(result, dict) or "id" not in result:
        return "is not a row that mlxbatch wrote"
    if "error" in result:
        if not set(result) <= {"id", "line", "error"} or type(result.get("line", 0)) is not int:
            return "is not a row that mlxbatch wrote"
        return (
            (row, result) if isinstance(result["error"], str) else "has an error that is not text"
        )
    if "answers" in result:
        return _answered(row, result, labels, truncating)
    # what result_row writes, and no more: an edited field never reaches the output
    if extra := sorted(set(result) - SCORED_FIELDS):
        return f"has fields {extra} that mlxbatch does not write"[:200]
    if "truncated" in result and not _written_cut(result["truncated"]):
        return "has a truncation that mlxbatch did not write"
    if "truncated" in result and truncating is False:
        return "is truncated where this run's --too-long does not truncate"
    return _scored(row, result, labels, min_confidence)


def _answered(row: int, result: dict, columns, truncating: bool | None) -> tuple[int, dict] | str:
    """A row of answers as `result_row` writes it, in the job's columns when given."""
    if extra := sorted(set(result) - {"id", "answers", "truncated"}):
        return f"has fields {extra} that mlxbatch does not write"[:200]
    if "truncated" in result and (not _written_cut(result["truncated"]) or truncating is False):
        return "has a truncation that mlxbatch did not write"
    answers = result["answers"]
    if not isinstance(answers, dict) or not all(
        isinstance(a, dict) and isinstance(a.get("scores"), dict) for a in answers.values()
    ):
        return "has answers that mlxbatch did not write"
    names = [f"{q}_{x}" for q, a in answers.items() for x in a["scores"]]
    if columns is not None and names != list(columns):
        return "has answers that are not one per question of this run"
    values = [v for a in answers.values() for v in a["scores"].values()]
    if not all(type(v) in (int, float, JsonNumber) and 0.0 <= v <= 1.0 for v in values):
        return "has a score that is not a finite probability"
    return row, result


def _written_cut(cut) -> bool:
    """A "truncated" as limits.prepare writes it: the token counts before and after."""
    return (
        isinstance(cut, dict)
        and set(cut) == {"from_tokens", "to_tokens"}
        and all(type(v) is int for v in cut.values())
    )


def _scored(
    row: int, result: dict, labels: tuple[str, ...] | None, min_confidence: float | None
) -> tuple[int, dict] | str:
    scores, label = result.get("scores"), result.get("label")
    if not isinstance(scores, dict) or len(scores) < 2 or (labels and list(scores) != list(labels)):
        return "has scores that are not one per label"
    values = list(scores.values())
    if not all(
        type(v) in (int, float, JsonNumber) and 0.0 <= v <= 1.0 for v in values
    ):  # NaN fails too
        return "has a score that is not a finite probability"
    if abs(sum(values) - 1.0) > 1e-3:  # MLX fp32 softmax over 5,000 labels: off by 1.2e-5
        return f"has scores that sum to {sum(values):.6g}, not 1"
    if "abstained" in result and (result["abstained"] is not True or label is not None):
        return "has an abstention that mlxbatch did not write"
    # the journal holds the adjusted scores as floats, exactly: the rule gives the same answer
    abstains = Adjustment(min_confidence=min_confidence).abstains(np.asarray(values))
    if labels and ("abstained" in result) != abstains:
        return (
            f"{'abstains' if 'abstained' in result else 'has a label'} where this run's "
            f"--min-confidence {'(none)' if min_confidence is None else min_confidence} "
            f"{'abstains' if abstains else 'does not'}"
        )
    if label is None and result.get("abstained") is True:
        return row, result
    top = list(scores)[values.index(max(values))]  # the first best, as result_row chooses
    if label != top:
        return f"has the label {label!r} where its top score is {top!r}"[:200]
    return row, result


def checked_head(path: Path, first_line: bytes, header: dict | None) -> dict:
    """The journal's header, checked to be one (and, given this run's `header`, this run's)."""
    try:
        head = json.loads(first_line) if first_line else None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError):
        head = None
    if not isinstance(head, dict) or head.get("mlxbatch_journal") != JOURNAL_VERSION:
        raise ResumeError(f"{path}: not an mlxbatch journal; delete it to start over")
    if header is not None and head.get("fingerprint") != header.get("fingerprint"):
        _check_model(path, head, header)
        _check_questions(path, head.get("questions"), header.get("questions"))
        differ = _differing_parts(head.get("fingerprint"), header.get("fingerprint"))
        differ = differ.replace(PARTS["compute"], _compute_change(head, header))
        raise ResumeError(
            f"{path} was written for a different {differ}; run with what the "
            "first run had, or delete it to start over"
        )
    return head


def _check_model(path: Path, head: dict, header: dict) -> None:
    """Refuse a journal written for another state of the model, naming what changed: a
    resume would mix rows scored under both."""
    old, new = head.get("model"), header.get("model")
    recorded = fingerprint_parts(head.get("fingerprint")).get("model")
    current = fingerprint_parts(header["fingerprint"])
    if not isinstance(new, dict) or recorded in (None, current["model"]):
        return  # the same model, or no fingerprint of parts: the parts' words say what differs
    again = "restore it, or delete the journal to start over"
    if not isinstance(old, dict) or not isinstance(old.get("files"), dict):
        raise ResumeError(
            f"{path} was written by an earlier mlxbatch, which did not record the "
            "model's config and tokenizer files: a resume cannot tell whether "
            "they changed; delete it to start over"
        )
    if old.get("path") != new["path"]:
        raise ResumeError(
            f"the model's path changed since {path} was written "
            f"({str(old.get('path'))[:200]}, now {new['path'][:200]}); run with "
            "the first run's --model, or delete the journal to start over"
        )
    was, now = old["files"], new["files"]
    said = [
        f"{name} {_file_change(was.get(name), now.get(name))}"
        for name in sorted(set(was) | set(now))
        if was.get(name) != now.get(name)
    ]
    if not said and old.get("template") != new.get("template"):
        said = ["chat template (as rendered) changed"]
    what = said[0] if len(said) == 1 else f"files changed ({', '.join(said)})"
    raise ResumeError(f"the model's {what[:300]} since {path} was written; {again}")


def _check_questions(path: Path, old, new) -> None:
    """Refuse a journal written for other questions, naming the questions file and what of
    it changed (a question added or removed, a field of one)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return  # no questions, or a journal that did not record them: the parts' words
    said = questions_change(old, new)
    if said:
        raise ResumeError(
            f"{new.get('file')}: the questions changed since {path} was written "
            f"({'; '.join(said)[:300]}); run with the first run's questions, or delete "
            "the journal to start over"
        )


def _file_change(old, new) -> str:
    return "appeared" if old is None else "was removed" if new is None else "changed"


COMPUTE_WORDS = {
    "blas": "BLAS",
    "kernels": "BLAS kernel family",
    "library": "BLAS library",
    "host_kernels": "host kernels (MLXBATCH_HOST_KERNELS)",
    "device": "device",
    "mlx": "MLX version",
    "prefix_threads": "shared-prefix BLAS threads",
    "layout": f"host-kernel layout ({LAYOUT_ENV})",
}
BEFORE = {"layout": TILED}  # what a journal written before the entry was recorded had


def _compute_change(head: dict, header: dict) -> str:
    """How the recorded compute path and this run's differ, in words."""
    old, new = head.get("compute"), header.get("compute")
    if not isinstance(old, dict) or not isinstance(new, dict):
        return PARTS["compute"]
    words = {True: "on", False: "off", None: "none"}
    old = {**BEFORE, **old}
    said = [
        f"{COMPUTE_WORDS.get(k, k)} {words.get(old.get(k), old.get(k))}, now "
        f"{words.get(new.get(k), new.get(k))}"
        for k in new
        if k != "library" and old.get(k) != new.get(k)
    ]
    if old["layout"] == TILED != new.get("layout"):  # the probe found a faster one here since
        said.append(f"{LAYOUT_ENV}={TILED} resumes it")
    return f"{PARTS['compute']} ({'; '.join(said)})" if said else PARTS["compute"]


PARTS = {
    "model": "model (its files or path)",
    "dtype": "--dtype",
    "input": "input",
    "labels": "labels",
    "prompt": "system prompt or examples",
    "settings": "setting (one of --mode, --planner, --max-tokens, --too-long, "
    "--on-error, --no-prefix-cache)",
    "adjustment": "adjustment (one of --calibrate, --prior, --min-confidence, --tag-threshold)",
    "shape": "batch shape (the journal's recorded settings were edited)",
    "compute": "compute path",
}


def fingerprint_parts(fp) -> dict:
    """A `part=digest` fingerprint (jobs/fingerprint.py) as {part: digest}; {} for anything else."""
    words = fp.split() if isinstance(fp, str) else []
    return dict(w.split("=", 1) for w in words if "=" in w)


def _differing_parts(recorded, current) -> str:
    """Which parts of two `part=digest` fingerprints differ, in words (jobs/fingerprint.py)."""
    old, new = fingerprint_parts(recorded), fingerprint_parts(current)
    if not old or set(old) != set(new):  # a journal from another version of mlxbatch
        return "input, model, labels, prompt or settings (or another version of mlxbatch)"
    differ = [k for k in new if old[k] != new[k]]
    if "shape" in differ and "settings" in differ:  # the shape follows the settings,
        differ.remove("shape")  # not an edit of the journal
    return ", ".join(PARTS.get(k, k) for k in differ)
