"""A window's output rows: its error rows, and each scored batch turned into rows and appended
to the sink as one write; `execute` steps a window's scheduler through what the sink lacks."""

from __future__ import annotations

from contextlib import closing

import mlx.core as mx
import numpy as np
from tqdm import tqdm

from ..api.classifier import Classifier
from ..engine.planner import Batch
from ..errors import JobError
from ..io.inputs import Row
from ..io.rows import error_row, result_row
from ..io.sinks import Sink
from ..runtime import testhold
from .plan import JobPlan


def non_finite_error(clf: Classifier) -> str:
    hint = (
        "run with --dtype float32"
        if clf.lm.dtype != mx.float32
        else "check the weights with --check-weights"
    )
    return f"{clf.non_finite()}; {hint}"


def batch_rows(
    clf: Classifier, rows, plan: JobPlan, batch: Batch, probs: np.ndarray, on_error: str
) -> list[tuple[int, dict]]:
    """(input index, row) of one scored batch, by `Classifier.predictions`; non-finite scores
    fail their row, or the job under --on-error fail (after the good rows are kept)."""
    out, bad = [], None
    for scored, said in zip(batch.indices, clf.predictions(probs)):
        finite = bool(np.isfinite(list(said.scores.values())).all())
        for index in (scored, *plan.copies.get(scored, ())):  # duplicates share the result
            row = rows[index]
            if finite:
                out.append(
                    (
                        index,
                        result_row(
                            row.id,
                            said.label,
                            said.scores,
                            plan.extras.get(index),
                            said.abstained,
                            said.answers,
                        ),
                    )
                )
            else:
                bad = bad or row
                out.append((index, error_row(row.id, non_finite_error(clf), row.line)))
    if bad is not None and on_error == "fail":
        raise NonFinite(
            f"line {bad.line}: {non_finite_error(clf)} (finished rows are kept; "
            "--on-error skip writes an error row instead)",
            [x for x in out if "error" not in x[1]],
        )
    return out


class NonFinite(JobError):
    def __init__(self, message: str, good: list):
        super().__init__(message)
        self.good = good


def todo_batches(plan: JobPlan, done) -> list[Batch]:
    """The batches with a row (scored, or a copy of a scored row) that `done` lacks: a batch's
    lines are one write, but a write cut short can keep a scored row and lose its copy."""
    return [b for b in plan.batches if not all(j in done for j in plan.rows_of(b))]


def append_batch(
    clf: Classifier, rows, plan: JobPlan, sink: Sink, batch: Batch, probs: np.ndarray, on_error: str
) -> list[tuple[int, dict]]:
    """One scored batch into the sink; its rows."""
    try:
        out = batch_rows(clf, rows, plan, batch, probs, on_error)
    except NonFinite as e:
        sink.append(e.good)
        raise
    sink.append(out)
    return out


class Window:
    """Rows [start, start + len(rows)) of a job, indexed by input row."""

    def __init__(self, start: int, rows: list[Row]):
        self.start, self.rows = start, rows

    def __getitem__(self, index: int) -> Row:
        return self.rows[index - self.start]

    def ids(self, indices) -> dict:
        return {i: self[i].id for i in indices}


def error_rows(rows, plan: JobPlan, indices) -> list[tuple[int, dict]]:
    """Error rows for the bad rows among `indices` (unreadable, or refused by the plan)."""
    out = []
    for i in indices:
        row = rows[i]
        error = row.error or plan.errors.get(i)
        if error:
            out.append((i, error_row(row.id, error, row.line)))
    return out


def execute(
    clf: Classifier, rows, plan: JobPlan, sink: Sink, on_error: str, bar: tqdm
) -> list[tuple[int, dict]]:
    """Score and append every batch of `plan` not yet in the sink; the rows appended."""
    written = []
    # closed here, not when collected: an interrupt's traceback keeps it alive, and the lanes
    # with it, holding OpenBLAS at one thread for the rest of the process
    with closing(plan.scheduler.step(todo_batches(plan, sink.done))) as scored:
        for n, (batch, probs, _) in enumerate(scored, 1):
            rows_out = append_batch(clf, rows, plan, sink, batch, probs, on_error)
            bar.update(len(rows_out))
            written += rows_out
            testhold.after_batch(n)  # the test seam: a test stops a job here
    return written
