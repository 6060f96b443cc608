"""What a file job decides before computing, as a pure function of its inputs: the per-row
outcomes (prompts, truncations, rows refused as too long), the batch shape (the journal's
recorded one on resume, so truncation and batches are exactly the first run's), the batches
(indexed by input row, the one index space), and the memory check that names the setting to
change. Rows are never modified: outcomes are returned.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..api.classifier import Classifier
from ..api.limits import Fitted, Limit, context_limit, fit, item_limit
from ..api.spec import RunSpec
from ..engine.footprint import Footprint
from ..engine.planner import Batch, CostModel, padding_stats
from ..engine.scheduler import BatchPolicy, Scheduler
from ..errors import JobError
from ..io.inputs import Row
from ..runtime.memory import available_bytes


@dataclass
class JobPlan:
    settings: dict  # what the journal records: the run spec and its batch shape
    prompts: dict[int, list[int]]  # input row -> prompt tokens (truncated if asked)
    extras: dict[int, dict]  # input row -> extra output fields (truncation)
    errors: dict[int, str]  # input row -> why planning refused it (too long)
    batches: list[Batch]  # indices are input rows
    fed: dict[int, int]  # input row -> tokens it feeds beyond the shared prefix
    memory_bound: int
    policy: BatchPolicy  # how the scheduler scores the batches
    cost: CostModel | None = None  # the cost planner's model (None for the other planners)

    def predicted_seconds(self, terms: tuple[int, int, int]) -> float | None:
        """The cost model's time for these batches (`terms`: `Engine.cost_terms`)."""
        if self.cost is None:
            return None
        return self.cost.plan_seconds(self.batches, *terms)

    @property
    def batch_tokens(self) -> int:
        return self.settings["batch_tokens"]

    @property
    def padding_overhead(self) -> float:
        order = [i for b in self.batches for i in b.indices]
        positions = {i: n for n, i in enumerate(order)}
        lengths = [self.fed[i] for i in order]
        local = [Batch(tuple(positions[i] for i in b.indices), b.width) for b in self.batches]
        return padding_stats(lengths, local).overhead


def plan_job(clf: Classifier, rows: list[Row], spec: RunSpec, recorded: dict | None) -> JobPlan:
    """Decide everything before computing. `recorded`: the interrupted run's settings."""
    engine, fp = clf.engine, clf.footprint
    good = [i for i, r in enumerate(rows) if not r.error]
    fitted: dict[int, Fitted | str] = {}
    if recorded:  # the batch shape the journal's rows were computed with
        batch_tokens, max_batch = recorded["batch_tokens"], recorded["max_batch"]
        cost = CostModel.from_dict(recorded["cost_model"]) if recorded.get("cost_model") else None
        limit = _limit(clf, spec, batch_tokens, recorded.get("item_limit"))
    else:
        max_batch = spec.max_batch
        limit = _limit(clf, spec, spec.batch_tokens, None)
        fitted = {i: fit(engine, rows[i].text, limit, spec.too_long == "truncate") for i in good}
        longest = max((f.tokens for f in fitted.values() if isinstance(f, Fitted)), default=1)
        batch_tokens = spec.batch_tokens or engine.default_budget(max_batch, longest)
        cost = clf.cost_model() if spec.step.planner == "cost" else None
        if spec.batch_tokens:  # the budget as declared must fit, whatever this input's shape
            check_fits(fp, batch_tokens, max_batch, longest, spec)
    if not fitted:
        fitted = {i: fit(engine, rows[i].text, limit, spec.too_long == "truncate") for i in good}
    errors = {i: f for i, f in fitted.items() if isinstance(f, str)}
    kept = {i: f for i, f in fitted.items() if isinstance(f, Fitted)}
    policy = clf.policy(spec.mode, batch_tokens, max_batch, spec.planner, cost)
    scheduler = Scheduler(engine, policy)
    for i, f in kept.items():
        scheduler.add(i, f.prompt)
    batches = scheduler.plan()
    shape = _largest(batches)
    if not recorded:
        check_fits(fp, *shape, spec)
    settings = asdict(spec) | {"batch_tokens": batch_tokens, "max_batch": max_batch,
                               "cost_model": cost.to_dict() if cost else None,
                               "item_limit": [limit.tokens, limit.source]}  # fmt: skip
    return JobPlan(
        settings, {i: f.prompt for i, f in kept.items()},
        {i: {"truncated": f.truncated} for i, f in kept.items() if f.truncated}, errors,
        batches, {i: f.tokens for i, f in kept.items()},
        fp.weight_bytes + fp.batch_cost(*shape).total, policy, cost,
    )  # fmt: skip


def _limit(clf: Classifier, spec: RunSpec, batch_tokens: int | None, recorded) -> Limit:
    """The per-item limit: the model's context, --max-tokens, a declared --batch-tokens, and
    what one item alone can use of the free memory (so an item too long for memory is a row
    error that --too-long truncate or --on-error skip can handle, not a failed job)."""
    if recorded:
        return Limit(int(recorded[0]), str(recorded[1]))
    engine = clf.engine
    source = f"--batch-tokens {batch_tokens}" if spec.batch_tokens else ""
    limit = item_limit(engine, spec.max_tokens, spec.batch_tokens, source)
    avail = available_bytes()
    fits = clf.footprint.longest_item(avail, context_limit(engine))
    if fits < limit.tokens:
        return Limit(max(fits, 1), f"the free memory ({avail / 2**30:.1f} GiB with the weights)")
    return limit


def _largest(batches: list[Batch]) -> tuple[int, int, int]:
    """(padded tokens, rows, width) of the largest batch of each kind: what memory must hold."""
    return (max((b.padded_tokens for b in batches), default=1),
            max((len(b.indices) for b in batches), default=1),
            max((b.width for b in batches), default=1))  # fmt: skip


def check_fits(fp: Footprint, tokens: int, rows: int, width: int, spec: RunSpec) -> None:
    """Refuse a batch shape whose memory exceeds what is available, naming the setting."""
    cost, avail = fp.batch_cost(tokens, rows, width), available_bytes()
    if fp.weight_bytes + cost.total <= avail:
        return
    if spec.batch_tokens:
        culprit = f"--batch-tokens {spec.batch_tokens}; lower it"
    elif spec.mode == "naive" or rows >= 256:
        culprit = f"--max-batch {spec.max_batch} (rows per batch); lower it"
    elif fp.label_len > 1 and cost.kv_cache > cost.activations:
        culprit = (f"{fp.n_labels} labels of up to {fp.label_len} tokens (each row's cache is "
                   "repeated per label); use fewer or shorter labels, or lower --max-batch")  # fmt: skip
    else:
        culprit = f"items of {width} tokens; set --max-tokens with --too-long truncate"
    raise JobError(
        f"one batch needs about {(fp.weight_bytes + cost.total) / 2**30:.1f} GiB with the "
        f"weights, more than the {avail / 2**30:.1f} GiB available: {culprit}"
    )
