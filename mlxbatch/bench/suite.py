"""`mlxbatch bench`: every mode on the same tickets in one process, against the gold loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import mlx.core as mx
import numpy as np

from ..api.classifier import Classifier
from ..api.spec import RunSpec
from ..engine.engine import Engine
from ..engine.planner import (
    MODE_ALIASES,
    Batch,
    CostModel,
    global_max_stats,
    padding_stats,
    plan,
    plan_batches,
)
from ..engine.scheduler import score_all


@dataclass
class ModeResult:
    name: str
    seconds: float
    items: int
    processed_tokens: int  # every token fed through the model, padding and prefixes included
    useful_tokens: int  # the least an exact method must feed: the prefix once + every item's own
    padding_overhead: float
    agreement: float | None  # label agreement with the gold loop (None: no reference ran)
    max_abs_diff: float | None  # largest |probability difference| from the gold loop
    peak_memory: int
    useful_flops: float
    batches: int
    settings: dict = field(default_factory=dict)
    predicted_seconds: float | None = None  # the cost model's prediction for these batches

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds


def flops_per_item(clf: Classifier, start: int, n: int) -> float:
    """Forward FLOPs of `n` tokens at positions [start, start + n): matmuls + attention."""
    a = clf.lm.model.args
    pairs = n * start + n * (n + 1) / 2  # each token attends to the keys up to its own
    return a.flops_per_token * n + a.flops_per_token_key * pairs


def useful(clf: Classifier, prompts: list[list[int]]) -> tuple[int, float]:
    """Useful tokens and FLOPs: the shared prefix once, then each item's own tokens."""
    P = len(clf.engine.tokenizer.shared_prefix(clf.system_prompt, clf.examples))
    tokens, flops = P, flops_per_item(clf, 0, P)
    for p in prompts:
        k = min(P, len(p) - 1)
        tokens += len(p) - k
        flops += flops_per_item(clf, k, len(p) - k)
    return tokens, flops


def run_mode(
    name: str,
    engine: Engine,
    prompts: list[list[int]],
    batches: list[Batch],
    scorer: str,
    reference: np.ndarray | None,
    useful_tokens: int,
    useful_flops: float,
    settings: dict,
    predict=None,
) -> tuple[ModeResult, np.ndarray]:
    """Time one mode; `predict(batches)`: the cost model's time for them (None: not shown)."""
    mx.synchronize()
    mx.reset_peak_memory()
    t = time.perf_counter()
    probs = score_all(engine, prompts, batches, scorer)
    seconds = time.perf_counter() - t
    gold = scorer == "gold"
    fed = [len(p) for p in prompts] if gold else engine.fed_lengths(prompts)
    stats = padding_stats(fed, batches)
    processed = stats.processed_tokens + (0 if gold else len(engine.prefix))
    ref = probs if reference is None and gold else reference  # the gold loop is its own
    predicted = predict(batches) if predict is not None and not gold else None
    return ModeResult(
        name,
        seconds,
        len(prompts),
        processed,
        useful_tokens,
        stats.overhead,
        None if ref is None else float((probs.argmax(1) == ref.argmax(1)).mean()),
        None if ref is None else float(np.abs(probs - ref).max()),
        mx.get_peak_memory(),
        useful_flops,
        len(batches),
        settings,
        predicted,
    ), probs


def length_stats(lengths: list[int]) -> dict:
    arr = np.array(lengths)
    return {
        "median": float(np.median(arr)),
        "p90": float(np.percentile(arr, 90)),
        "max": int(arr.max()),
        "mean": float(arr.mean()),
    }


# bench's modes: the mode table's words (engine/planner.py) and its own comparisons (greedy at
# the given budget, a sweep of budgets); the table's other words are read as theirs
MODE_NAMES = ("sequential", "sequential-prefix", "naive", "sorted", "greedy", "sweep")


def bench_modes(words) -> tuple[str, ...]:
    """`words` as bench's mode names (`gold` is `sequential`, `prefix` is `sequential-prefix`)."""
    return tuple(MODE_ALIASES.get(w, w) for w in words)


@dataclass(frozen=True)
class ModePlans:
    """The batches of each batched mode, cut from the same fed lengths when a mode asks."""

    fed: list[int]
    cap: int  # the sorted mode's budget: what the free memory allows
    max_batch: int
    naive_batch: int
    cost: CostModel
    terms: tuple[int, int, int]  # prefix, label rows, label tokens

    def sequential(self) -> list[Batch]:
        return plan_batches(self.fed, "sequential", 1 << 30, 1)

    def naive(self) -> list[Batch]:
        return plan_batches(self.fed, "naive", 1 << 30, self.naive_batch)

    def by_cost(self) -> list[Batch]:
        return plan(self.fed, "cost", self.cap, self.max_batch, self.cost, *self.terms)

    def greedy(self, budget: int) -> list[Batch]:
        return plan_batches(self.fed, "greedy", budget, self.max_batch)

    def predicted_seconds(self, batches: list[Batch]) -> float:
        return self.cost.plan_seconds(batches, *self.terms)


@dataclass
class ModeRuns:
    """The modes run on one set of prompts, each against the gold loop (else the prefix loop)."""

    engine: Engine
    prompts: list[list[int]]
    useful_tokens: int
    useful_flops: float
    predict: Callable[[list[Batch]], float]
    progress: Callable[[str], None]
    reference: np.ndarray | None = None
    results: list[ModeResult] = field(default_factory=list)

    def run(self, name: str, batches: list[Batch], scorer: str = "fast", **settings) -> np.ndarray:
        """Time one mode and say how it went; its probabilities."""
        self.progress(f"running {name} ({len(batches)} batches) ...")
        res, probs = run_mode(
            name,
            self.engine,
            self.prompts,
            batches,
            scorer,
            self.reference,
            self.useful_tokens,
            self.useful_flops,
            settings,
            self.predict,
        )
        self.results.append(res)
        extra = f", predicted {res.predicted_seconds:.1f} s" if res.predicted_seconds else ""
        agree = "n/a (no reference run)" if res.agreement is None else f"{res.agreement:.1%}"
        self.progress(
            f"  {res.seconds:.1f} s{extra}, {res.items_per_s:.2f} items/s, agreement {agree}"
        )
        return probs


def run_sequential_modes(runs: ModeRuns, plans: ModePlans, modes) -> None:
    """The gold loop, then one row a batch through the prefix cache; the first is the reference."""
    if "sequential" in modes:
        whole = plan_batches([len(p) for p in runs.prompts], "sequential", 1 << 30, 1)
        runs.reference = runs.run("sequential (gold)", whole, scorer="gold")
    if "sequential-prefix" in modes:
        probs = runs.run("sequential + prefix cache", plans.sequential())
        runs.reference = probs if runs.reference is None else runs.reference


def run_batched_modes(
    runs: ModeRuns, plans: ModePlans, modes, batch_tokens: int, sweep: list[int]
) -> None:
    """Naive, the cost planner's, greedy at `batch_tokens`, then greedy at each `sweep` budget."""
    if "naive" in modes:
        runs.run(f"naive (batch {plans.naive_batch})", plans.naive(), max_batch=plans.naive_batch)
    if "sorted" in modes:
        runs.run(
            "sorted (default)",
            plans.by_cost(),
            batch_tokens=plans.cap,
            max_batch=plans.max_batch,
            planner="cost",
        )
    greedy = [batch_tokens] if "greedy" in modes else []
    if "sweep" in modes:
        greedy += [b for b in sweep if b != batch_tokens and b >= max(plans.fed)]
    for b in greedy:
        runs.run(
            f"sorted, greedy {b}",
            plans.greedy(b),
            batch_tokens=b,
            max_batch=plans.max_batch,
            planner="greedy",
        )


def padding_tax(plans: ModePlans, batch_tokens: int, sweep: list[int]) -> dict:
    """Processed over useful tokens under each planner; the padding share at each budget."""
    fed, by_cost = plans.fed, plans.by_cost()
    return {
        "global_max_factor": global_max_stats(fed).factor,
        "naive_factor": padding_stats(fed, plans.naive()).factor,
        "greedy_factor": padding_stats(fed, plans.greedy(batch_tokens)).factor,
        "sorted_factor": padding_stats(fed, by_cost).factor,
        "sweep": {
            b: padding_stats(fed, plans.greedy(b)).overhead
            for b in sorted({*sweep, batch_tokens})
            if b >= max(fed)
        },
    }


def run_bench(
    clf: Classifier,
    texts: list[str],
    batch_tokens: int,
    max_batch: int,
    naive_batch: int,
    sweep: list[int],
    progress=print,
    modes=MODE_NAMES,
    cost: CostModel | None = None,
) -> dict:
    """Every requested mode on the same prompts, each against the gold loop's probabilities."""
    prompts = [clf.engine.prompt(t) for t in texts]
    tok_lengths = [len(clf.lm.tokenizer.encode(t)) for t in texts]
    fed = clf.engine.fed_lengths(prompts)
    u_tokens, u_flops = useful(clf, prompts)
    cost, modes = cost or clf.cost_model(), bench_modes(modes)
    terms = clf.engine.cost_terms()  # prefix, label rows, label tokens
    # the sorted mode's budget as classify resolves it (one rule), raised to fit the longest
    cap = max(clf.settings(RunSpec(max_batch=max_batch), cost=cost).policy.batch_tokens, max(fed))
    plans = ModePlans(fed, cap, max_batch, naive_batch, cost, terms)
    runs = ModeRuns(clf.engine, prompts, u_tokens, u_flops, plans.predicted_seconds, progress)
    run_sequential_modes(runs, plans, modes)
    run_batched_modes(runs, plans, modes, batch_tokens, sweep)
    ref = runs.reference
    return {
        "items": len(prompts),
        "prefix_tokens": len(clf.engine.tokenizer.shared_prefix(clf.system_prompt, clf.examples)),
        "ticket_tokens": length_stats(tok_lengths),
        "fed_tokens": length_stats(fed),
        "cost_model": cost.to_dict(),
        "padding_tax": padding_tax(plans, batch_tokens, sweep),
        "modes": [asdict(r) | {"items_per_s": r.items_per_s} for r in runs.results],
        "gold_labels": [clf.labels.names[i] for i in ref.argmax(1)] if ref is not None else [],
    }
