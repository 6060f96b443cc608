"""A classification job over a file: validate, plan, score, journal, verify, summarise."""

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

from .batching import DEFAULT_MAX_BATCH, padding_stats
from .classifier import Classifier
from .inputs import Row, describe_errors
from .memory import available_bytes, batch_cost
from .output import Journal, OrderedStdout, error_row, result_row

TOO_LONG = ("error", "truncate")


class JobError(RuntimeError):
    """A job that must stop before (or instead of) computing; the message says why."""


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
    tok = clf.lm.tokenizer
    ids = tok.encode(text)
    overhead = len(clf.engine.split(clf.engine.prompt(""))[1])
    keep = max(limit - overhead - 4, 2)
    while True:
        head, tail = keep - keep // 2, keep // 2
        cut = tok.decode(ids[:head]) + " […] " + tok.decode(ids[len(ids) - tail :])
        n = len(clf.engine.split(clf.engine.prompt(cut))[1])
        if n <= limit or keep <= 2:
            return cut, n
        keep -= n - limit


def prepare(
    clf: Classifier, rows: list[Row], prompts: dict[int, list[int]], s: JobSettings, limit: int
) -> dict[int, dict]:
    """Apply the too-long policy to the tokenized rows, in place. Returns extras by index."""
    extras = {}
    for i, prompt in list(prompts.items()):
        n = len(clf.engine.split(prompt)[1])
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


def run_job(
    clf: Classifier, rows: list[Row], s: JobSettings, output: Path | None, resume: bool = False,
    verify: bool = False, source: str = "input", fmt: str = "jsonl",
) -> JobResult:  # fmt: skip
    t0 = time.perf_counter()
    mx.reset_peak_memory()
    # memory held by anything else in this process (not the weights) stays live throughout
    others = max(0, mx.get_active_memory() - weight_bytes(clf))
    args = clf.lm.model.args
    ctx_limit = args.max_position_embeddings - len(clf.engine.prefix) - clf.labels.max_len
    prompts = {i: clf.engine.prompt(r.text) for i, r in enumerate(rows) if not r.error}
    longest = min(max(clf.fed_lengths(list(prompts.values())), default=1), ctx_limit)
    batch_tokens = s.batch_tokens or clf.default_batch_tokens(s.max_batch, longest)
    limit = min(s.max_tokens or ctx_limit, ctx_limit, batch_tokens)
    extras = prepare(clf, rows, prompts, s, limit)
    bad = [r for r in rows if r.error]
    if bad and s.on_error == "fail":
        raise JobError(describe_errors(rows, source, fmt)
                       + "\n(nothing was computed; --on-error skip writes an error row for each)")  # fmt: skip
    nbytes = clf.lm.model.model.embed_tokens.weight.dtype.size
    context = len(clf.engine.prefix) + min(longest, limit) + clf.labels.max_len
    cost = batch_cost(args, nbytes, batch_tokens, s.max_batch, context,
                      len(clf.labels.names), clf.labels.max_len)  # fmt: skip
    if s.batch_tokens and cost.total > available_bytes():
        raise JobError(
            f"--batch-tokens {batch_tokens} needs about {cost.total / 2**30:.1f} GiB for one batch, "
            f"more than the {available_bytes() / 2**30:.1f} GiB available; lower it"
        )

    header = {
        "fingerprint": fingerprint(rows, clf, s),
        "settings": asdict(s) | {"batch_tokens": batch_tokens},
    }
    sink = (
        Journal(output, header, resume)
        if output
        else OrderedStdout(len(rows), clf.labels.names, header)
    )
    # a resumed run re-plans with the recorded batch shape, so its scores are bit-identical
    batch_tokens, max_batch = (sink.header["settings"][k] for k in ("batch_tokens", "max_batch"))
    bound = weight_bytes(clf) + batch_cost(args, nbytes, batch_tokens, max_batch, context,
                                           len(clf.labels.names), clf.labels.max_len).total  # fmt: skip
    sink.append([(i, error_row(r.id, r.error)) for i, r in enumerate(rows) if r.error])

    order = sorted(prompts)
    plist = [prompts[i] for i in order]
    batches = clf.plan(plist, s.mode, batch_tokens, max_batch)
    todo = [b for b in batches if any(order[i] not in sink.done for i in b.indices)]
    bar = tqdm(total=len(plist), unit="item", file=sys.stderr, disable=None, dynamic_ncols=True)
    bar.update(len(plist) - sum(len(b.indices) for b in todo))
    names = clf.labels.names
    gold = s.mode == "sequential"
    try:
        for batch, probs in clf.engine.run(plist, todo, gold=gold, progress=bar.update):
            sink.append([
                (order[i], result_row(rows[order[i]].id, names, p, extras.get(order[i])))
                for i, p in zip(batch.indices, probs)
            ])  # fmt: skip
    except BaseException:  # Ctrl-C included: what is in the journal stays there
        sink.close()
        raise
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    report = run_verify(clf, rows, prompts, sink.done) if verify else None
    sink.finish(len(rows), names)
    lengths = clf.fed_lengths(plist)
    return JobResult(
        rows=len(rows), scored=len(plist), errors=len(bad), seconds=seconds,
        padding_overhead=padding_stats(lengths, batches).overhead, batch_tokens=batch_tokens,
        peak_memory=mx.get_peak_memory() - others, memory_bound=bound,
        verify=report,
    )  # fmt: skip


def weight_bytes(clf: Classifier) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(clf.lm.model.parameters()))


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
