"""Workload commands: `tickets`, `doctor`, `bench`, `demo`. Thin: the logic is in jobs/."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..engine.prompt import BUILT_IN_PROMPTS
from .common import (
    LABELS_HELP,
    fail,
    max_batch_option,
    model_option,
    plot_target,
    prompt_spec,
    report_options,
    resolve_model,
)


@click.command()
@click.argument("n", type=click.IntRange(1), default=600)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--mix",
    type=click.Choice(["default", "short", "long", "heavy-tail"]),
    default="default",
    show_default=True,
)
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), help="JSONL file (default: stdout)."
)
def tickets(n, seed, mix, output):
    """Generate N synthetic support tickets (JSONL: id, text, intent)."""
    from ..bench.workload import generate, write_jsonl

    write_jsonl(generate(n, seed, mix), output)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--size", type=click.IntRange(16, 8192), default=1024, show_default=True,
    help="Square matmul size to time.",
)  # fmt: skip
@click.option("--calibrate", is_flag=True, help="Measure the planner's cost model for --model.")
@model_option
def doctor(as_json, size, calibrate, model):
    """Device, dtype, the BLAS behind MLX's CPU matmuls and its GFLOP/s, planner calibrations."""
    from ..bench.doctor import report

    info = report(size)
    if calibrate:
        from ..api.classifier import Classifier
        from ..engine.calibration import calibrate as measure
        from ..engine.calibration import describe

        cost, _ = measure(Classifier.load(resolve_model(model)), lambda m: click.echo(m, err=True))
        info["planner_calibrated"] = describe(cost)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            click.echo(f"{k:>16}: {v}")


def _budgets(sweep: str) -> tuple[int, ...]:
    """The --sweep budgets: whole numbers of at least 1, comma-separated."""
    out = []
    for x in (x.strip() for x in sweep.split(",")):
        if x and (not x.isdigit() or int(x) < 1):
            fail(f"--sweep: {x!r} is not a budget (a whole number of tokens, at least 1)")
        if x:
            out.append(int(x))
    return tuple(out)


@click.command()
@model_option
@click.option(
    "--tickets",
    "tickets_spec",
    default="600",
    show_default=True,
    help="A ticket file, or a number of synthetic tickets.",
)
@click.option(
    "--mix",
    type=click.Choice(["default", "short", "long", "heavy-tail"]),
    default="default",
    show_default=True,
    help="The synthetic tickets' length mix.",
)
@click.option(
    "--prompt",
    "prompt_name",
    type=click.Choice(["default", *BUILT_IN_PROMPTS]),
    default="default",
    show_default=True,
    help="descriptions: the default prompt with a line describing each label (~90 prefix "
    "tokens); few-shot: those descriptions plus three examples a label (~300 prefix tokens).",
)
@click.option("--labels", help=LABELS_HELP)
@click.option("--system-prompt", help="System prompt text (as classify).")
@click.option("--system-prompt-file", type=click.Path(path_type=Path))
@click.option("--labels-file", type=click.Path(path_type=Path), help="As classify.")
@click.option("--examples", type=click.Path(path_type=Path), help="As classify.")
@click.option(
    "--batch-tokens",
    type=click.IntRange(1),
    help="Budget of the greedy sorted run compared against the cost planner (default: the "
    "preferred budget, 2048 a batch on the CPU).",
)
@max_batch_option
@click.option("--naive-batch", type=click.IntRange(1), default=16, show_default=True,
              help="Rows per naive batch.")  # fmt: skip
@click.option(
    "--sweep",
    default="512,1024,2048,4096",
    show_default=True,
    help="Greedy budgets to sweep (comma-separated; empty for none).",
)
@click.option(
    "--modes",
    default="gold,prefix,naive,sorted,greedy,sweep",
    show_default=True,
    help="Which of gold,prefix,naive,sorted,greedy,sweep to run.",
)
@click.option(
    "--peers",
    "peer_names",
    default="mlx-lm,mlx-lm-batch,transformers,transformers-bf16",
    show_default=True,
    help="Peers to time (empty for none): mlx-lm,mlx-lm-batch,transformers,transformers-bf16.",
)
@click.option(
    "--peer-batch-tokens",
    type=click.IntRange(1),
    default=4096,
    show_default=True,
    help="Padded-token budget of the transformers peers' sorted batches (whole prompts).",
)
@click.option("--no-peers", is_flag=True, help="Time no peers.")
@click.option("--no-calibrate", is_flag=True, help="Use the cached/default cost model.")
@click.option(
    "--against",
    type=click.Path(path_type=Path),
    help="A reference model (e.g. the full-precision source of a quantized --model).",
)
@report_options("every figure", "bench")
@click.option(
    "--quick", is_flag=True, help="Tiny synthetic model, 60 tickets: checks the command in seconds."
)
@click.option("--ranks", type=click.IntRange(2), help="Instead: classify on 1 and on N ranks "
              "(mlx.launch, ring, this host) and print the ratio.")  # fmt: skip
def bench(model, tickets_spec, mix, prompt_name, labels, system_prompt, system_prompt_file,
          labels_file, examples, batch_tokens, max_batch, naive_batch, sweep, modes, peer_names,
          peer_batch_tokens, no_peers, no_calibrate, against, json_path, plot_path, quick,
          ranks):  # fmt: skip
    """Time the gold loop, prefix caching, naive, greedy and cost-planned batching, and peers."""
    from ..bench.peers import PEERS
    from ..bench.suite import MODE_NAMES, BenchOptions, bench_job
    from ..engine.prompt import built_in_prompt
    from ..io.outputs import check_reports, write_json_report

    if tickets_spec.isdigit() and int(tickets_spec) == 0:
        fail("--tickets 0: give a number of tickets above 0, or a ticket file")
    tickets_file = [] if tickets_spec.isdigit() else [Path(tickets_spec)]
    if ranks:
        check_reports(json_path, None, tickets_file)
        import tempfile

        from ..bench.scaling import measure_ranks
        from ..bench.suite import load_tickets
        from ..model.convert import init_random

        tmp = tempfile.TemporaryDirectory()
        if quick:
            model = str(Path(tmp.name) / "tiny")
            init_random(model, preset="tiny", seed=0, dtype="float32")
            tickets_spec = "60" if tickets_spec == "600" else tickets_spec
        texts, source = load_tickets(tickets_spec, mix)
        m = measure_ranks(ranks, resolve_model(model), texts, ["--max-batch", str(max_batch)],
                          lambda x: click.echo(x, err=True))  # fmt: skip
        tmp.cleanup()
        click.echo(f"{source}: 1 rank {m['seconds_1']:.1f} s, {ranks} ranks "
                   f"{m[f'seconds_{ranks}']:.1f} s: {m['speedup']:.2f}x on {m['cpu_count']} cores "
                   f"of {m['host']}; output files identical: {m['identical_output']}")  # fmt: skip
        if json_path:
            write_json_report(json_path, m)
        return
    plot_path = plot_target(plot_path, json_path, "bench")
    read = [Path(p) for p in (system_prompt_file, labels_file, examples) if p]
    check_reports(json_path, plot_path, read + tickets_file)
    wanted = tuple(x.strip() for x in modes.split(",") if x.strip())
    if not wanted:
        fail(f"--modes: choose at least one of {', '.join(MODE_NAMES)}")
    budgets = _budgets(sweep)
    if against is not None:
        against = resolve_model(str(against))  # before the long runs, not after them
    peers = () if no_peers else tuple(x.strip() for x in peer_names.split(",") if x.strip())
    for name, known, option in ((wanted, MODE_NAMES, "--modes"), (peers, PEERS, "--peers")):
        bad = [x for x in name if x not in known]
        if bad:
            fail(f"{option}: unknown {', '.join(bad)} (choose from {', '.join(known)})")
    spec = prompt_spec(labels, labels_file, system_prompt, system_prompt_file, examples)
    system, shots = spec.system, spec.examples
    if prompt_name != "default":
        if system_prompt or system_prompt_file or examples:
            fail(f"--prompt {prompt_name} is a built-in prompt: do not combine it with your own")
        try:
            system, shots = built_in_prompt(prompt_name, spec.labels)
        except ValueError as e:
            fail(f"--prompt {prompt_name}: {e}")
    options = BenchOptions(
        model=model, tickets=tickets_spec, mix=mix, labels=spec.labels, system_prompt=system,
        examples=shots, prompt_name=prompt_name if not examples else f"examples from {examples}",
        batch_tokens=batch_tokens, max_batch=max_batch, naive_batch=naive_batch,
        sweep=budgets, modes=wanted, peers=peers,
        peer_batch_tokens=peer_batch_tokens, quick=quick, calibrate=not no_calibrate,
        against=against, json_path=json_path, plot_path=plot_path,
    )  # fmt: skip
    result, report = bench_job(options, resolve_model, progress=lambda m: click.echo(m, err=True))
    click.echo(report)
    if any(m["agreement"] is not None and m["agreement"] < 1.0 for m in result["modes"]):
        fail("a batched mode disagrees with the gold loop", 1)


@click.command()
@click.option(
    "--tickets",
    "n",
    type=click.IntRange(1),
    default=120,
    show_default=True,
    help="Synthetic tickets to classify.",
)
@model_option
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=Path("runs/demo"),
    show_default=True,
)
def demo(n, model, out_dir):
    """The main job on the built-in default: synthetic tickets, sorted batching, verified."""
    from ..bench.demo import run_demo

    lines, passed = run_demo(
        n, resolve_model(model), out_dir, progress=lambda m: click.echo(m, err=True)
    )
    for line in lines:
        click.echo(line)
    if not passed:
        sys.exit(1)
