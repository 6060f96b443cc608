"""`mlxbatch classify`: the main job."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..io.inputs import FORMATS
from .common import (
    FiniteRange,
    ModeChoice,
    by_name,
    echo,
    fail,
    label_options,
    max_batch_option,
    model_option,
    output_path,
    plot_target,
    prompt_files,
    prompt_options,
    read_prompt,
    report_options,
)


@click.command()
@click.argument("input_path", metavar="INPUT")
@model_option
@label_options
@click.option(
    "--text-field", default="text", show_default=True, help="JSONL key / CSV column of the text."
)
@click.option(
    "--id-field",
    default=None,
    help="JSONL key / CSV column of the id (default: 'id' if present, else row numbers).",
)
@click.option(
    "--input-format",
    type=click.Choice(FORMATS),
    default="auto",
    show_default=True,
)
@click.option(
    "-o",
    "--output",
    type=click.Path(),  # a str: a Path would drop the "/" that says "a folder" (output_path)
    help="Output file: .jsonl, .csv or .tsv, each optionally .gz (default: JSONL on stdout).",
)
@click.option(
    "--mode",
    type=ModeChoice(),
    default="sorted",
    show_default=True,
    help="sequential: the gold loop, one item at a time; sequential-prefix: one at a time "
    "through the prefix cache (gold and prefix are taken for them too).",
)
@click.option(
    "--batch-tokens",
    type=click.IntRange(1),
    help="Upper bound on padded tokens per batch (default: 2048 on the CPU, 4096 on a GPU, "
    "raised to fit the longest item, within half the free memory).",
)
@max_batch_option
@click.option(
    "--planner",
    type=click.Choice(["cost", "greedy"]),
    default="cost",
    show_default=True,
    help="sorted mode: cut batches by least predicted time (cost) or by filling the budget.",
)
@click.option(
    "--no-prefix-cache", is_flag=True, help="Recompute the shared prompt prefix for every row."
)
@click.option(
    "--max-tokens",
    type=click.IntRange(1),  # as the Python API and serve take it
    help="Per-item token limit (default: context and budget).",
)
@click.option(
    "--too-long", type=click.Choice(["error", "truncate"]), default="error", show_default=True
)
@click.option(
    "--on-error",
    type=click.Choice(["fail", "skip"]),
    default="fail",
    show_default=True,
    help="fail: stop before computing if any row is bad; skip: write an error row for each.",
)
@click.option("--resume", is_flag=True, help="Continue an interrupted run from OUTPUT.part.")
@click.option(
    "--verify", is_flag=True, help="Also run the gold loop; exit 1 unless every label agrees."
)
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "float16", "bfloat16"]),
    default="auto",
    show_default=True,
)
@click.option("--check-weights", is_flag=True, help="Also refuse weights with NaN or inf values.")
@prompt_options
@click.option("--gold-field", help="JSONL key / CSV column of a gold label: print an evaluation.")
@report_options("the evaluation", "confusion")
@click.option(
    "--distributed",
    is_flag=True,
    help="Require an mlx.launch group (detected anyway when launched with it).",
)
@click.option(
    "--verify-sample",
    type=FiniteRange(0, 1),
    default=0.0,
    help="Re-score this share of the items on the gold loop (the same items for the "
    "same input); exit 1 unless every sampled label agrees.",
)
@click.option(
    "--window-rows",
    type=click.IntRange(1, sys.maxsize),
    default=16384,
    show_default=True,
    help="Rows read, planned and written at a time: memory stays flat however long "
    "the input (duplicates are scored once within a window).",
)
@click.option(
    "--collective-timeout",
    type=FiniteRange(1),
    default=600.0,
    show_default=True,
    help="Seconds a distributed round may wait for the other ranks.",
)
@click.option(
    "--questions",
    type=click.Path(path_type=Path),
    help="YAML/JSON file of questions to ask of every text (instead of --labels).",
)
@click.option(
    "--tag-threshold",
    type=FiniteRange(0, 1),
    help="Multi-label questions: a tag is on at P(yes) >= this (default 0.5).",
)
def classify(**options):
    """Classify every row of INPUT (JSONL, CSV, TSV, text, Parquet, or - for stdin) into one label."""
    from ..api.spec import RunSpec
    from ..jobs.classify import Interrupted, JobRequest, check_stdin, run_classify

    opt = dict(options)
    opt["output"] = output_path(opt["output"], "the rows")
    opt["plot_path"] = plot_target(opt["plot_path"], opt["output"], "confusion")
    opt["prefix_cache"] = not opt.pop("no_prefix_cache")
    opt["input"], opt["window"] = opt.pop("input_path"), opt.pop("window_rows")
    spec = by_name(RunSpec, opt, progress_every=None)
    files = prompt_files(opt)
    check_stdin({"INPUT": opt["input"]} | files)  # before a prompt file takes standard input
    prompt = read_prompt(opt, opt["text_field"])
    request = by_name(JobRequest, opt, prompt=prompt, prompt_files=files)
    try:
        code = run_classify(request, spec, echo)
    except Interrupted as e:
        fail(str(e), 130)
    if code:
        sys.exit(code)
