"""Workload commands: `tickets`, `doctor`, `bench`, `demo`. Thin: the logic is in jobs/."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..engine.prompt import BUILT_IN_PROMPTS
from ..model.defaults import model_dir
from .common import (
    FiniteRange,
    echo,
    fail,
    label_options,
    max_batch_option,
    model_option,
    output_path,
    plot_target,
    prompt_files,
    read_prompt,
    report_options,
)


@click.command()
# 10^9 tickets is ~150 GB of JSONL: anything more is a typo (10^14 ran until killed)
@click.argument("n", type=click.IntRange(1, 1_000_000_000), default=600)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--mix",
    type=click.Choice(["default", "short", "long", "heavy-tail"]),
    default="default",
    show_default=True,
)
@click.option(
    "-o",
    "--output",
    type=click.Path(),  # a str: output_path reads a trailing "/"
    help="A .jsonl or .csv file, .gz for gzip (default, or -: JSONL on stdout; the tickets hold line breaks, which TSV cannot).",
)
def tickets(n, seed, mix, output):
    """Generate N synthetic support tickets (id, text, intent)."""
    from ..bench.workload import generate, write_tickets

    write_tickets(generate(n, seed, mix), output_path(output, "the tickets"))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--size",
    type=click.IntRange(16, 8192),
    default=1024,
    show_default=True,
    help="Square matmul size to time.",
)
@click.option("--calibrate", is_flag=True, help="Measure the planner's cost model for --model.")
@model_option
def doctor(as_json, size, calibrate, model):
    """Device, dtype, the BLAS behind MLX's CPU matmuls and its GFLOP/s, planner calibrations."""
    from ..bench.doctor import report
    from ..model.load import read_config

    path = model_dir(model, echo) if model is not None or calibrate else None
    info, broken = report(size, None if path is None else read_config(path)), None
    if model is not None and not calibrate:  # `doctor --model X` ignored X, broken or not
        from ..model.defaults import not_runnable

        broken = not_runnable(path)
        info["model"] = f"{path}: " + (
            f"BROKEN: {broken}"
            if broken
            else "runnable (config, weights and tokenizer; --calibrate measures it)"
        )
    if calibrate:
        from ..api.classifier import Classifier
        from ..engine.calibration import calibrate as measure
        from ..engine.calibration import describe

        cost, _ = measure(Classifier.load(path).engine, lambda m: click.echo(m, err=True))
        info["planner_calibrated"] = describe(cost)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            if isinstance(v, list):  # one line an entry: the BLAS libraries tried, calibrations
                click.echo(f"{k:>16}:")
                for entry in v:
                    text = (
                        ", ".join(f"{a}={b}" for a, b in entry.items())
                        if isinstance(entry, dict)
                        else entry
                    )
                    click.echo(f"{'':>18}{text}")
            else:
                click.echo(f"{k:>16}: {v}")
    if broken:
        fail(f"--model {model}: not runnable ({broken})")


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
@label_options
@click.option("--labels-file", type=click.Path(path_type=Path), help="As classify.")
@click.option("--examples", type=click.Path(path_type=Path), help="As classify.")
@click.option(
    "--batch-tokens",
    type=click.IntRange(1),
    help="Budget of the greedy sorted run compared against the cost planner (default: the "
    "preferred budget, 2048 a batch on the CPU).",
)
@max_batch_option
@click.option(
    "--naive-batch",
    type=click.IntRange(1),
    default=16,
    show_default=True,
    help="Rows per naive batch.",
)
@click.option(
    "--sweep",
    default="512,1024,2048,4096",
    show_default=True,
    help="Greedy budgets to sweep (comma-separated; empty for none).",
)
@click.option(
    "--modes",
    default="sequential,sequential-prefix,naive,sorted,greedy,sweep",
    show_default=True,
    help="Which of sequential (the gold loop), sequential-prefix, naive, sorted, greedy, "
    "sweep to run (gold and prefix are taken for the first two).",
)
@click.option(
    "--peers",
    "peer_names",
    default="mlx-lm,mlx-lm-batch,transformers,transformers-bf16",
    show_default=True,
    help="Peers to time (empty for none): mlx-lm,mlx-lm-batch,transformers,transformers-bf16, "
    "llama.cpp (its F32 and Q8_0 GGUFs; or llama.cpp-f32, llama.cpp-q8_0).",
)
@click.option(
    "--peer-batch-tokens",
    type=click.IntRange(1),
    default=4096,
    show_default=True,
    help="Padded-token budget of the transformers peers' sorted batches (whole prompts).",
)
@click.option("--no-peers", is_flag=True, help="Time no peers.")
@click.option(
    "--llama-cpp-src",
    type=click.Path(path_type=Path, file_okay=False),
    envvar="MLXBATCH_LLAMA_CPP_SRC",
    help="Unpacked llama.cpp (or llama-cpp-python sdist): its convert_hf_to_gguf.py makes the "
    "llama.cpp peers' GGUFs.",
)
@click.option(
    "--llama-threads",
    type=click.IntRange(1),
    help="The llama.cpp peers' threads (default: the usable cores).",
)
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
@click.option(
    "--ranks",
    type=click.IntRange(2),
    help="Instead: classify on 1 and on N ranks (mlx.launch, ring, this host) and print the ratio.",
)
@click.option(
    "--serve",
    is_flag=True,
    help="Instead: the service's load test on --model (the "
    "same as `mlxbatch bench-serve` with its defaults; see its --help for the loads).",
)
@click.option(
    "--scale",
    is_flag=True,
    help="Instead: classify jobs of growing length as child "
    "processes (tiny model at --scale-sizes, 0.5B-shaped at --scale-large): items/s, "
    "max RSS from the OS, padding, repeats scored once; the 10M projection.",
)
@click.option(
    "--scale-sizes",
    default="10000,100000,1000000",
    show_default=True,
    help="Tickets for the tiny model's runs (comma-separated; empty: none).",
)
@click.option(
    "--scale-large",
    type=click.IntRange(0),
    default=6000,
    show_default=True,
    help="Tickets for the 0.5B-shaped model's streamed run (0: none).",
)
@click.option(
    "--scale-compare",
    type=click.IntRange(0),
    default=1200,
    show_default=True,
    help="Tickets for the 0.5B-shaped model's pair of runs with and without repeats (0: none).",
)
@click.option(
    "--scale-duplicates",
    type=FiniteRange(0, 0.9),
    default=0.2,
    show_default=True,
    help="Share of rows repeating an earlier row's text.",
)
@click.pass_context
@click.option(
    "--questions",
    type=click.Path(path_type=Path),
    help="Instead: a questions file's run against its prompts asked one at a time, "
    "and against the gold loop (with sequential in --modes).",
)
def bench(ctx, **options):
    """Time the gold loop, prefix caching, naive, greedy and cost-planned batching, and peers."""
    from ..bench.command import BenchRequest, run_bench_command

    opt = dict(options)
    if opt.pop("serve"):
        from .serve import bench_serve

        return ctx.invoke(
            bench_serve,
            model=opt["model"],
            quick=opt["quick"],
            json_path=opt["json_path"],
            plot_path=opt["plot_path"],
        )
    scale = {
        k: opt.pop(k)
        for k in ("scale", "scale_sizes", "scale_large", "scale_compare", "scale_duplicates")
    }
    if scale["scale"]:
        return _bench_scale(scale, opt)
    opt["plot_path"] = plot_target(opt["plot_path"], opt["json_path"], "bench")
    opt["prompt_files"] = prompt_files(opt, questions=False)
    opt["prompt"] = read_prompt(opt, questions=False)
    code = run_bench_command(BenchRequest(**opt), echo)
    if code:
        sys.exit(code)


def _bench_scale(scale: dict, o: dict) -> None:
    from ..bench.scale import QUICK_SIZES, ScaleRequest, scale_command

    try:
        sizes = tuple(int(x) for x in scale["scale_sizes"].split(",") if x.strip())
    except ValueError:
        raise click.BadParameter("comma-separated counts", param_hint="--scale-sizes") from None
    if sizes and min(sizes) < 1:
        raise click.BadParameter("ticket counts of 1 or more", param_hint="--scale-sizes")
    if not sizes and not scale["scale_large"] and not o["quick"]:
        raise click.BadParameter(
            "nothing to run: give ticket counts or --scale-large", param_hint="--scale-sizes"
        )
    sizes, large = (QUICK_SIZES, 0) if o["quick"] else (sizes, scale["scale_large"])
    plot = plot_target(o["plot_path"], o["json_path"], "bench-scale")
    request = ScaleRequest(
        sizes=sizes,
        large=large,
        compare=scale["scale_compare"],
        duplicates=scale["scale_duplicates"],
        json_path=o["json_path"],
        plot_path=plot,
    )
    sys.exit(scale_command(request, echo))


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
@click.option("--resume", is_flag=True, help="Continue a demo that Ctrl-C stopped.")
def demo(n, model, out_dir, resume):
    """The main job on the built-in default: synthetic tickets, sorted batching, verified."""
    from ..bench.demo import run_demo
    from ..jobs.classify import Interrupted

    try:
        lines, passed = run_demo(
            n,
            model_dir(model, echo),
            out_dir,
            progress=lambda m: click.echo(m, err=True),
            resume=resume,
        )
    except Interrupted as e:
        fail(str(e), 130)
    for line in lines:
        click.echo(line)
    if not passed:
        sys.exit(1)
