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
from ..engine.planner import DEFAULT_MAX_BATCH, Batch, padding_stats
from ..errors import JobError
from ..io.inputs import Row, describe_errors
from ..io.sinks import Journal, OrderedStream, Sink, error_row, recorded_header, result_row
from ..runtime.memory import available_bytes
from .classifier import Classifier

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


@dataclass
class JobPlan:
    settings: dict  # what the journal records: the job's settings and its batch shape
    prompts: dict[int, list[int]]  # input row index -> prompt tokens (truncated if asked)
    extras: dict[int, dict]  # input row index -> extra output fields (truncation)
    order: list[int]  # the scored rows' input indices; batches index into this list
    batches: list[Batch]
    fed_lengths: list[int]  # per entry of `order`
    memory_bound: int

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

    def summary(self) -> str:
        rate = self.scored / self.seconds if self.seconds else 0.0
        return (
            f"{self.rows} rows ({self.scored} scored, {self.errors} errors) in "
            f"{self.seconds:.1f} s, {rate:.2f} items/s, padding overhead "
            f"{self.padding_overhead:.1%}, batch tokens {self.batch_tokens}, peak memory "
            f"{self.peak_memory / 2**30:.2f} GiB (bound {self.memory_bound / 2**30:.2f} GiB)"
        )


def truncate(clf: Classifier, text: str, limit: int) -> tuple[str, int]:
    """Keep the head and the tail of `text` so its fed tokens fit `limit`; (text, tokens)."""
    tok, engine = clf.lm.tokenizer, clf.engine
    ids = tok.encode(text)
    overhead = len(engine.fed(engine.prompt("")))
    keep = max(limit - overhead - 4, 2)
    while True:
        head, tail = keep - keep // 2, keep // 2
        cut = tok.decode(ids[:head]) + " […] " + tok.decode(ids[len(ids) - tail :])
        n = len(engine.fed(engine.prompt(cut)))
        if n <= limit or keep <= 2:
            return cut, n
        keep -= n - limit


def apply_too_long(
    clf: Classifier, rows: list[Row], prompts: dict[int, list[int]], s: JobSettings, limit: int
) -> dict[int, dict]:
    """Apply the too-long policy to the tokenized rows, in place. Returns extras by index."""
    extras = {}
    for i, prompt in list(prompts.items()):
        n = len(clf.engine.fed(prompt))
        if n <= limit:
            continue
        if s.too_long == "error":
            rows[i].error = f"{n} tokens, over the limit of {limit} (see --max-tokens, --too-long)"
            del prompts[i]
            continue
        text, m = truncate(clf, rows[i].text, limit)
        prompts[i] = clf.engine.prompt(text)
        extras[i] = {"truncated": {"from_tokens": n, "to_tokens": m}}
    return extras


def fingerprint(rows: list[Row], clf: Classifier, s: JobSettings) -> str:
    h = hashlib.sha256()
    manifest = clf.lm.manifest.get("sha256") or str(clf.lm.path.resolve())
    parts = [manifest, list(clf.labels.names), clf.system_prompt, s.mode, s.prefix_cache,
             s.too_long, s.max_tokens, s.on_error]  # fmt: skip
    h.update(json.dumps(parts, sort_keys=True, default=str).encode())
    for r in rows:
        h.update(json.dumps([r.id, r.text, r.error]).encode())
    return h.hexdigest()


def plan_job(clf: Classifier, rows: list[Row], s: JobSettings, recorded: dict | None) -> JobPlan:
    """Decide everything before computing. `recorded`: the interrupted run's settings."""
    fp, engine = clf.footprint, clf.engine
    ctx_limit = clf.lm.model.args.max_position_embeddings - fp.prefix - fp.label_len
    prompts = {i: engine.prompt(r.text) for i, r in enumerate(rows) if not r.error}
    longest = min(max(engine.fed_lengths(list(prompts.values())), default=1), ctx_limit)
    if recorded:  # the batch shape the journal's rows were computed with
        batch_tokens, max_batch = recorded["batch_tokens"], recorded["max_batch"]
    else:
        batch_tokens = s.batch_tokens or fp.default_budget(s.max_batch, longest)
        max_batch = s.max_batch
    limit = min(s.max_tokens or ctx_limit, ctx_limit, batch_tokens)
    extras = apply_too_long(clf, rows, prompts, s, limit)
    longest = min(longest, limit)
    if s.batch_tokens and not recorded:
        need = fp.batch_cost(batch_tokens, max_batch, longest).total
        if need > available_bytes():
            raise JobError(
                f"--batch-tokens {batch_tokens} needs about {need / 2**30:.1f} GiB for one "
                f"batch, more than the {available_bytes() / 2**30:.1f} GiB available; lower it"
            )
    order = sorted(prompts)
    lengths = engine.fed_lengths([prompts[i] for i in order])
    batches = clf.plan([prompts[i] for i in order], s.mode, batch_tokens, max_batch)
    settings = asdict(s) | {"batch_tokens": batch_tokens, "max_batch": max_batch}
    return JobPlan(settings, prompts, extras, order, batches, lengths,
                   fp.bound(batch_tokens, max_batch, longest))  # fmt: skip


def open_sink(
    clf: Classifier, n_rows: int, output: Path | None, header: dict, resume: bool
) -> Sink:
    if output is None:
        return OrderedStream(n_rows, clf.labels.names, header)
    return Journal(output, header, resume)


def execute(clf: Classifier, rows: list[Row], plan: JobPlan, sink: Sink) -> None:
    """Score every batch not yet in the sink, appending each as it completes."""
    todo = [b for b in plan.batches if any(plan.order[i] not in sink.done for i in b.indices)]
    bar = tqdm(
        total=len(plan.order), unit="item", file=sys.stderr, disable=None, dynamic_ncols=True
    )
    bar.update(len(plan.order) - sum(len(b.indices) for b in todo))
    names = clf.labels.names
    plist = [plan.prompts[i] for i in plan.order]
    try:
        for batch, probs in clf.engine.run(plist, todo, MODES[plan.settings["mode"]].scorer,
                                           progress=bar.update):  # fmt: skip
            sink.append([
                (plan.order[i], result_row(rows[plan.order[i]].id, names, p, plan.extras.get(plan.order[i])))
                for i, p in zip(batch.indices, probs)
            ])  # fmt: skip
    except BaseException:  # Ctrl-C included: what is in the journal stays there
        sink.close()
        raise
    finally:
        bar.close()


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
    bad = [r for r in rows if r.error]
    if bad and s.on_error == "fail":
        raise JobError(describe_errors(rows, source, fmt)
                       + "\n(nothing was computed; --on-error skip writes an error row for each)")  # fmt: skip
    sink = open_sink(clf, len(rows), output, header | {"settings": plan.settings}, resume)
    sink.append([(i, error_row(r.id, r.error)) for i, r in enumerate(rows) if r.error])
    execute(clf, rows, plan, sink)
    seconds = time.perf_counter() - t0
    report = run_verify(clf, rows, plan.prompts, sink.done) if verify else None
    sink.finish(len(rows), clf.labels.names)
    return JobResult(
        rows=len(rows), scored=len(plan.order), errors=len(bad), seconds=seconds,
        padding_overhead=padding_stats(plan.fed_lengths, plan.batches).overhead,
        batch_tokens=plan.batch_tokens, peak_memory=mx.get_peak_memory() - others,
        memory_bound=plan.memory_bound, verify=report,
    )  # fmt: skip


def run_verify(clf: Classifier, rows: list[Row], prompts: dict, results: dict) -> dict:
    """Score every item again on the gold path and compare labels and scores."""
    names = clf.labels.names
    disagree, max_diff, t0 = [], 0.0, time.perf_counter()
    for i, prompt in tqdm(prompts.items(), desc="verify", file=sys.stderr, disable=None):
        gold = clf.engine.score_gold(prompt)
        fast = np.array([results[i]["scores"][n] for n in names])
        max_diff = max(max_diff, float(np.abs(gold - fast).max()))
        g = int(np.argmax(gold))
        if names[g] != results[i]["label"]:
            top2 = np.sort(gold)[-2:]
            disagree.append({"id": rows[i].id, "gold": names[g], "fast": results[i]["label"],
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
