"""A classification job over a file: plan (`plan.py`), open the sink, execute, verify, report.

`run_job` is the handful of steps; the scheduler scores the planned batches through the
lanes, and a journal-backed sink makes every finished batch durable.
"""

from __future__ import annotations

import gc
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlx.core as mx
import numpy as np
from tqdm import tqdm

from ..api.classifier import Classifier
from ..api.limits import fit
from ..api.spec import RunSpec
from ..engine.planner import Batch, PaddingStats
from ..engine.scheduler import Scheduler
from ..errors import InputError, JobError, ResumeError
from ..io.inputs import Row, describe_errors
from ..io.outputs import open_stream, output_kind
from ..io.rows import error_row, result_row
from ..io.sinks import Journal, Sink, journal_path, recorded_header
from ..runtime import memory, progress, testhold
from .fingerprint import compute_path, fingerprint
from .plan import JobPlan, JobShape, check_declared, job_shape, plan_window, planner_label
from .result import JobResult, Totals
from .source import JobInput, Scan, scan
from .verify import merge_reports, verify_window


def open_sink(
    clf: Classifier, n_rows: int, output: Path | None, header: dict, resume: bool
) -> Sink:
    if output is None or output_kind(output) != "file":
        return open_stream(output or Path("-"), n_rows, clf.labels.names, header)
    return Journal(output, header, resume, n_rows, clf.labels.names)


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
    for scored, p in zip(batch.indices, clf.adjust.apply(probs)):
        for index in (scored, *plan.copies.get(scored, ())):  # duplicates share the result
            row = rows[index]
            if np.isfinite(p).all():
                out.append((index, result_row(row.id, clf.labels.names, p,
                                              plan.extras.get(index), clf.adjust.abstains(p))))  # fmt: skip
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


def todo_batches(plan: JobPlan, done) -> list[Batch]:
    """The batches with a row (scored, or a copy of a scored row) that `done` lacks: a batch's
    lines are one write, but a write cut short can keep a scored row and lose its copy."""
    return [b for b in plan.batches if not all(j in done for j in batch_rows_of(plan, b))]


def batch_rows_of(plan: JobPlan, batch: Batch):
    """The input rows a batch writes: each scored row, then its copies."""
    for i in batch.indices:
        yield i
        yield from plan.copies.get(i, ())


def progress_bar(total: int, done: int = 0, lines_every: float | None = None) -> tqdm:
    return progress.bar(total, "classify", done, lines_every)


def scheduler_for(clf: Classifier, plan: JobPlan, batches: list[Batch]) -> Scheduler:
    """A scheduler holding the items of `batches`, under the plan's policy."""
    return Scheduler(clf.engine, plan.policy,
                     ((i, plan.prompts[i]) for b in batches for i in b.indices))  # fmt: skip


def append_batch(clf: Classifier, rows, plan: JobPlan, sink: Sink, batch: Batch,
                 probs: np.ndarray, on_error: str) -> list[tuple[int, dict]]:  # fmt: skip
    """One scored batch into the sink (its rows, returned); non-finite rows are kept as far
    as they are good."""
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


def refuse_bad_rows(scanned: Scan, spec: RunSpec, source: str, fmt: str) -> None:
    """Under --on-error fail, any bad row (unreadable, or too long) stops the job before
    anything is computed."""
    if spec.on_error != "fail" or not scanned.bad_count:
        return
    first, *rest = describe_errors(scanned.bad, source, fmt, total=scanned.rows,
                                   bad_total=scanned.bad_count).split("\n")  # fmt: skip
    raise JobError("\n".join([first + "; nothing was computed (--on-error skip writes an "
                              "error row for each)", *rest]))  # fmt: skip


def error_rows(rows, plan: JobPlan, indices) -> list[tuple[int, dict]]:
    """Error rows for the bad rows among `indices` (unreadable, or refused by the plan)."""
    out = []
    for i in indices:
        row = rows[i]
        error = row.error or plan.errors.get(i)
        if error:
            out.append((i, error_row(row.id, error, row.line)))
    return out


class LocalGroup:
    """A job computed by this process alone. `distributed.RankGroup` has the same methods and
    computes it over the ranks of an `mlx.launch` job: `run_job` is the one driver of both."""

    rank = 0

    def share_shape(self, shape: JobShape | None) -> JobShape:
        return shape

    def agree(self, fingerprint: str) -> None:
        return None

    def opened(self, sink: Sink, output: Path | None) -> None:
        return None

    def score(self, clf: Classifier, window: Window, plan: JobPlan, sink: Sink, spec: RunSpec,
              verify: bool, bar: tqdm) -> tuple[list[tuple[int, dict]], dict | None]:  # fmt: skip
        """The window's batches not yet in the sink, scored and appended; the rows written and
        the verification of the items scored."""
        written = execute(clf, window, plan, sink, spec.on_error, bar)
        if not verify and not spec.verify_sample:
            return written, None
        results = dict(written)
        mine = {i: p for i, p in plan.prompts.items() if i in results}
        return written, verify_window(clf, window, mine, results, spec, verify)

    def ranks(self) -> list[dict]:
        return []


def run_job(
    clf: Classifier, rows: list[Row] | JobInput, spec: RunSpec, output: Path | None,
    resume: bool = False, verify: bool = False, source: str = "input", fmt: str = "jsonl",
    keep_results: bool = True, group: LocalGroup | None = None,
) -> JobResult | None:  # fmt: skip
    """Classify `rows` (a list, or a `JobInput` read in windows of `spec.window` rows) into
    `output` (None: standard output). With `keep_results`, the result rows come back in the
    JobResult (a list of every row: memory that grows with the job). `group`: the ranks that
    share the work (`distributed.RankGroup`); every rank reads the same windows and plans them
    alike, rank 0 writes; the others return None."""
    clf.check_process()
    t0 = time.perf_counter()
    group = group or LocalGroup()
    lead = group.rank == 0
    gc.collect()  # garbage freed mid-job would be counted as "others" and not be (peak < 0)
    mx.reset_peak_memory()
    # memory held by anything else in this process (not the weights) stays live throughout
    others = max(0, mx.get_active_memory() - clf.footprint.weight_bytes)
    job_input = rows if isinstance(rows, JobInput) else JobInput.of_rows(rows, source, fmt)
    fresh = group.share_shape(job_shape(clf, spec, None) if lead else None)
    scanned = scan(job_input, _too_long(clf, spec, fresh))
    if not scanned.rows:
        raise InputError(f"{job_input.source}: empty input (no rows)")
    compute = compute_path(clf)
    header = {"fingerprint": fingerprint(scanned.digest, clf, spec, compute), "compute": compute}
    group.agree(header["fingerprint"])
    recorded = recorded_header(output, header) if lead and output and resume else None
    if lead and output and resume and recorded is None and output_kind(output) == "file":
        print(f"note: --resume: no journal of an interrupted run at {journal_path(output)}; "
              "starting afresh", file=sys.stderr)  # fmt: skip
    shape = fresh
    if lead:
        shape = job_shape(clf, spec, recorded["settings"]) if recorded else fresh
        if not recorded:
            check_declared(clf, spec, shape)
    shape = group.share_shape(shape if lead else None)
    refuse_bad_rows(scanned, spec, job_input.source, job_input.fmt)
    sink, bar, held = None, None, None
    if lead:
        sink = open_sink(clf, scanned.rows, output, header | {"settings": shape.settings(spec)},
                         resume)  # fmt: skip
        group.opened(sink, output)
        held = _held_rows(sink)
        bar = progress_bar(scanned.rows, len(sink.done), spec.progress_every)
    totals, verified = Totals(), []
    try:
        for start, window_rows, prompts in tokenized(clf, job_input, shape.window, scanned):
            window = Window(start, window_rows)
            job_input.check_unchanged()  # the rows just read are the scanned file's
            if held is not None:
                check_held_ids(sink, window, held)
            plan = plan_window(clf, window_rows, start, spec, shape, lead and not recorded, prompts)
            done = error_rows(window, plan, range(start, start + len(window_rows)))
            if sink is not None:
                sink.append(done)
            written, report = group.score(clf, window, plan, sink, spec, verify, bar)
            totals.add(clf, plan, done + written, keep_results and lead)
            verified.append(report)
            del window, plan, done, written
            memory.return_freed_memory()
        per_rank = group.ranks()  # every rank, the last collective
        checking = verify or bool(spec.verify_sample)
        if lead and checking and held is not None and held.any():
            verified += verify_held(clf, job_input, scanned, spec, shape, sink, held, verify)
    except BaseException:  # Ctrl-C included: what is in the journal stays there
        if sink is not None:
            sink.close()
        raise
    finally:
        if bar is not None:
            bar.close()
    if not lead:
        return None
    report = merge_reports([v for v in verified if v is not None])
    seconds = time.perf_counter() - t0 - (report["seconds"] if report else 0.0)
    try:
        if keep_results and held is not None:  # the rows an earlier run journaled, read back
            totals.results.update((int(i), sink.done[int(i)]) for i in np.flatnonzero(held))
        sink.finish(scanned.rows, clf.labels.names)
    except BaseException:
        sink.close()
        raise
    return JobResult(
        rows=scanned.rows, scored=totals.scored, errors=scanned.rows - totals.scored,
        seconds=seconds, padding_overhead=PaddingStats(totals.useful, totals.padded).overhead,
        batch_tokens=shape.batch_tokens, peak_memory=max(0, mx.get_peak_memory() - others),
        memory_bound=totals.memory_bound, verify=report,
        planner=planner_label(spec.mode, spec.step.planner, shape.cost),
        predicted_seconds=totals.predicted,
        results=[totals.results[i] for i in sorted(totals.results)] if keep_results else [],
        abstained=totals.abstained, duplicates=totals.duplicates, windows=totals.windows,
        resumed=int(held.sum()) if held is not None else 0, ranks=per_rank,
    )  # fmt: skip


def _too_long(clf: Classifier, spec: RunSpec, shape: JobShape):
    """Under --on-error fail with --too-long error, the scan's check of each row against the
    item limit (too long: refused before computing); else None."""
    if spec.on_error != "fail" or spec.too_long != "error":
        return None

    def refused(block: list[Row]) -> list[str | None]:
        good = [r for r in block if not r.error]
        prompts = iter(clf.engine.prompts([r.text for r in good]))
        fits = [None if r.error else fit(clf.engine, r.text, shape.limit, False, next(prompts))
                for r in block]  # fmt: skip
        return [f if isinstance(f, str) else None for f in fits]

    return refused


def _held_rows(sink: Sink) -> np.ndarray | None:
    """Which rows the journal held when the job opened it (resumed rows), as a mask."""
    offsets = getattr(sink.done, "offsets", None)
    return None if offsets is None else offsets >= 0


def check_held_ids(sink: Sink, window: Window, held: np.ndarray) -> None:
    """A resumed journal's rows in `window` each carry the id of the input row they stand for
    (a journal edited, or written for rows since changed, would copy in another row's result)."""
    end = min(window.start + len(window.rows), len(held))
    for i in np.flatnonzero(held[window.start : end]) + window.start:
        got, want = sink.done[int(i)].get("id"), window[int(i)].id
        if type(got) is not type(want) or got != want:
            line = sink.done.line_of(int(i))
            raise ResumeError(f"{sink.path}: line {line} holds id {got!r} for input row "
                              f"{int(i) + 1}, whose id is {want!r} (edited?); delete the journal "
                              "to start over")  # fmt: skip


def verify_held(clf: Classifier, job_input: JobInput, scanned: Scan, spec: RunSpec,
                shape: JobShape, sink: Sink, held: np.ndarray, every: bool) -> list[dict | None]:  # fmt: skip
    """The verification of the rows an earlier run journaled (`held`), read back from the
    journal, after every window is done: a second pass over the input re-plans each window
    that has such rows (tokenizing again, nothing scored), so no rank waits on it."""
    reports = []
    for start, window_rows in job_input.windows(shape.window, scanned):
        if not held[start : start + len(window_rows)].any():
            continue
        plan = plan_window(clf, window_rows, start, spec, shape, False)
        # a batch partly held was scored again by this run, and verified then
        whole = [
            b
            for b in plan.batches
            if all(j < len(held) and held[j] for j in batch_rows_of(plan, b))
        ]
        prompts = {i: plan.prompts[i] for b in whole for i in b.indices}
        reports.append(verify_window(clf, Window(start, window_rows), prompts, sink.done, spec,
                                     every))  # fmt: skip
    return reports


def tokenized(clf: Classifier, job_input: JobInput, size: int, scanned: Scan | None = None):
    """(start, rows, prompts of the good rows) window by window; the next window is read and
    tokenized in a thread while the caller scores this one (the tokenizer's Rust threads
    release the GIL: off the lanes' critical path)."""

    def read(windows):
        item = next(windows, None)
        if item is None:
            return None
        start, rows = item
        return start, rows, clf.engine.prompts([r.text for r in rows if not r.error])

    windows = job_input.windows(size, scanned)
    with ThreadPoolExecutor(1, thread_name_prefix="mlxbatch-read") as pool:
        ahead = pool.submit(read, windows)
        while (item := ahead.result()) is not None:
            ahead = pool.submit(read, windows)
            yield item


def execute(clf: Classifier, rows, plan: JobPlan, sink: Sink, on_error: str,
            bar: tqdm) -> list[tuple[int, dict]]:  # fmt: skip
    """Score every batch of `plan` not yet in the sink, appending each as it completes; the
    rows appended."""
    todo = todo_batches(plan, sink.done)
    written = []
    scored = scheduler_for(clf, plan, todo).run(todo)
    for n, (batch, probs, _) in enumerate(scored, 1):
        rows_out = append_batch(clf, rows, plan, sink, batch, probs, on_error)
        bar.update(len(rows_out))
        written += rows_out
        testhold.after_batch(n)
    return written
