"""A classification job over a file: settings, scan, journal, then window by window plan,
score, write; then verify and report."""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from tqdm import tqdm

from ..api.classifier import Classifier
from ..api.spec import RunSpec, Settings
from ..engine.planner import PaddingStats
from ..errors import InputError, ResumeError
from ..io.inputs import Row
from ..io.journal_lines import fingerprint_parts
from ..io.outputs import open_stream, output_kind
from ..io.sinks import Journal, Sink, journal_path, recorded_header
from ..io.windows import JobInput, scan
from ..runtime import memory, progress
from .fingerprint import compute_path, fingerprint, model_record
from .plan import JobPlan, plan_window
from .result import JobResult, Totals
from .resume import Held, check_held
from .rows import Window, error_rows, execute, non_finite_error
from .tokens import WindowTokenizer, too_long
from .verify import merge_reports, verify_window


def open_sink(
    clf: Classifier, n_rows: int, output: Path | None, header: dict, resume: bool
) -> Sink:
    if output is None or output_kind(output) != "file":
        return open_stream(output or Path("-"), n_rows, clf.columns, header)
    return Journal(output, header, resume, n_rows, clf.columns, clf.adjust.min_confidence)


class LocalGroup:
    """A job computed by this process alone; `distributed.RankGroup` is the same over ranks."""

    rank = 0

    def share(self, settings: Settings | None, clf: Classifier, spec: RunSpec) -> Settings:
        return settings

    def agree(self, fingerprint: str) -> None:
        return None

    def opened(self, sink: Sink, output: Path | None) -> None:
        return None

    def score(
        self,
        clf: Classifier,
        window: Window,
        plan: JobPlan,
        sink: Sink,
        settings: Settings,
        verify: bool,
        bar: tqdm,
    ) -> tuple[list[tuple[int, dict]], dict | None]:
        """Score and append the window's batches not yet in the sink; (rows, verification)."""
        written = execute(clf, window, plan, sink, settings.spec.on_error, bar)
        if not verify and not settings.checking:
            return written, None
        results = dict(written)
        mine = {i: p for i, p in plan.prompts.items() if i in results}
        return written, verify_window(clf, window.ids(mine), mine, results, settings, verify)

    def ranks(self) -> list[dict]:
        return []


def run_job(
    clf: Classifier,
    rows: list[Row] | JobInput,
    spec: RunSpec,
    output: Path | None,
    resume: bool = False,
    verify: bool = False,
    source: str = "input",
    fmt: str = "jsonl",
    keep_results: bool = True,
    group: LocalGroup | None = None,
) -> JobResult | None:
    """Classify `rows` (a list, or a `JobInput` read in windows) into `output` (None: stdout).
    `keep_results`: return every row too; `group`: the ranks sharing the work (rank 0 writes)."""
    clf.check_process()
    job = Job(clf, spec, output, resume, verify, group or LocalGroup())
    job_input = rows if isinstance(rows, JobInput) else JobInput.of_rows(rows, source, fmt)
    job.prepare(job_input)
    totals, verified = job.windows(job_input, keep_results)
    if not job.lead:
        return None
    return job.finish(totals, verified, keep_results)


class Job:
    """One run of `run_job`: its steps, in order (see the module docstring)."""

    def __init__(
        self,
        clf: Classifier,
        spec: RunSpec,
        output: Path | None,
        resume: bool,
        verify: bool,
        group: LocalGroup,
    ):
        self.clf, self.spec, self.output, self.resume = clf, spec, output, resume
        self.verify, self.group = verify, group
        self.lead = group.rank == 0
        self.sink = self.bar = self.held = None
        self.recorded = False  # settings read back from a journal (a resume)

    def prepare(self, job_input: JobInput) -> None:
        """Settings (resolved once, or the journal's), the scan, the header, the sink."""
        clf, spec, output = self.clf, self.spec, self.output
        journaled = self.lead and self.resume and output is not None
        mine, unreadable, head = (
            self._settings(output if journaled else None) if self.lead else (None, None, None)
        )
        self.settings = self.group.share(mine, clf, spec)
        self._start_clock()
        self.tokens = WindowTokenizer(self.settings.window, self.settings.window_chars)
        refused = too_long(clf, self.settings, self.tokens)
        self.scanned = scan(job_input, refused)
        if not self.scanned.rows:
            raise InputError(f"{job_input.source}: empty input (no rows)")
        compute, model = compute_path(clf), model_record(clf)
        header = {
            "fingerprint": fingerprint(self.scanned.digest, clf, self.settings, compute, model),
            "compute": compute,
            "model": model,
        }
        if hasattr(clf, "questions"):  # for a resume to say what changed in them
            header["questions"] = clf.questions.header(clf.system_prompt)
        self.group.agree(header["fingerprint"])
        if unreadable is not None and head and _but_shape(head) == _but_shape(header):
            raise unreadable  # this run's journal (but for its shape), with settings unreadable
        if journaled and recorded_header(output, header) is None and output_kind(output) == "file":
            print(
                f"note: --resume: no journal of an interrupted run at {journal_path(output)}; "
                "starting afresh",
                file=sys.stderr,
            )
        if unreadable is not None:  # this run's journal, with settings it cannot read
            raise unreadable
        self.scanned.refuse_bad_rows(spec.on_error, job_input.source, job_input.fmt)
        if self.lead:
            header["settings"] = self.settings.record()
            self._open(header)

    def _start_clock(self) -> None:
        """The job's time and peak memory count from here, after any planner calibration."""
        self.clf.engine.release_buffers()  # a calibration's lane caches are the job's to make
        gc.collect()  # garbage freed mid-job would be counted as "others" and not be (peak < 0)
        mx.reset_peak_memory()
        # memory held by anything else in this process (not the weights) stays live throughout
        self.others = max(0, mx.get_active_memory() - self.clf.footprint.weight_bytes)
        self.t0 = time.perf_counter()

    def _settings(self, output: Path | None) -> tuple[Settings, ResumeError | None, dict | None]:
        """(settings: the journal's on a resume, why those could not be read, the header)."""
        try:
            head = recorded_header(output, None) if output is not None else None
        except ResumeError as e:
            return self.clf.settings(self.spec), e, None
        if not head:
            return self.clf.settings(self.spec), None, None
        try:
            settings = self.clf.settings(self.spec, head["settings"])
        except ResumeError as e:
            return self.clf.settings(self.spec), e, head
        self.recorded = True
        return settings, None, head

    def _open(self, header: dict) -> None:
        self.sink = open_sink(self.clf, self.scanned.rows, self.output, header, self.resume)
        self.group.opened(self.sink, self.output)
        offsets = getattr(self.sink.done, "offsets", None)
        self.held = None if offsets is None else Held(offsets >= 0)
        self.bar = progress.bar(
            self.scanned.rows, "classify", len(self.sink.done), self.spec.progress_every
        )

    def windows(self, job_input: JobInput, keep: bool) -> tuple[Totals, list]:
        """Every window planned, scored and written; the totals and the verifications."""
        totals, verified = Totals(), []
        try:
            for start, rows, prompts in self.tokens.windows(self.clf, job_input, self.scanned):
                window = Window(start, rows)
                job_input.check_unchanged()  # the rows just read are the scanned file's
                verified.append(self._window(window, prompts, totals, keep))
                del window
                memory.return_freed_memory()
            self.per_rank = self.group.ranks()  # every rank, the last collective
            if self.held is not None and self.held.prompts:
                prompts = {
                    i: self.held.prompt_of(i, self.clf.engine.prefix) for i in self.held.prompts
                }
                verified.append(
                    verify_window(
                        self.clf, self.held.ids, prompts, self.sink.done, self.settings, True
                    )
                )
        except BaseException as e:  # Ctrl-C included: what is in the journal stays there
            if self.sink is not None and isinstance(e, Exception):
                self.sink.abandon()  # an error: a journal with no row has nothing to resume
            elif self.sink is not None:  # interrupted: --resume continues its settings
                self.sink.close()
            raise
        finally:
            if self.bar is not None:
                self.bar.close()
        return totals, verified

    def _window(self, window: Window, prompts, totals: Totals, keep: bool) -> dict | None:
        clf, start, rows = self.clf, window.start, window.rows
        fresh = self.lead and not self.recorded  # a resumed plan is the first run's, checked then
        plan = plan_window(clf, rows, start, self.settings, fresh, prompts)
        if self.held is not None:
            check_held(self.sink, window, plan, self.held.mask, non_finite_error(clf))
        done = error_rows(window, plan, range(start, start + len(rows)))
        if self.sink is not None:
            self.sink.append(done)
        if self.held is not None and (self.verify or self.settings.checking):
            self.held.keep(window, plan, self.settings, self.verify, clf.engine.prefix)
        written, report = self.group.score(
            clf, window, plan, self.sink, self.settings, self.verify, self.bar
        )
        totals.add(clf, plan, done, written, keep and self.lead)
        return report

    def finish(self, totals: Totals, verified: list, keep: bool) -> JobResult:
        """The journal made the output; the job's summary."""
        report = merge_reports([v for v in verified if v is not None])
        seconds = time.perf_counter() - self.t0 - (report["seconds"] if report else 0.0)
        sink, held, n = self.sink, self.held, self.scanned.rows
        try:
            if keep and held is not None:  # the rows an earlier run journaled, read back
                totals.results.update(
                    (int(i), sink.done[int(i)]) for i in np.flatnonzero(held.mask)
                )
            sink.finish(n, self.clf.columns)
        except BaseException:
            sink.close()
            raise
        policy = self.settings.policy
        return JobResult(
            rows=n,
            scored=totals.scored,
            errors=n - totals.scored,
            seconds=seconds,
            padding_overhead=PaddingStats(totals.useful, totals.padded).overhead,
            batch_tokens=policy.batch_tokens,
            peak_memory=max(0, mx.get_peak_memory() - self.others),
            memory_bound=totals.memory_bound,
            verify=report,
            planner=self.settings.planner_label(),
            predicted_seconds=totals.predicted,
            results=[totals.results[i] for i in sorted(totals.results)] if keep else [],
            abstained=totals.abstained,
            duplicates=totals.duplicates,
            windows=totals.windows,
            resumed=int(held.mask.sum()) if held is not None else 0,
            ranks=self.per_rank,
            computed=totals.computed,
            computed_duplicates=totals.computed_duplicates,
        )


def _but_shape(header: dict) -> dict:
    """A header's fingerprint parts but the recorded batch shape's (jobs/fingerprint.py)."""
    parts = fingerprint_parts(header.get("fingerprint"))
    parts.pop("shape", None)
    return parts
