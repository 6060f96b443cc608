"""`mlxbatch bench`: every mode on the same tickets in one process, against the gold loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..api.classifier import Classifier
from ..api.spec import RunSpec
from ..engine.engine import Engine
from ..engine.planner import (
    DEFAULT_MAX_BATCH,
    Batch,
    CostModel,
    global_max_stats,
    padding_stats,
    plan,
    plan_batches,
)
from ..engine.prompt import DEFAULT_LABELS
from ..engine.scheduler import score_all
from .llamacpp import LlamaCppOptions


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
    name: str, engine: Engine, prompts: list[list[int]], batches: list[Batch], scorer: str,
    reference: np.ndarray | None, useful_tokens: int, useful_flops: float, settings: dict,
    predict=None,
) -> tuple[ModeResult, np.ndarray]:  # fmt: skip
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
        name, seconds, len(prompts), processed, useful_tokens, stats.overhead,
        None if ref is None else float((probs.argmax(1) == ref.argmax(1)).mean()),
        None if ref is None else float(np.abs(probs - ref).max()), mx.get_peak_memory(),
        useful_flops, len(batches), settings, predicted,
    ), probs  # fmt: skip


def length_stats(lengths: list[int]) -> dict:
    arr = np.array(lengths)
    return {"median": float(np.median(arr)), "p90": float(np.percentile(arr, 90)),
            "max": int(arr.max()), "mean": float(arr.mean())}  # fmt: skip


MODE_NAMES = ("gold", "prefix", "naive", "sorted", "greedy", "sweep")


@dataclass(frozen=True)
class ModePlans:
    """The batches of each batched mode, cut from the same fed lengths when a mode asks (a
    greedy budget below the longest item raises then, not before)."""

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
    """The modes run so far on one set of prompts, each compared with the reference: the gold
    loop's probabilities, else the prefix-cache loop's, else none (no agreement claimed)."""

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
        res, probs = run_mode(name, self.engine, self.prompts, batches, scorer, self.reference,
                              self.useful_tokens, self.useful_flops, settings, self.predict)  # fmt: skip
        self.results.append(res)
        extra = f", predicted {res.predicted_seconds:.1f} s" if res.predicted_seconds else ""
        agree = "n/a (no reference run)" if res.agreement is None else f"{res.agreement:.1%}"
        self.progress(
            f"  {res.seconds:.1f} s{extra}, {res.items_per_s:.2f} items/s, agreement {agree}"
        )
        return probs


def run_sequential_modes(runs: ModeRuns, plans: ModePlans, modes) -> None:
    """The gold loop (whole prompts), then one row a batch through the prefix cache; the first
    of them to run is the reference of every later mode."""
    if "gold" in modes:
        whole = plan_batches([len(p) for p in runs.prompts], "sequential", 1 << 30, 1)
        runs.reference = runs.run("sequential (gold)", whole, scorer="gold")
    if "prefix" in modes:
        probs = runs.run("sequential + prefix cache", plans.sequential())
        runs.reference = probs if runs.reference is None else runs.reference


def run_batched_modes(
    runs: ModeRuns, plans: ModePlans, modes, batch_tokens: int, sweep: list[int]
) -> None:
    """Naive batches, the cost planner's (the default), greedy at `batch_tokens`, then greedy
    at each budget of `sweep` that fits the longest item."""
    if "naive" in modes:
        runs.run(f"naive (batch {plans.naive_batch})", plans.naive(), max_batch=plans.naive_batch)
    if "sorted" in modes:
        runs.run("sorted (default)", plans.by_cost(), batch_tokens=plans.cap,
                 max_batch=plans.max_batch, planner="cost")  # fmt: skip
    greedy = [batch_tokens] if "greedy" in modes else []
    if "sweep" in modes:
        greedy += [b for b in sweep if b != batch_tokens and b >= max(plans.fed)]
    for b in greedy:
        runs.run(f"sorted, greedy {b}", plans.greedy(b), batch_tokens=b,
                 max_batch=plans.max_batch, planner="greedy")  # fmt: skip


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
    clf: Classifier, texts: list[str], batch_tokens: int, max_batch: int, naive_batch: int,
    sweep: list[int], progress=print, modes=MODE_NAMES, cost: CostModel | None = None,
) -> dict:  # fmt: skip
    """Every requested mode on the same prompts, each against the gold loop's probabilities.

    gold: the sequential gold loop; prefix: one row per batch through the prefix cache; naive:
    fixed-size batches in input order; sorted: the cost planner (the default); greedy: budget
    filling at `batch_tokens`; sweep: greedy at each budget of `sweep`.
    """
    prompts = [clf.engine.prompt(t) for t in texts]
    tok_lengths = [len(clf.lm.tokenizer.encode(t)) for t in texts]
    fed = clf.engine.fed_lengths(prompts)
    u_tokens, u_flops = useful(clf, prompts)
    cost = cost or clf.cost_model()
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


def load_tickets(spec: str, mix: str = "default") -> tuple[list[str], str]:
    """A JSONL/CSV/text file, or a count of built-in synthetic tickets of a mix."""
    from ..errors import InputError
    from ..io.inputs import describe_errors, read_rows
    from .workload import generate

    if spec.isdigit():
        return [
            t["text"] for t in generate(int(spec), 0, mix)
        ], f"{spec} synthetic tickets ({mix} mix, seed 0)"
    rows, fmt = read_rows(spec)
    if any(r.error for r in rows):
        raise InputError(describe_errors(rows, spec, fmt))
    return [r.text for r in rows], spec


@dataclass
class BenchOptions:
    model: Path | None = None
    tickets: str = "600"
    mix: str = "default"
    labels: tuple[str, ...] = DEFAULT_LABELS
    system_prompt: str | None = None  # None: the default prompt for `labels`
    descriptions: dict[str, str] | None = None  # label -> one line, for the default prompt
    examples: tuple[tuple[str, str], ...] = ()
    prompt_name: str = "default"
    batch_tokens: int | None = None  # the greedy budget compared against (default: preferred)
    max_batch: int = DEFAULT_MAX_BATCH
    naive_batch: int = 16
    sweep: tuple[int, ...] = ()
    modes: tuple[str, ...] = MODE_NAMES
    peers: tuple[str, ...] = ()
    # transformers' sorted batches: its own budget, not mlxbatch's (whole prompts, one
    # multi-threaded forward a batch); fp32 ran 57.0 s at 4096 and 68.6 s at 2048 on the
    # default 120 (bench/default-120.txt, bench/default-120-peers-at-2048.txt)
    peer_batch_tokens: int = 4096
    llama_cpp: LlamaCppOptions = LlamaCppOptions()  # the llama.cpp peers' converter and threads
    quick: bool = False
    calibrate: bool = True
    against: Path | None = None
    json_path: Path | None = None
    plot_path: Path | None = None


def bench_job(o: BenchOptions, resolve, progress=print) -> tuple[dict, str]:
    """The whole `bench` command: model, tickets, calibration, modes, peers, report, files."""
    import tempfile

    from ..io.outputs import write_json_report
    from .against import against
    from .doctor import report as doctor_report
    from .report import format_report, plot

    with tempfile.TemporaryDirectory() as tmp:
        model, tickets, llama = bench_inputs(o, Path(tmp))
        texts, source = load_tickets(tickets, o.mix)
        clf = Classifier.load(resolve(model), o.labels, o.system_prompt, examples=o.examples,
                              descriptions=o.descriptions)  # fmt: skip
        prompts = [clf.engine.prompt(t) for t in texts]
        greedy = greedy_budget(clf, clf.engine.fed_lengths(prompts), o.batch_tokens, o.max_batch)
        info = doctor_report(2048 if not o.quick else 512)
        cost, calib = planner_cost(clf, o.calibrate, progress)
        result = run_bench(clf, texts, greedy, o.max_batch, o.naive_batch, list(o.sweep),
                           progress, o.modes, cost)  # fmt: skip
        result["calibration"] = calib
        result["meta"] = bench_meta(clf, source, o.prompt_name, info)
        result.update(peers_entry(o, clf, prompts, result["gold_labels"], llama, progress))
        if o.against:
            result["against"] = against(clf, texts, o.max_batch, resolve(o.against), progress)
    text = format_report(result)
    if o.json_path:
        write_json_report(o.json_path, result)
    if o.plot_path:
        plot(result, o.plot_path, [len(clf.lm.tokenizer.encode(t)) for t in texts])
    return result, text


def bench_inputs(o: BenchOptions, tmp: Path) -> tuple[Path | None, str, LlamaCppOptions]:
    """The model, tickets and llama.cpp options of a run; with --quick, a tiny random model in
    `tmp`, 60 tickets unless others were asked for, and the GGUFs of that model in `tmp`."""
    if not o.quick:
        return o.model, o.tickets, o.llama_cpp
    from ..model.convert import init_random

    model = tmp / "tiny"
    init_random(model, preset="tiny", seed=0, dtype="float32")
    tickets = "60" if o.tickets == "600" else o.tickets
    llama = replace(o.llama_cpp, cache=o.llama_cpp.cache or tmp / "gguf")  # a model of this run
    return model, tickets, llama


def greedy_budget(clf: Classifier, fed: list[int], batch_tokens: int | None, max_batch: int) -> int:
    """The greedy budget compared against: the one given, else the free memory's; refused
    when the longest ticket does not fit it (a traceback from the planner before)."""
    from ..errors import UsageError

    greedy = batch_tokens or clf.engine.default_budget(max_batch, max(fed))
    if greedy < max(fed):
        raise UsageError(f"the free memory allows batches of {greedy} tokens, fewer than the "
                         f"longest ticket's {max(fed)}: free some memory or set "
                         f"--batch-tokens")  # fmt: skip
    return greedy


def planner_cost(clf: Classifier, calibrate_now: bool, progress) -> tuple[CostModel, dict | None]:
    """The planner's cost model and the calibration run for it (None: none ran): without
    calibrating, the cached model or the defaults, never a first job's calibration."""
    from ..engine.calibration import cached, calibrate, default_model, describe

    if calibrate_now:
        return calibrate(clf.engine, progress)
    cost = cached(clf.engine) or default_model(clf.engine)
    progress(f"planner: {describe(cost)}")
    return cost, None


def bench_meta(clf: Classifier, source: str, prompt_name: str, info: dict) -> dict:
    """What ran: the model, tickets and prompt, on the machine `doctor` describes."""
    return {
        "model": clf.lm.describe(), "tickets": source, "prompt": prompt_name,
        "device": info["device"], "device_name": info["device_name"], "dtype": info["dtype"],
        "blas": info["blas_kernels"] or info["blas"],
        "peak_matmul_gflops": info[f"matmul_gflops_{info['dtype']}"], "doctor": info,
    }  # fmt: skip


def peers_entry(
    o: BenchOptions, clf: Classifier, prompts: list[list[int]], gold_labels: list[str],
    llama: LlamaCppOptions, progress,
) -> dict:  # fmt: skip
    """The report's `peers` entry: their runs against the reference's labels, or why they
    cannot run; none when no peer was asked for or no reference ran."""
    from .peers import run_peers

    if o.peers and clf.labels.max_len > 1:
        return {"peers": [{"name": "peers", "error": "peers score single-token labels only"}]}
    if not (o.peers and gold_labels):
        return {}
    names = list(clf.labels.names)
    gold = [names.index(x) for x in gold_labels]
    return {"peers": run_peers(clf.lm.path, prompts, clf.labels.first_ids, gold,
                               o.peer_batch_tokens, o.max_batch, o.naive_batch, o.peers,
                               progress, llama)}  # fmt: skip
