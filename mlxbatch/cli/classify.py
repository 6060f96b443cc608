"""`mlxbatch classify`: the main job."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from ..io.inputs import FORMATS
from .common import (
    LABELS_HELP,
    check_gold_field,
    fail,
    max_batch_option,
    model_option,
    plot_target,
    prompt_options,
    prompt_spec,
    report_evaluation,
    report_options,
    resolve_model,
)


@click.command()
@click.argument("input_path", metavar="INPUT")
@model_option
@click.option("--labels", help=LABELS_HELP)
@click.option("--system-prompt", help="System prompt text (default names the labels).")
@click.option(
    "--system-prompt-file",
    type=click.Path(path_type=Path),
    help="Read the system prompt from a file.",
)
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
    type=click.Path(path_type=Path),
    help="Output file, .jsonl or .csv (default: JSONL on stdout).",
)
@click.option(
    "--mode",
    type=click.Choice(["sorted", "naive", "sequential"]),
    default="sorted",
    show_default=True,
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
    type=click.IntRange(8),
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
@click.option("--distributed", is_flag=True,
              help="Require an mlx.launch group (detected anyway when launched with it).")  # fmt: skip
@click.option("--collective-timeout", type=click.FloatRange(1), default=600.0, show_default=True,
              help="Seconds a distributed round may wait for the other ranks.")  # fmt: skip
def classify(input_path, model, labels, system_prompt, system_prompt_file, text_field, id_field,
             input_format, output, mode, batch_tokens, max_batch, planner, no_prefix_cache, max_tokens,
             too_long, on_error, resume, verify, dtype, check_weights, labels_file, examples,
             calibrate, prior, min_confidence, gold_field, json_path, plot_path, distributed,
             collective_timeout):  # fmt: skip
    """Classify every row of INPUT (JSONL, CSV, text, or - for stdin) into one label."""
    from ..api.classifier import Classifier
    from ..io.inputs import read_rows
    from ..io.outputs import check_model_untouched, check_output, check_reports
    from ..io.sinks import journal_path
    from ..jobs.distributed import Cluster, run_distributed_job
    from ..jobs.job import JobSettings, run_job

    cluster = None
    if distributed or os.environ.get("MLX_RANK") is not None:  # set by mlx.launch
        cluster = Cluster.join(distributed, collective_timeout)
    rank = cluster.rank if cluster else 0
    if output is not None and str(output) == "-":
        output = None  # -o - is standard output
    if resume and output is None:
        fail("--resume needs -o/--output (the journal lives next to it)")
    read = [Path("/dev/stdin" if str(p) == "-" else p)
            for p in (input_path, system_prompt_file, labels_file, examples) if p]  # fmt: skip
    kind = "stdout"
    if output is not None and rank == 0:  # before anything is read or written
        kind = check_output(output, read, resume)
    plot_path = plot_target(plot_path, output, "confusion")
    if (json_path or plot_path) and not gold_field:
        fail("--json and --plot report the evaluation: give --gold-field too")
    if rank == 0:
        written = [output, journal_path(output)] if output is not None else []
        check_reports(json_path, plot_path, read + written)
    spec = prompt_spec(labels, labels_file, system_prompt, system_prompt_file, examples, text_field)
    fields = (gold_field,) if gold_field else ()
    rows, fmt = read_rows(
        input_path, text_field, id_field, input_format, fields
    )  # before the model
    if gold_field:
        check_gold_field(rows, gold_field, input_path)
    model_dir = resolve_model(model)
    if rank == 0:
        writes = [("-o", output), ("-o's journal", output and journal_path(output)),
                  ("--json", json_path), ("--plot", plot_path)]  # fmt: skip
        check_model_untouched(writes, model_dir)
    clf = Classifier.load(
        model_dir, spec.labels, spec.system, dtype, not no_prefix_cache, check_weights,
        examples=spec.examples, calibrate=calibrate, prior=prior, min_confidence=min_confidence,
    )  # fmt: skip
    settings = JobSettings(mode, batch_tokens, max_batch, not no_prefix_cache, max_tokens,
                           too_long, on_error, planner)  # fmt: skip
    try:
        if cluster:
            result = run_distributed_job(cluster, clf, rows, settings, output if rank == 0 else None,
                                         resume, verify and rank == 0, input_path, fmt)  # fmt: skip
            if result is None:  # ranks other than 0 write nothing
                return
        else:
            result = run_job(clf, rows, settings, output, resume, verify, input_path, fmt)
    except KeyboardInterrupt:
        if output and kind == "file":
            fail(f"interrupted; finished batches are saved in {output}.part. Run the same "
                 "command with --resume to continue.", 130)  # fmt: skip
        fail("interrupted", 130)
    click.echo(f"model: {clf.lm.describe()}", err=True)
    click.echo(result.summary(), err=True)
    if not clf.adjust.identity:
        click.echo(f"adjustment: {clf.adjust.describe(clf.labels.names)}", err=True)
    if gold_field:
        report_evaluation(clf, rows, result.results, gold_field, json_path, plot_path)
    if result.verify is not None:
        v = result.verify
        click.echo(
            f"verify: {v['agreement']:.2%} label agreement with the gold loop over {v['items']} items, "
            f"max |score diff| {v['max_abs_score_diff']:.2e}", err=True)  # fmt: skip
        for d in v["disagreements"][:20]:
            click.echo(f"  disagreement: {json.dumps(d)}", err=True)
        if not v["passed"]:
            sys.exit(1)
