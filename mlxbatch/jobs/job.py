"""A classification job over a file: plan, open the sink, execute, verify, report.

`plan_job` is pure given the tokenizer: it decides the batch shape (the journal's recorded one
on resume, so truncation and batches are exactly the first run's), applies the too-long
policy, and cuts the batches. `run_job` is the handful of steps around it.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np
from tqdm import tqdm

from ..engine.engine import MODES
from ..engine.planner import DEFAULT_MAX_BATCH, Batch, CostModel, padding_stats
from ..errors import JobError
from ..io.inputs import Row, describe_errors
from ..io.outputs import open_stream, output_kind
from ..io.sinks import (
    Journal,
    Sink,
    error_row,
    recorded_header,
    result_row,
)
from ..runtime.memory import available_bytes
from .classifier import Classifier
from .limits import apply_too_long, item_limit, truncate  # noqa: F401  (truncate: API)

TOO_LONG = ("error", "truncate")


@dataclass
class JobSettings:
    mode: str = "sorted"
    batch_tokens: int | None = None
    max_batch: int = DEFAULT_MAX_BATCH
    prefix_cache: bool = True
    max_tokens: int | None = None  # per-item limit on fed tokens
    too_long: str = "error"
    on_error: str = "fail"
    planner: str = "cost"  # sorted mode: "cost" (least predicted time) or "greedy" (fill budget)


@dataclass
class JobPlan:
    settings: dict  # what the journal records: the job's settings and its batch shape
    prompts: dict[int, list[int]]  # input row index -> prompt tokens (truncated if asked)
    extras: dict[int, dict]  # input row index -> extra output fields (truncation)
    order: list[int]  # the scored rows' input indices; batches index into this list
    batches: list[Batch]
    fed_lengths: list[int]  # per entry of `order`
    memory_bound: int
    cost: CostModel | None = None  # the cost planner's model (None for the other planners)

    def predicted_seconds(self, terms: tuple[int, int, int]) -> float | None:
        """The cost model's time for these batches (`terms`: `Classifier.cost_terms`)."""
        if self.cost is None:
            return None
        return self.cost.plan_seconds(self.batches, *terms)

    @property
    def batch_tokens(self) -> int:
        return self.settings["batch_tokens"]


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


def fingerprint(rows: list[Row], clf: Classifier, s: JobSettings) -> str:
    h = hashlib.sha256()
    manifest = clf.lm.manifest.get("sha256") or sorted(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in clf.lm.path.glob("*.safetensors")
    )
    # everything that changes a row's scores or errors (the batch shape is recorded instead)
    parts = [manifest, str(clf.lm.path.resolve()), str(clf.lm.dtype), list(clf.labels.names),
             [list(t) for t in clf.labels.tokens], clf.system_prompt, s.mode, s.prefix_cache,
             s.too_long, s.max_tokens, s.on_error, s.planner, [list(e) for e in clf.examples],
             clf.adjust.p_cf, clf.adjust.prior, clf.adjust.min_confidence]  # fmt: skip
    h.update(json.dumps(parts, sort_keys=True, default=str).encode())
    for r in rows:
        h.update(json.dumps([r.id, r.text, r.error]).encode())
    return h.hexdigest()


def plan_job(clf: Classifier, rows: list[Row], s: JobSettings, recorded: dict | None) -> JobPlan:
    """Decide everything before computing. `recorded`: the interrupted run's settings."""
    fp, engine = clf.footprint, clf.engine
    ctx_limit = clf.lm.model.args.max_position_embeddings - fp.prefix - fp.label_len
    if ctx_limit < 1:
        raise JobError(f"the prompt prefix ({fp.prefix} tokens) leaves no room in the model's "
                       f"context of {clf.lm.model.args.max_position_embeddings} tokens")  # fmt: skip
    prompts = {i: engine.prompt(r.text) for i, r in enumerate(rows) if not r.error}
    # the longest item that will be fed: longer ones are truncated or refused at the limit
    longest = min(max(engine.fed_lengths(list(prompts.values())), default=1), ctx_limit,
                  s.max_tokens or ctx_limit)  # fmt: skip
    planner = s.planner if s.mode == "sorted" else MODES[s.mode].planner
    if recorded:  # the batch shape the journal's rows were computed with
        batch_tokens, max_batch = recorded["batch_tokens"], recorded["max_batch"]
        cost = CostModel.from_dict(recorded["cost_model"]) if recorded.get("cost_model") else None
    else:
        batch_tokens = s.batch_tokens or clf.default_batch_tokens(s.max_batch, longest)
        max_batch = s.max_batch
        cost = clf.cost_model() if planner == "cost" else None
        if s.batch_tokens:  # the budget as declared must fit, whatever this input's shape
            check_fits(fp, batch_tokens, max_batch, longest, s)
        elif batch_tokens < longest:
            check_fits(fp, longest, max_batch, longest, s)  # memory, not the user, caps the item
    limit = item_limit(clf, s, batch_tokens, ctx_limit)
    extras = apply_too_long(clf, rows, prompts, s, limit)
    order = sorted(prompts)
    lengths = engine.fed_lengths([prompts[i] for i in order])
    batches = clf.plan([prompts[i] for i in order], s.mode, batch_tokens, max_batch, planner, cost)
    # the lanes' cache buffers grow to the most rows and the widest batch of the job
    bound = (
        fp.weight_bytes
        + fp.batch_cost(
            max((b.padded_tokens for b in batches), default=1),
            max((len(b.indices) for b in batches), default=1),
            max((b.width for b in batches), default=1),
        ).total
    )
    if not recorded:
        check_fits(fp, max((b.padded_tokens for b in batches), default=1),
                   max((len(b.indices) for b in batches), default=1),
                   max((b.width for b in batches), default=1), s)  # fmt: skip
    settings = asdict(s) | {"batch_tokens": batch_tokens, "max_batch": max_batch,
                            "cost_model": cost.to_dict() if cost else None}  # fmt: skip
    return JobPlan(settings, prompts, extras, order, batches, lengths, bound, cost)


def check_fits(fp, tokens: int, rows: int, width: int, s: JobSettings) -> None:
    """Refuse a batch shape whose memory exceeds what is available, naming the setting."""
    cost, avail = fp.batch_cost(tokens, rows, width), available_bytes()
    if fp.weight_bytes + cost.total <= avail:
        return
    if s.batch_tokens:
        culprit = f"--batch-tokens {s.batch_tokens}; lower it"
    elif s.mode == "naive" or rows >= 256:
        culprit = f"--max-batch {s.max_batch} (rows per batch); lower it"
    elif fp.label_len > 1 and cost.kv_cache > cost.activations:
        culprit = (f"{fp.n_labels} labels of up to {fp.label_len} tokens (each row's cache is "
                   "repeated per label); use fewer or shorter labels, or lower --max-batch")  # fmt: skip
    else:
        culprit = f"items of {width} tokens; set --max-tokens with --too-long truncate"
    raise JobError(
        f"one batch needs about {(fp.weight_bytes + cost.total) / 2**30:.1f} GiB with the "
        f"weights, more than the {avail / 2**30:.1f} GiB available: {culprit}"
    )


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
    for i, p in zip(batch.indices, clf.adjust.apply(probs)):
        index = plan.order[i]
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
    return [b for b in plan.batches if any(plan.order[i] not in done for i in b.indices)]


def progress_bar(plan: JobPlan, todo: list[Batch]) -> tqdm:
    bar = tqdm(
        total=len(plan.order), unit="item", file=sys.stderr, disable=None, dynamic_ncols=True
    )
    bar.update(len(plan.order) - sum(len(b.indices) for b in todo))
    return bar


def execute(clf: Classifier, rows: list[Row], plan: JobPlan, sink: Sink, on_error: str) -> None:
    """Score every batch not yet in the sink, appending each as it completes."""
    todo = todo_batches(plan, sink.done)
    bar = progress_bar(plan, todo)
    plist = [plan.prompts[i] for i in plan.order]
    scorer = MODES[plan.settings["mode"]].scorer
    try:
        for batch, probs in clf.engine.run(plist, todo, scorer, progress=bar.update):
            try:
                sink.append(batch_rows(clf, rows, plan, batch, probs, on_error))
            except NonFinite as e:
                sink.append(e.good)
                raise
    except BaseException:  # Ctrl-C included: what is in the journal stays there
        sink.close()
        raise
    finally:
        bar.close()


def refuse_bad_rows(rows: list[Row], s: JobSettings, source: str, fmt: str) -> None:
    """Under --on-error fail, any bad row stops the job before anything is computed."""
    if s.on_error == "fail" and any(r.error for r in rows):
        first, *rest = describe_errors(rows, source, fmt).split("\n")
        raise JobError("\n".join([first + "; nothing was computed (--on-error skip writes an "
                                  "error row for each)", *rest]))  # fmt: skip


def open_job_sink(clf: Classifier, rows: list[Row], plan: JobPlan, output: Path | None,
                  header: dict, resume: bool) -> Sink:  # fmt: skip
    """The job's sink, holding an error row for every bad input row."""
    sink = open_sink(clf, len(rows), output, header | {"settings": plan.settings}, resume)
    sink.append([(i, error_row(r.id, r.error, r.line)) for i, r in enumerate(rows) if r.error])
    return sink


def job_result(
    clf: Classifier, rows: list[Row], plan: JobPlan, sink: Sink, seconds: float, peak: int,
    verify: dict | None, ranks: list[dict] | None = None,
) -> JobResult:  # fmt: skip
    """The summary of a finished job (its sink already finished)."""
    return JobResult(
        rows=len(rows), scored=len(plan.order), errors=sum(1 for r in rows if r.error),
        seconds=seconds, padding_overhead=padding_stats(plan.fed_lengths, plan.batches).overhead,
        batch_tokens=plan.batch_tokens, peak_memory=peak, memory_bound=plan.memory_bound,
        verify=verify,
        planner=(plan.settings["planner"] + (f" ({plan.cost.source})" if plan.cost else "")
                 if plan.settings["mode"] == "sorted" else ""),
        predicted_seconds=plan.predicted_seconds(clf.cost_terms()),
        results=[sink.done[i] for i in range(len(rows))],
        abstained=sum(1 for r in sink.done.values() if r.get("abstained")), ranks=ranks or [],
    )  # fmt: skip


def run_job(
    clf: Classifier, rows: list[Row], s: JobSettings, output: Path | None, resume: bool = False,
    verify: bool = False, source: str = "input", fmt: str = "jsonl",
) -> JobResult:  # fmt: skip
    t0 = time.perf_counter()
    mx.reset_peak_memory()
    # memory held by anything else in this process (not the weights) stays live throughout
    others = max(0, mx.get_active_memory() - clf.footprint.weight_bytes)
    header = {"fingerprint": fingerprint(rows, clf, s)}
    recorded = recorded_header(output, header) if output and resume else None
    plan = plan_job(clf, rows, s, recorded["settings"] if recorded else None)
    refuse_bad_rows(rows, s, source, fmt)
    sink = open_job_sink(clf, rows, plan, output, header, resume)
    execute(clf, rows, plan, sink, s.on_error)
    seconds = time.perf_counter() - t0
    report = run_verify(clf, rows, plan.prompts, sink.done) if verify else None
    sink.finish(len(rows), clf.labels.names)
    return job_result(clf, rows, plan, sink, seconds, mx.get_peak_memory() - others, report)


def run_verify(clf: Classifier, rows: list[Row], prompts: dict, results: dict) -> dict:
    """Score every item again on the gold path and compare labels and scores."""
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
