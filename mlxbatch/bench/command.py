"""`bench` as one library call: check the options, then the suite, or the 1-vs-N ranks run."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..engine.prompt import built_in_prompt
from ..errors import UsageError
from ..io.outputs import check_reports, write_json_report
from ..io.promptspec import prompt_spec
from ..model.defaults import default_model_dir
from ..model.hub import resolve
from .peers import PEERS
from .suite import MODE_NAMES, BenchOptions, bench_job, load_tickets


@dataclass(frozen=True)
class BenchRequest:
    """The `bench` command's options, as given."""

    model: str | None
    tickets_spec: str
    mix: str
    prompt_name: str
    labels: str | None
    system_prompt: str | None
    system_prompt_file: Path | None
    labels_file: Path | None
    examples: Path | None
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


def run_bench_command(r: BenchRequest, say: Callable[[str], None]) -> int:
    """The whole bench command; its exit code (1 when a batched mode disagrees)."""
    if r.tickets_spec.isdigit() and int(r.tickets_spec) == 0:
        raise UsageError("--tickets 0: give a number of tickets above 0, or a ticket file")
    tickets_file = [] if r.tickets_spec.isdigit() else [Path(r.tickets_spec)]
    if r.ranks:
        return _ranks(r, tickets_file, say)
    read = [Path(p) for p in (r.system_prompt_file, r.labels_file, r.examples) if p]
    check_reports(r.json_path, r.plot_path, read + tickets_file)
    wanted = _names(r.modes, MODE_NAMES, "--modes")
    if not wanted:
        raise UsageError(f"--modes: choose at least one of {', '.join(MODE_NAMES)}")
    against = _model(str(r.against), say) if r.against is not None else None  # before the runs
    peers = () if r.no_peers else _names(r.peer_names, PEERS, "--peers")
    spec = prompt_spec(r.labels, r.labels_file, r.system_prompt, r.system_prompt_file, r.examples)
    system, shots = spec.system, spec.examples
    if r.prompt_name != "default":
        if r.system_prompt or r.system_prompt_file or r.examples:
            raise UsageError(f"--prompt {r.prompt_name} is a built-in prompt: do not combine it "
                             "with your own")  # fmt: skip
        try:
            system, shots = built_in_prompt(r.prompt_name, spec.labels)
        except ValueError as e:
            raise UsageError(f"--prompt {r.prompt_name}: {e}") from None
    options = BenchOptions(
        model=r.model, tickets=r.tickets_spec, mix=r.mix, labels=spec.labels,
        system_prompt=system, examples=shots,
        prompt_name=r.prompt_name if not r.examples else f"examples from {r.examples}",
        batch_tokens=r.batch_tokens, max_batch=r.max_batch, naive_batch=r.naive_batch,
        sweep=budgets(r.sweep), modes=wanted, peers=peers,
        peer_batch_tokens=r.peer_batch_tokens, quick=r.quick, calibrate=not r.no_calibrate,
        against=against, json_path=r.json_path, plot_path=r.plot_path,
    )  # fmt: skip
    result, report = bench_job(options, lambda m: _model(m, say), progress=say)
    print(report)
    if any(m["agreement"] is not None and m["agreement"] < 1.0 for m in result["modes"]):
        say("error: a batched mode disagrees with the gold loop")
        return 1
    return 0


def _model(model: str | Path | None, say) -> Path:
    return resolve(model) if model else default_model_dir(announce=say)


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


def _ranks(r: BenchRequest, tickets_file: list[Path], say) -> int:
    """1 rank against N (mlx.launch, ring, this host): the speed-up and identical files."""
    from ..model.convert import init_random
    from .scaling import measure_ranks

    check_reports(r.json_path, None, tickets_file)
    model, tickets_spec = r.model, r.tickets_spec
    with tempfile.TemporaryDirectory() as tmp:
        if r.quick:
            model = str(Path(tmp) / "tiny")
            init_random(model, preset="tiny", seed=0, dtype="float32")
            tickets_spec = "60" if tickets_spec == "600" else tickets_spec
        texts, source = load_tickets(tickets_spec, r.mix)
        m = measure_ranks(r.ranks, _model(model, say), texts, ["--max-batch", str(r.max_batch)],
                          say)  # fmt: skip
    n = r.ranks
    say(f"{source}: 1 rank {m['seconds_1']:.1f} s, {n} ranks {m[f'seconds_{n}']:.1f} s: "
        f"{m['speedup']:.2f}x on {m['cpu_count']} cores of {m['host']}; output files identical: "
        f"{m['identical_output']}")  # fmt: skip
    if r.json_path:
        write_json_report(r.json_path, m)
    return 0
