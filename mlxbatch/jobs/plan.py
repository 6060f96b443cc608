"""What a file job decides before computing, as a pure function of its inputs: the per-row
outcomes (prompts, truncations, rows refused as too long), the batch shape (the journal's
recorded one on resume, so truncation and batches are exactly the first run's), the batches
(indexed by input row, the one index space), and the memory check that names the setting to
change. Rows are never modified: outcomes are returned.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..api.classifier import Classifier
from ..api.limits import Fitted, Limit, context_limit, fit, item_limit
from ..api.spec import RunSpec
from ..engine.footprint import Footprint
from ..engine.planner import Batch, CostModel, PaddingStats
from ..engine.scheduler import BatchPolicy, Scheduler
from ..errors import JobError
from ..io.inputs import Row
from ..runtime.memory import available_bytes


@dataclass(frozen=True)
class JobShape:
    """What a job decides once, for every window, and records in its journal: the batch shape,
    the cost model, the per-item limit and the window size (a resumed job plans each window
    exactly as the first run did)."""

    batch_tokens: int
    max_batch: int
    cost: CostModel | None
    limit: Limit
    window: int

    def settings(self, spec: RunSpec) -> dict:
        return asdict(spec) | {"batch_tokens": self.batch_tokens, "max_batch": self.max_batch,
                               "cost_model": self.cost.to_dict() if self.cost else None,
                               "item_limit": [self.limit.tokens, self.limit.source],
                               "window": self.window}  # fmt: skip


@dataclass
class JobPlan:
    settings: dict  # what the journal records: the run spec and its batch shape
    prompts: dict[int, list[int]]  # scored input row -> prompt tokens (truncated if asked)
    extras: dict[int, dict]  # input row -> extra output fields (truncation)
    errors: dict[int, str]  # input row -> why planning refused it (too long)
    batches: list[Batch]  # indices are input rows
    fed: dict[int, int]  # scored input row -> tokens it feeds beyond the shared prefix
    memory_bound: int
    policy: BatchPolicy  # how the scheduler scores the batches
    cost: CostModel | None = None  # the cost planner's model (None for the other planners)
    copies: dict[int, list[int]] = field(default_factory=dict)  # scored row -> its duplicates

    def predicted_seconds(self, terms: tuple[int, int, int]) -> float | None:
        """The cost model's time for these batches (`terms`: `Engine.cost_terms`)."""
        if self.cost is None:
            return None
        return self.cost.plan_seconds(self.batches, *terms)

    @property
    def batch_tokens(self) -> int:
        return self.settings["batch_tokens"]

    @property
    def duplicates(self) -> int:
        return sum(len(c) for c in self.copies.values())

    @property
    def useful_tokens(self) -> int:
        return sum(self.fed.values())

    @property
    def padded_tokens(self) -> int:
        return sum(b.padded_tokens for b in self.batches)

    @property
    def padding_overhead(self) -> float:
        return PaddingStats(self.useful_tokens, self.padded_tokens).overhead


def planner_label(mode: str, planner: str, cost: CostModel | None) -> str:
    """The planner in words, for the summary: the sorted mode's alone (the other modes name
    theirs), with where its cost model came from."""
    if mode != "sorted":
        return ""
    return planner + (f" ({cost.source})" if cost else "")


def job_shape(clf: Classifier, spec: RunSpec, recorded: dict | None) -> JobShape:
    """The shape of a job: the interrupted run's (`recorded`), else decided from the spec and
    this machine, independently of the input (so every window gets the same one)."""
    if recorded:
        cost = CostModel.from_dict(recorded["cost_model"]) if recorded.get("cost_model") else None
        limit = Limit(int(recorded["item_limit"][0]), str(recorded["item_limit"][1]))
        return JobShape(recorded["batch_tokens"], recorded["max_batch"], cost, limit,
                        int(recorded.get("window") or spec.window))  # fmt: skip
    limit = _limit(clf, spec)
    # the device's preferred budget; a plan raises it to fit its longest item (scheduler.py)
    budget = spec.batch_tokens or clf.engine.default_budget(spec.max_batch, 1)
    cost = clf.cost_model() if spec.step.planner == "cost" else None
    return JobShape(budget, spec.max_batch, cost, limit, spec.window)


def check_declared(clf: Classifier, spec: RunSpec, shape: JobShape) -> None:
    """A budget the user declared must fit memory, whatever the input's shape (a new run's
    check: a resumed one keeps its recorded shape)."""
    if spec.batch_tokens:
        budget = shape.batch_tokens
        check_fits(clf.footprint, budget, shape.max_batch, min(shape.limit.tokens, budget), spec)


def plan_window(
    clf: Classifier, rows: list[Row], start: int, spec: RunSpec, shape: JobShape,
    check_memory: bool = True, prompts: list[list[int]] | None = None,
) -> JobPlan:  # fmt: skip
    """The plan of rows [start, start + len(rows)) of a job: each row's outcome, and batches
    of the rows to score, keyed by input row. Rows whose prompts are identical token for token
    are scored once (the same tokens give the same answer); the others copy its result.
    `prompts`: the prompts of the rows without an error, when tokenized ahead."""
    engine, fp = clf.engine, clf.footprint
    truncating = spec.too_long == "truncate"
    good = [(start + i, r.text) for i, r in enumerate(rows) if not r.error]
    if prompts is None:  # `prompts`: the good rows' prompts, tokenized ahead (job.py)
        prompts = engine.prompts([text for _, text in good])
    fitted = {i: fit(engine, text, shape.limit, truncating, prompt)
              for (i, text), prompt in zip(good, prompts)}  # fmt: skip
    errors = {i: f for i, f in fitted.items() if isinstance(f, str)}
    kept = {i: f for i, f in fitted.items() if isinstance(f, Fitted)}
    first: dict[tuple[int, ...], int] = {}  # a window's prompts -> the row that scores them
    copies: dict[int, list[int]] = {}
    for i, f in kept.items():
        rep = first.setdefault(tuple(f.prompt), i)
        if rep != i:
            copies.setdefault(rep, []).append(i)
    scored = {i: f for i, f in kept.items() if first[tuple(f.prompt)] == i}
    policy = clf.policy(spec.mode, shape.batch_tokens, shape.max_batch, spec.planner, shape.cost)
    batches = Scheduler(engine, policy, ((i, f.prompt) for i, f in scored.items())).plan()
    largest = _largest(batches)
    if check_memory:
        check_fits(fp, *largest, spec)
    return JobPlan(
        shape.settings(spec), {i: f.prompt for i, f in scored.items()},
        {i: {"truncated": f.truncated} for i, f in kept.items() if f.truncated}, errors,
        batches, {i: f.tokens for i, f in scored.items()},
        fp.weight_bytes + fp.batch_cost(*largest).total, policy, shape.cost, copies,
    )  # fmt: skip


def _limit(clf: Classifier, spec: RunSpec) -> Limit:
    """The per-item limit: the model's context, --max-tokens, a declared --batch-tokens, and
    what one item alone can use of the free memory (so an item too long for memory is a row
    error that --too-long truncate or --on-error skip can handle, not a failed job)."""
    engine = clf.engine
    source = f"--batch-tokens {spec.batch_tokens}" if spec.batch_tokens else ""
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
