"""`bench` as one library call: check the options, then the suite, or the 1-vs-N ranks run."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..engine.planner import MODE_ALIASES
from ..engine.prompt import built_in_prompt
from ..engine.promptspec import PromptSpec
from ..errors import UsageError
from ..io.outputs import check_model_untouched, check_reports, write_json_report
from ..io.streams import report_stream
from ..model.defaults import model_dir
from .job import BenchOptions, bench_inputs, bench_job, load_tickets
from .llamacpp import LlamaCppOptions
from .peers import PEERS
from .suite import MODE_NAMES, bench_modes


@dataclass(frozen=True)
class BenchRequest:
    """The `bench` command's options, as given."""

    model: str | None
    tickets_spec: str
    mix: str
    prompt_name: str
    prompt: PromptSpec  # the options' labels, system prompt and examples, read once
    prompt_files: dict[str, Path]  # the files they were read from, by option
    batch_tokens: int | None
    max_batch: int
    naive_batch: int
    sweep: str
    modes: str
    peer_names: str
    peer_batch_tokens: int
    no_peers: bool
    no_calibrate: bool
    against: Path | None
    json_path: Path | None
    plot_path: Path | None
    quick: bool
    ranks: int | None
    llama_cpp_src: Path | None = None
    llama_threads: int | None = None
    questions: Path | None = None  # instead: a questions run against one question at a time


def run_bench_command(req: BenchRequest, say: Callable[[str], None]) -> int:
    """The whole bench command; its exit code (1 when a batched mode disagrees)."""
    if req.tickets_spec.isdigit() and int(req.tickets_spec) == 0:
        raise UsageError("--tickets 0: give a number of tickets above 0, or a ticket file")
    tickets_file = [] if req.tickets_spec.isdigit() else [Path(req.tickets_spec)]
    if req.ranks:
        return _ranks(req, tickets_file, say)
    if req.questions is not None:
        return _questions(req, tickets_file, say)
    read = list(req.prompt_files.values())
    check_reports(req.json_path, req.plot_path, read + tickets_file)
    for model in (m for m in (req.model, req.against) if m and Path(m).is_dir()):
        check_model_untouched([("--json", req.json_path), ("--plot", req.plot_path)], Path(model))
    result, report = bench_job(bench_options(req, say), lambda m: model_dir(m, say), progress=say)
    print(report, file=report_stream(req.json_path))
    if any(m["agreement"] is not None and m["agreement"] < 1.0 for m in result["modes"]):
        say("error: a batched mode disagrees with the gold loop")
        return 1
    return 0


def bench_options(req: BenchRequest, say: Callable[[str], None]) -> BenchOptions:
    """The options checked and resolved, before anything runs: modes, the reference model,
    peers, then the prompt."""
    wanted = bench_modes(_names(req.modes, MODE_NAMES + tuple(MODE_ALIASES), "--modes"))
    if not wanted:
        raise UsageError(f"--modes: choose at least one of {', '.join(MODE_NAMES)}")
    against = model_dir(str(req.against), say) if req.against is not None else None
    peers = () if req.no_peers else _names(req.peer_names, PEERS, "--peers")
    examples = req.prompt_files.get("--examples")
    return BenchOptions(
        model=req.model,
        tickets=req.tickets_spec,
        mix=req.mix,
        prompt=_prompt(req),
        prompt_name=req.prompt_name if not examples else f"examples from {examples}",
        batch_tokens=req.batch_tokens,
        max_batch=req.max_batch,
        naive_batch=req.naive_batch,
        sweep=budgets(req.sweep),
        modes=wanted,
        peers=peers,
        peer_batch_tokens=req.peer_batch_tokens,
        llama_cpp=LlamaCppOptions(req.llama_cpp_src, req.llama_threads),
        quick=req.quick,
        calibrate=not req.no_calibrate,
        against=against,
        json_path=req.json_path,
        plot_path=req.plot_path,
    )


def _prompt(req: BenchRequest) -> PromptSpec:
    """The options' prompt, or the built-in prompt named by --prompt over their labels (never
    both)."""
    spec = req.prompt
    if req.prompt_name == "default":
        return spec
    own = {"--system-prompt-file", "--examples"} & set(req.prompt_files)
    if spec.system_prompt or own:
        raise UsageError(
            f"--prompt {req.prompt_name} is a built-in prompt: do not combine it with your own"
        )
    try:
        system, examples = built_in_prompt(req.prompt_name, spec.labels)
    except ValueError as e:
        raise UsageError(f"--prompt {req.prompt_name}: {e}") from None
    return replace(spec, system_prompt=system, examples=examples)


def budgets(sweep: str) -> tuple[int, ...]:
    """The --sweep budgets: whole numbers of at least 1, comma-separated."""
    out = []
    for x in (x.strip() for x in sweep.split(",")):
        if x and (not x.isdigit() or int(x) < 1):
            raise UsageError(
                f"--sweep: {x!r} is not a budget (a whole number of tokens, at least 1)"
            )
        if x:
            out.append(int(x))
    return tuple(out)


def _names(text: str, known, option: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in names if x not in known]
    if bad:
        raise UsageError(f"{option}: unknown {', '.join(bad)} (choose from {', '.join(known)})")
    return names


def _ranks(req: BenchRequest, tickets_file: list[Path], say) -> int:
    """1 rank against N (mlx.launch, ring, this host): the speed-up and identical files."""
    from ..model.convert import init_random
    from .scaling import measure_ranks

    check_reports(req.json_path, None, tickets_file)
    model, tickets_spec = req.model, req.tickets_spec
    with tempfile.TemporaryDirectory() as tmp:
        if req.quick:
            model = str(Path(tmp) / "tiny")
            init_random(model, preset="tiny", seed=0, dtype="float32")
            tickets_spec = "60" if tickets_spec == "600" else tickets_spec
        texts, source = load_tickets(tickets_spec, req.mix)
        m = measure_ranks(
            req.ranks, model_dir(model, say), texts, ["--max-batch", str(req.max_batch)], say
        )
    n = req.ranks
    say(
        f"{source}: 1 rank {m['seconds_1']:.1f} s, {n} ranks {m[f'seconds_{n}']:.1f} s: "
        f"{m['speedup']:.2f}x on {m['cpu_count']} cores of {m['host']}; output files identical: "
        f"{m['identical_output']}"
    )
    if req.json_path:
        write_json_report(req.json_path, m)
    return 0


def _questions(req: BenchRequest, tickets_file: list[Path], say) -> int:
    """`--questions FILE`: the questions run against its prompts asked one at a time, and
    against the gold loop (when --modes has sequential); exit 1 unless every answer agrees."""
    from ..io.questions import read_questions
    from .questions import bench_questions, format_questions

    asked = read_questions(req.questions)
    check_reports(req.json_path, None, [*tickets_file, req.questions])
    gold = "sequential" in bench_modes(
        _names(req.modes, MODE_NAMES + tuple(MODE_ALIASES), "--modes")
    )
    with tempfile.TemporaryDirectory() as tmp:
        model, tickets, _ = bench_inputs(
            BenchOptions(model=req.model, tickets=req.tickets_spec, quick=req.quick), Path(tmp)
        )
        texts, source = load_tickets(tickets, req.mix)
        say(f"{source}; questions from {req.questions}")
        r = bench_questions(
            model_dir(model and str(model), say), asked, texts, req.batch_tokens, gold, say
        )
    print(format_questions(r), file=report_stream(req.json_path))
    if req.json_path:
        write_json_report(req.json_path, r)
    if r["agreement_single"] < 1.0 or r.get("agreement_gold", 1.0) < 1.0:
        say("error: the questions run disagrees with the single-question runs or the gold loop")
        return 1
    return 0
