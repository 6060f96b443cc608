"""A classification job over a file: plan (`plan.py`), open the sink, execute, verify, report.

`run_job` is the handful of steps; the scheduler scores the planned batches through the
lanes, and a journal-backed sink makes every finished batch durable.
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np
from tqdm import tqdm

from ..api.classifier import Classifier
from ..api.spec import RunSpec
from ..engine.planner import Batch
from ..engine.scheduler import Scheduler
from ..errors import JobError
from ..io.inputs import Row, describe_errors
from ..io.outputs import open_stream, output_kind
from ..io.rows import error_row, result_row
from ..io.sinks import Journal, Sink, recorded_header
from ..runtime import testhold
from .fingerprint import fingerprint
from .plan import JobPlan, plan_job


@dataclass
class JobResult:
    rows: int
    scored: int
    errors: int
    seconds: float
    padding_overhead: float
    batch_tokens: int
    peak_memory: int
    memory_bound: int
    verify: dict | None = field(default=None)
    planner: str = ""
    predicted_seconds: float | None = None
    results: list[dict] = field(default_factory=list, repr=False)  # output rows, input order
    abstained: int = 0
    ranks: list[dict] = field(default_factory=list)  # per rank: host, items, padded, seconds

    def summary(self) -> str:
        rate = self.scored / self.seconds if self.seconds else 0.0
        return (
            f"{self.rows} rows ({self.scored} scored, {self.errors} errors) in "
            f"{self.seconds:.1f} s, {rate:.2f} items/s, padding overhead "
            f"{self.padding_overhead:.1%}, batch tokens {self.batch_tokens}, peak memory "
            f"{self.peak_memory / 2**30:.2f} GiB (bound {self.memory_bound / 2**30:.2f} GiB)"
            + (f"; planner {self.planner}" if self.planner else "")
            + (f", predicted {self.predicted_seconds:.1f} s" if self.predicted_seconds else "")
            + (f"; {self.abstained} abstained" if self.abstained else "")
            + "".join(self._rank_lines())
        )

    def _rank_lines(self):
        if not self.ranks:
            return
        total = sum(r["padded_tokens"] for r in self.ranks) or 1
        slowest = min(r["items"] / r["seconds"] for r in self.ranks if r["seconds"]) if any(
            r["seconds"] for r in self.ranks) else 0.0  # fmt: skip
        for r in self.ranks:
            rate = r["items"] / r["seconds"] if r["seconds"] else 0.0
            yield (f"\n  rank {r['rank']} ({r['host']}): {r['items']} items, {rate:.2f} items/s "
                   f"while computing, {r['padded_tokens'] / total:.0%} of the padded tokens")  # fmt: skip
        if slowest:
            overall = self.scored / self.seconds
            yield (f"\n  {len(self.ranks)} ranks: {overall:.2f} items/s overall, "
                   f"{overall / slowest:.2f}x the slowest rank alone")  # fmt: skip


def open_sink(
    clf: Classifier, n_rows: int, output: Path | None, header: dict, resume: bool
) -> Sink:
    if output is None or output_kind(output) != "file":
        return open_stream(output or Path("-"), n_rows, clf.labels.names, header)
    return Journal(output, header, resume)


def non_finite_error(clf: Classifier) -> str:
    dtype = str(clf.lm.dtype).split(".")[-1]
    hint = ("run with --dtype float32" if dtype != "float32"
            else "check the weights with --check-weights")  # fmt: skip
    return f"the model gave non-finite scores (NaN/inf) in {dtype}; {hint}"


def batch_rows(
    clf: Classifier, rows: list[Row], plan: JobPlan, batch: Batch, probs: np.ndarray, on_error: str
) -> list[tuple[int, dict]]:
    """Output rows of one scored batch (input index, row); non-finite scores fail their row,
    or the job under --on-error fail (after the batch's good rows are kept)."""
    out, bad = [], None
    for index, p in zip(batch.indices, clf.adjust.apply(probs)):
        row = rows[index]
        if np.isfinite(p).all():
            out.append((index, result_row(row.id, clf.labels.names, p, plan.extras.get(index),
                                          clf.adjust.abstains(p))))  # fmt: skip
        else:
            bad = bad or row
            out.append((index, error_row(row.id, non_finite_error(clf), row.line)))
    if bad is not None and on_error == "fail":
        raise NonFinite(f"line {bad.line}: {non_finite_error(clf)} (finished rows are kept; "
                        "--on-error skip writes an error row instead)", [x for x in out if "error" not in x[1]])  # fmt: skip
    return out


class NonFinite(JobError):
    def __init__(self, message: str, good: list):
        super().__init__(message)
        self.good = good


def todo_batches(plan: JobPlan, done: dict) -> list[Batch]:
    return [b for b in plan.batches if any(i not in done for i in b.indices)]


def progress_bar(plan: JobPlan, todo: list[Batch]) -> tqdm:
    bar = tqdm(
        total=len(plan.prompts), unit="item", file=sys.stderr, disable=None, dynamic_ncols=True
    )
    bar.update(len(plan.prompts) - sum(len(b.indices) for b in todo))
    return bar


def scheduler_for(clf: Classifier, plan: JobPlan, batches: list[Batch]) -> Scheduler:
    """A scheduler holding the items of `batches`, under the plan's policy."""
    scheduler = Scheduler(clf.engine, plan.policy)
    for b in batches:
        for i in b.indices:
            scheduler.add(i, plan.prompts[i])
    return scheduler


def append_batch(clf: Classifier, rows: list[Row], plan: JobPlan, sink: Sink, batch: Batch,
                 probs: np.ndarray, on_error: str) -> None:  # fmt: skip
    """One scored batch into the sink; non-finite rows are kept as far as they are good."""
    try:
        sink.append(batch_rows(clf, rows, plan, batch, probs, on_error))
    except NonFinite as e:
        sink.append(e.good)
        raise


def execute(clf: Classifier, rows: list[Row], plan: JobPlan, sink: Sink, on_error: str) -> None:
    """Score every batch not yet in the sink, appending each as it completes."""
    todo = todo_batches(plan, sink.done)
    bar = progress_bar(plan, todo)
    try:
        scored = scheduler_for(clf, plan, todo).run(todo, progress=bar.update)
        for n, (batch, probs, _) in enumerate(scored, 1):
            append_batch(clf, rows, plan, sink, batch, probs, on_error)
            testhold.after_batch(n)
    except BaseException:  # Ctrl-C included: what is in the journal stays there
        sink.close()
        raise
    finally:
        bar.close()


def refuse_bad_rows(rows: list[Row], plan: JobPlan, spec: RunSpec, source: str, fmt: str) -> None:
    """Under --on-error fail, any bad row (unreadable, or refused by the plan) stops the job
    before anything is computed."""
    if spec.on_error != "fail" or not (plan.errors or any(r.error for r in rows)):
        return
    marked = [dataclasses.replace(r, error=plan.errors[i]) if i in plan.errors else r
              for i, r in enumerate(rows)]  # fmt: skip
    first, *rest = describe_errors(marked, source, fmt).split("\n")
    raise JobError("\n".join([first + "; nothing was computed (--on-error skip writes an "
                              "error row for each)", *rest]))  # fmt: skip


def open_job_sink(clf: Classifier, rows: list[Row], plan: JobPlan, output: Path | None,
                  header: dict, resume: bool) -> Sink:  # fmt: skip
    """The job's sink, holding an error row for every bad input row."""
    sink = open_sink(clf, len(rows), output, header | {"settings": plan.settings}, resume)
    errors = {i: r.error for i, r in enumerate(rows) if r.error} | plan.errors
    sink.append([(i, error_row(rows[i].id, e, rows[i].line)) for i, e in sorted(errors.items())])
    return sink


def job_result(
    clf: Classifier, rows: list[Row], plan: JobPlan, sink: Sink, seconds: float, peak: int,
    verify: dict | None, ranks: list[dict] | None = None,
) -> JobResult:  # fmt: skip
    """The summary of a finished job (its sink already finished)."""
    return JobResult(
        rows=len(rows), scored=len(plan.prompts), errors=len(rows) - len(plan.prompts),
        seconds=seconds, padding_overhead=plan.padding_overhead,
        batch_tokens=plan.batch_tokens, peak_memory=peak, memory_bound=plan.memory_bound,
        verify=verify,
        planner=(plan.policy.planner + (f" ({plan.cost.source})" if plan.cost else "")
                 if plan.settings["mode"] == "sorted" else ""),
        predicted_seconds=plan.predicted_seconds(clf.engine.cost_terms()),
        results=[sink.done[i] for i in range(len(rows))],
        abstained=sum(1 for r in sink.done.values() if r.get("abstained")), ranks=ranks or [],
    )  # fmt: skip


def run_job(
    clf: Classifier, rows: list[Row], spec: RunSpec, output: Path | None, resume: bool = False,
    verify: bool = False, source: str = "input", fmt: str = "jsonl",
) -> JobResult:  # fmt: skip
    t0 = time.perf_counter()
    mx.reset_peak_memory()
    # memory held by anything else in this process (not the weights) stays live throughout
    others = max(0, mx.get_active_memory() - clf.footprint.weight_bytes)
    header = {"fingerprint": fingerprint(rows, clf, spec)}
    recorded = recorded_header(output, header) if output and resume else None
    plan = plan_job(clf, rows, spec, recorded["settings"] if recorded else None)
    refuse_bad_rows(rows, plan, spec, source, fmt)
    sink = open_job_sink(clf, rows, plan, output, header, resume)
    execute(clf, rows, plan, sink, spec.on_error)
    seconds = time.perf_counter() - t0
    report = verify_job(clf, rows, plan, sink, spec, verify)
    sink.finish(len(rows), clf.labels.names)
    return job_result(clf, rows, plan, sink, seconds, mx.get_peak_memory() - others, report)


def verify_job(clf: Classifier, rows: list[Row], plan: JobPlan, sink: Sink, spec: RunSpec,
               every: bool) -> dict | None:  # fmt: skip
    """--verify: every item again on the gold loop; --verify-sample F: a share F of them (the
    same items for the same input); else None."""
    if every:
        return run_verify(clf, rows, plan.prompts, sink.done)
    if not spec.verify_sample or not plan.prompts:
        return None
    keys = sorted(plan.prompts)
    k = min(len(keys), math.ceil(spec.verify_sample * len(keys)))
    sample = sorted(random.Random(len(keys)).sample(keys, k))
    return run_verify(clf, rows, {i: plan.prompts[i] for i in sample}, sink.done)


def run_verify(clf: Classifier, rows: list[Row], prompts: dict, results: dict) -> dict:
    """Score items again on the gold path and compare labels and scores."""
    names = clf.labels.names
    disagree, max_diff, t0 = [], 0.0, time.perf_counter()
    for i, prompt in tqdm(prompts.items(), desc="verify", file=sys.stderr, disable=None):
        gold = clf.adjust.apply(clf.engine.score_gold(prompt)[None])[0]
        scores = results[i].get("scores") or {}
        fast = np.array([scores.get(n, np.nan) for n in names], np.float64)
        finite = bool(np.isfinite(gold).all() and np.isfinite(fast).all())
        if finite:
            max_diff = max(max_diff, float(np.abs(gold - fast).max()))
        g = int(np.argmax(np.nan_to_num(gold, nan=-1.0)))
        if not finite:
            disagree.append({"id": rows[i].id, "gold": names[g] if np.isfinite(gold).all() else None,
                             "fast": results[i].get("label"), "error": "non-finite scores"})  # fmt: skip
        elif g != int(np.argmax(fast)):
            top2 = np.sort(gold)[-2:]
            disagree.append({"id": rows[i].id, "gold": names[g], "fast": names[int(np.argmax(fast))],
                             "gold_margin": float(top2[1] - top2[0])})  # fmt: skip
    n = len(prompts)
    return {
        "items": n,
        "agreement": (n - len(disagree)) / n if n else 1.0,
        "max_abs_score_diff": max_diff,
        "disagreements": disagree,
        "passed": not disagree,
        "seconds": time.perf_counter() - t0,
    }
