"""The `bench` command as one call: its options, the model and tickets it runs on, the
planner's cost model, the modes (suite.run_bench), the peers, the report and its files."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..api.classifier import Classifier
from ..engine.planner import DEFAULT_MAX_BATCH, CostModel
from ..engine.promptspec import PromptSpec
from .llamacpp import LlamaCppOptions
from .suite import MODE_NAMES, run_bench


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
    prompt: PromptSpec = field(default_factory=PromptSpec)  # labels, system prompt, examples
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
    from ..model.load import read_config
    from .against import against
    from .doctor import report as doctor_report
    from .report import format_report, plot

    with tempfile.TemporaryDirectory() as tmp:
        model, tickets, llama = bench_inputs(o, Path(tmp))
        texts, source = load_tickets(tickets, o.mix)
        clf = Classifier.load(resolve(model), prompt=o.prompt)
        prompts = [clf.engine.prompt(t) for t in texts]
        greedy = greedy_budget(clf, clf.engine.fed_lengths(prompts), o.batch_tokens, o.max_batch)
        info = doctor_report(2048 if not o.quick else 512, read_config(clf.lm.path))
        cost, calib = planner_cost(clf, o.calibrate, progress)
        result = run_bench(
            clf, texts, greedy, o.max_batch, o.naive_batch, list(o.sweep), progress, o.modes, cost
        )
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
        raise UsageError(
            f"the free memory allows batches of {greedy} tokens, fewer than the "
            f"longest ticket's {max(fed)}: free some memory or set "
            f"--batch-tokens"
        )
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


def reference_labels(clf: Classifier, prompts: list[list[int]]) -> list[int]:
    """Each prompt's label index on the gold loop (whole prompts, one at a time)."""
    from ..engine.planner import plan_batches
    from ..engine.scheduler import score_all

    whole = plan_batches([len(p) for p in prompts], "sequential", 1 << 30, 1)
    return score_all(clf.engine, prompts, whole, "gold").argmax(1).tolist()


def bench_meta(clf: Classifier, source: str, prompt_name: str, info: dict) -> dict:
    """What ran: the model, tickets and prompt, on the machine `doctor` describes."""
    return {
        "model": clf.lm.describe(),
        "tickets": source,
        "prompt": prompt_name,
        "device": info["device"],
        "device_name": info["device_name"],
        "dtype": info["dtype"],
        "blas": info["blas_kernels"] or info["blas"],
        "peak_matmul_gflops": info[f"matmul_gflops_{info['dtype']}"],
        "doctor": info,
    }


def peers_entry(
    o: BenchOptions,
    clf: Classifier,
    prompts: list[list[int]],
    gold_labels: list[str],
    llama: LlamaCppOptions,
    progress,
) -> dict:
    """The report's `peers` entry: their runs against the reference's labels, or why they
    cannot run; none when no peer was asked for. Where --modes ran no reference (neither gold
    nor prefix), the gold loop runs for the peers, untimed: it costs what one peer does."""
    from .peers import run_peers

    if not o.peers:
        return {}
    names = list(clf.labels.names)
    if gold_labels:
        gold = [names.index(x) for x in gold_labels]
    else:
        progress("running the gold loop, the peers' reference (not in --modes, untimed) ...")
        gold = reference_labels(clf, prompts)
    return {
        "peers": run_peers(
            clf.lm.path,
            prompts,
            [list(t) for t in clf.labels.tokens],
            gold,
            o.peer_batch_tokens,
            o.max_batch,
            o.naive_batch,
            o.peers,
            progress,
            llama,
        )
    }
