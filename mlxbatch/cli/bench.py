"""Workload commands: `tickets`, `doctor`, `bench`, `demo`. Thin: the logic is in jobs/."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .common import fail, max_batch_option, model_option, resolve_model


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
    from ..io.tickets import generate, write_jsonl

    write_jsonl(generate(n, seed, mix), output)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--size", type=int, default=1024, show_default=True, help="Square matmul size to time."
)
def doctor(as_json, size):
    """Device, dtype, the BLAS behind MLX's CPU matmuls, and its measured GFLOP/s."""
    from ..jobs.doctor import report

    info = report(size)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            click.echo(f"{k:>16}: {v}")


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
    "--batch-tokens",
    type=click.IntRange(1),
    help="Budget of the default sorted run (default: as classify).",
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
    help="Budgets to sweep (comma-separated; empty for none).",
)
@click.option(
    "--peers/--no-peers",
    default=True,
    show_default=True,
    help="Also time mlx-lm and transformers (if installed).",
)
@click.option(
    "--json", "json_path", type=click.Path(path_type=Path), help="Write every figure as JSON."
)
@click.option(
    "--plot", "plot_path", type=click.Path(path_type=Path), help="Write a PNG (needs matplotlib)."
)
@click.option(
    "--quick", is_flag=True, help="Tiny synthetic model, 60 tickets: checks the command in seconds."
)
def bench(model, tickets_spec, batch_tokens, max_batch, naive_batch, sweep, peers, json_path, plot_path, quick):  # fmt: skip
    """Time the gold loop, prefix caching, naive and sorted batching (and peers) in one run."""
    from ..jobs.bench import bench_job

    result, report = bench_job(model, tickets_spec, batch_tokens, max_batch, naive_batch,
                               [int(x) for x in sweep.split(",") if x.strip()], peers, quick,
                               resolve=resolve_model, progress=lambda m: click.echo(m, err=True),
                               json_path=json_path, plot_path=plot_path)  # fmt: skip
    click.echo(report)
    if any(m["agreement"] < 1.0 for m in result["modes"]):
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
    from ..jobs.demo import run_demo

    lines, passed = run_demo(
        n, resolve_model(model), out_dir, progress=lambda m: click.echo(m, err=True)
    )
    for line in lines:
        click.echo(line)
    if not passed:
        sys.exit(1)
