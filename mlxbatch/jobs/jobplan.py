"""What a job decides before computing: its settings, the input's fingerprint, the batch plan
(the journal's recorded batch shape on resume, so truncation and batches are exactly the first
run's), the too-long policy, and the memory check that names the setting to change.

`plan_job` is pure given the tokenizer and the machine's free memory.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from ..api.classifier import Classifier
from ..engine.engine import MODES
from ..engine.planner import DEFAULT_MAX_BATCH, Batch, CostModel
from ..errors import JobError
from ..io.inputs import Row
from ..runtime.memory import available_bytes
from .limits import apply_too_long, item_limit

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
    # >= 1: the engine refused a prefix that leaves no room, before computing it
    ctx_limit = clf.lm.model.args.max_position_embeddings - fp.prefix - fp.label_len
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
