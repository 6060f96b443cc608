"""A run's options (`RunSpec`, as asked) and its settings (`Settings`, resolved once from
them): every entry builds a RunSpec and calls `resolve_settings` once; everything below reads
the Settings."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from numbers import Integral

from ..engine.engine import Engine
from ..engine.footprint import Footprint
from ..engine.planner import DEFAULT_MAX_BATCH, MODE_ALIASES, MODES, SORTED_PLANNERS, CostModel
from ..engine.scheduler import BatchPolicy
from ..errors import JobError, ResumeError, UsageError
from ..runtime.memory import amount, available_bytes, available_source
from .limits import LIMIT_SETTINGS, Limit, context_limit

TOO_LONG = ("error", "truncate")
ON_ERROR = ("fail", "skip")
# A window also ends once its texts reach this many characters, so its memory does not grow
# with the texts' length; windows change no score, only the planning.
WINDOW_CHARS = 1 << 23


@dataclass(frozen=True)
class RunSpec:
    """A run's options as asked; errors name an option as the Python API's keyword, which the
    CLI words as its flag (`UsageError.worded`)."""

    mode: str = "sorted"  # a mode of the table (engine/scheduler.py), or an alias read as it
    planner: str = "cost"  # sorted mode: "cost" (least predicted time) or "greedy" (fill budget)
    batch_tokens: int | None = None  # None: the device's preferred budget (see footprint.py)
    max_batch: int = DEFAULT_MAX_BATCH
    max_tokens: int | None = None  # per-item limit on fed tokens
    too_long: str = "error"
    on_error: str = "fail"
    verify_sample: float = 0.0  # share of items re-scored on the gold loop
    window: int = 16384  # rows read, planned and written at a time (memory flat in the job)
    progress_every: float | None = None  # off a terminal: a progress line every N s (the demo)

    def __post_init__(self) -> None:
        def choice(name: str, value, options) -> None:
            if value not in options:
                raise UsageError(
                    f"`{name}` {value!r} is not one of {', '.join(map(str, options))}", (name,)
                )

        if isinstance(self.mode, str) and self.mode in MODE_ALIASES:  # one word a mode
            object.__setattr__(self, "mode", MODE_ALIASES[self.mode])
        choice("mode", self.mode, tuple(MODES))
        choice("planner", self.planner, SORTED_PLANNERS)
        choice("too_long", self.too_long, TOO_LONG)
        choice("on_error", self.on_error, ON_ERROR)
        for name in ("batch_tokens", "max_batch", "max_tokens", "window"):
            value = getattr(self, name)
            if value is None and name in ("max_batch", "window"):  # no default to fall back on
                raise UsageError(f"`{name}` must be a positive whole number, not None", (name,))
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, Integral) or value < 1
            ):
                raise UsageError(
                    f"`{name}` must be a positive whole number, not {value!r}", (name,)
                )
            if value is not None:  # NumPy's integers too, kept as int (the journal records it)
                object.__setattr__(self, name, int(value))
        if isinstance(self.verify_sample, bool) or not 0 <= self.verify_sample <= 1:
            raise UsageError(
                f"`verify_sample` {self.verify_sample!r} is not between 0 and 1",
                ("verify_sample",),
            )


@dataclass(frozen=True)
class Settings:
    """A run's settings, resolved once (`resolve_settings`): policy (planner, scorer, budget, cost
    model), per-item limit, window, labels, prompt. A file job records it in its journal; a
    resume reads it back (`from_record`), and ranks receive rank 0's."""

    spec: RunSpec  # the options as asked
    policy: BatchPolicy  # planner, scorer, budget, max_batch, cost model
    limit: Limit  # the per-item limit on fed tokens, and the setting that imposes it
    window: int  # rows read, planned and written at a time
    labels: tuple[str, ...]
    system_prompt: str
    examples: tuple[tuple[str, str], ...] = ()
    # the characters of text at which a window also ends (io/windows.py); None: at its rows
    # alone, as a journal written before the bound was resumes
    window_chars: int | None = None

    @property
    def truncating(self) -> bool:
        return self.spec.too_long == "truncate"

    @property
    def checking(self) -> bool:
        """Whether scored items are verified against the gold loop (all, or a sample)."""
        return bool(self.spec.verify_sample)

    def resume_record(self) -> list:
        """What a resume takes from the journal instead of resolving (the fingerprint covers
        it: a journal whose recorded shape was edited is refused, not followed)."""
        p = self.policy
        return [
            p.batch_tokens,
            p.max_batch,
            p.cost.to_dict() if p.cost else None,
            [self.limit.tokens, self.limit.source],
            self.window,
            *([self.window_chars] if self.window_chars else []),
        ]

    def record(self) -> dict:
        """What a journal records (the options, with the budget, cost model, item limit and
        window as resolved): `resolve_settings` makes the same settings from it."""
        p, cost = self.policy, self.policy.cost
        return asdict(self.spec) | {
            "batch_tokens": p.batch_tokens,
            "max_batch": p.max_batch,
            "cost_model": cost.to_dict() if cost else None,
            "item_limit": [self.limit.tokens, self.limit.source],
            "window": self.window,
            "window_chars": self.window_chars,
        }

    def planner_label(self) -> str:
        """The planner in words, for the summary: the sorted mode's alone (the other modes name
        theirs), with where its cost model came from."""
        if self.spec.mode != "sorted":
            return ""
        cost = self.policy.cost
        return self.policy.planner + (f" ({cost.source})" if cost else "")


def resolve_settings(
    engine: Engine,
    spec: RunSpec,
    recorded: dict | None = None,
    cost: CostModel | Callable[[], CostModel] | None = None,
    limit: Limit | None = None,
) -> Settings:
    """The settings of a run on `engine` under `spec`: a journal's (`recorded`, on a resume),
    else resolved here, the same for every window. `cost`: the cost planner's model or how to
    look it up; `limit`: the item limit measured earlier, if any."""
    planner = BatchPolicy.step(spec.mode, spec.planner)[0]
    if recorded is not None:
        budget, max_batch, cost, limit, window, window_chars = _recorded(recorded, spec)
    else:
        limit = limit or item_limit(engine, spec)
        window, window_chars = spec.window, WINDOW_CHARS
        max_batch = engine.footprint.most_rows(spec.max_batch)  # (rows heavy with labels)
        budget = spec.batch_tokens or engine.default_budget(spec.max_batch, 1)
        if planner != "cost":
            cost = None
        elif callable(cost):
            cost = cost()
        if spec.batch_tokens:  # a declared budget must fit memory, whatever the input
            check_fits(engine.footprint, budget, max_batch, min(limit.tokens, budget), spec)
    policy = BatchPolicy.of_mode(spec.mode, spec.planner, budget, max_batch, cost)
    return Settings(
        spec,
        policy,
        limit,
        window,
        engine.labels.names,
        engine.system_prompt,
        engine.examples,
        window_chars,
    )


def _recorded(recorded: dict, spec: RunSpec) -> tuple:
    """(budget, max_batch, cost model, item limit, window, window_chars) as a journal recorded
    them, each checked: a journal is a file a person can edit."""
    try:
        limit = recorded["item_limit"]
        if not isinstance(limit, list) or len(limit) != 2 or not isinstance(limit[1], str):
            raise ValueError(f"item_limit {limit!r}")
        window = recorded["window"] if "window" in recorded else spec.window  # 0 is refused
        chars = recorded.get("window_chars")  # absent or null: a journal from before the bound
        return (
            _count("batch_tokens", recorded["batch_tokens"]),
            _count("max_batch", recorded["max_batch"]),
            _cost(recorded.get("cost_model")),
            Limit(_count("item_limit", limit[0]), limit[1]),
            _count("window", window),
            None if chars is None else _count("window_chars", chars),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ResumeError(
            f"the journal's recorded settings are unreadable ({e}); delete the "
            "journal to start over"
        ) from None


def _count(name: str, value) -> int:
    """A recorded whole number of at least 1 that a run could have written."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= sys.maxsize:
        raise ValueError(f"{name} {value!r}")
    return value


def _cost(recorded) -> CostModel | None:
    """A recorded cost model: finite, non-negative constants and whole lanes."""
    if not recorded:
        return None
    return CostModel.from_dict(recorded)  # ValueError: one no calibration writes


def item_limit(engine: Engine, spec: RunSpec) -> Limit:
    """The per-item limit: the model's context, max_tokens, a declared batch_tokens, and
    what one item alone can use of the free memory (so an item too long for memory is a row
    error that --too-long truncate or --on-error skip can handle, not a failed job)."""
    key = engine.lm.model.args.context_key
    options = [(context_limit(engine), f"the model's context ({key})")]
    if spec.max_tokens:
        options.append((spec.max_tokens, f"`max_tokens={spec.max_tokens}`"))
    if spec.batch_tokens:
        options.append((spec.batch_tokens, f"`batch_tokens={spec.batch_tokens}`"))
    tokens, source = min(options, key=lambda x: x[0])
    avail, fp = available_bytes(), engine.footprint
    fits, share = fp.longest_item(avail, context_limit(engine)), "half of what the weights leave of"
    if fits < 1:  # not even in half: all of it, as before (a job that ran still runs)
        fits, share = (
            fp.longest_item(avail, context_limit(engine), share=1.0),
            "what the weights leave of",
        )
    if fits < 1:  # no row can run: one error for the job, not one "over the limit of 1" a row
        raise JobError(
            f"{available_source()} ({amount(avail)}) holds not even one item of one "
            f"token: {_what_needs(fp, fp.batch_cost(1, 1, 1), avail)}"
        )
    if fits < tokens:
        return Limit(fits, f"{share} {available_source()} ({amount(avail)} with them)")
    return Limit(tokens, source)


def _what_needs(fp: Footprint, cost, avail: int) -> str:
    """What takes the memory of a batch costing `cost`, and what to change, in words."""
    if fp.weight_bytes >= avail:
        return f"the weights alone need {amount(fp.weight_bytes)}"
    needs = f"it needs about {amount(cost.total)} beside the weights ({amount(fp.weight_bytes)})"
    if fp.segment_slots:
        return (
            f"{needs} for {fp.segment_slots} slots a text of the questions' multi-token labels; "
            "use fewer or shorter labels"
        )
    if fp.labels_copied:
        return (
            f"{needs} for {fp.n_labels} labels of up to {fp.label_len} tokens (each row's cache "
            "and scores are repeated per label); use fewer or shorter labels"
        )
    return f"{needs}; free memory, or shorten the prompt before each item (system prompt, examples)"


def check_fits(fp: Footprint, tokens: int, rows: int, width: int, spec: RunSpec) -> None:
    """Refuse a batch shape whose memory exceeds what is available, naming the setting."""
    cost, avail = fp.batch_cost(tokens, rows, width), available_bytes()
    if fp.weight_bytes + cost.total <= avail:
        return
    if spec.batch_tokens:
        culprit = f"`batch_tokens={spec.batch_tokens}`; lower it"
    elif spec.mode == "naive" or rows >= 256:
        culprit = f"`max_batch={spec.max_batch}` (rows per batch); lower it"
    elif fp.segment_slots and rows * fp.segment_slots > tokens:
        culprit = (
            f"{fp.segment_slots} slots a text of the questions' multi-token labels; use fewer "
            "or shorter labels, or lower `max_batch`"
        )
    elif fp.labels_copied and cost.kv_cache > cost.activations:
        culprit = (
            f"{fp.n_labels} labels of up to {fp.label_len} tokens (each row's cache is "
            "repeated per label); use fewer or shorter labels, or lower `max_batch`"
        )
    else:
        culprit = f"items of {width} tokens; set `max_tokens` with `too_long=truncate`"
    raise JobError(
        f"one batch needs about {amount(fp.weight_bytes + cost.total)} with the weights, more "
        f"than the {amount(avail)} of {available_source()}: {culprit}",
        LIMIT_SETTINGS,
    )
