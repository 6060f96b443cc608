"""The `mlxbatch` command line: thin click commands over the library."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from . import blas
from .cli_runs import (
    bench,
    demo,
    doctor,
    fail,
    max_batch_option,
    model_option,
    resolve_model,
    tickets,
)

LABELS_HELP = "Comma-separated labels (default: billing,technical,account)."


def known_errors() -> tuple[type[Exception], ...]:
    from .config import ModelError
    from .inputs import InputError
    from .job import JobError
    from .output import ResumeError
    from .scoring import LabelError

    return ModelError, InputError, JobError, ResumeError, LabelError


class Group(click.Group):
    """Turns the library's expected errors into one line and exit code 2, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except known_errors() as e:
            fail(str(e))


@click.group(cls=Group)
@click.version_option(package_name="mlxbatch")
def cli() -> None:
    """Classify batches of short texts with a small Qwen2/2.5 model in MLX."""


def parse_labels(labels: str | None) -> tuple[str, ...]:
    from .prompt import DEFAULT_LABELS

    if labels is None:
        return DEFAULT_LABELS
    return tuple(x.strip() for x in labels.split(","))


def system_prompt_from(text: str | None, file: Path | None, labels) -> str:
    from .prompt import default_system_prompt

    if text is not None and file is not None:
        fail("give --system-prompt or --system-prompt-file, not both")
    if file is not None:
        try:
            return file.read_text(encoding="utf-8").strip("\n")
        except (OSError, UnicodeDecodeError) as e:
            fail(f"{file}: cannot read the system prompt ({e})")
    return text if text is not None else default_system_prompt(labels)


@cli.command()
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
    type=click.Choice(["auto", "jsonl", "csv", "text"]),
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
    help="Padded-token budget per batch (default: from free memory).",
)
@max_batch_option
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
def classify(input_path, model, labels, system_prompt, system_prompt_file, text_field, id_field,
             input_format, output, mode, batch_tokens, max_batch, no_prefix_cache, max_tokens,
             too_long, on_error, resume, verify, dtype, check_weights):  # fmt: skip
    """Classify every row of INPUT (JSONL, CSV, text, or - for stdin) into one label."""
    from .classifier import Classifier
    from .inputs import read_rows
    from .job import JobSettings, run_job

    if resume and output is None:
        fail("--resume needs -o/--output (the journal lives next to it)")
    names = parse_labels(labels)
    prompt = system_prompt_from(system_prompt, system_prompt_file, names)
    rows, fmt = read_rows(input_path, text_field, id_field, input_format)  # before any model work
    clf = Classifier.load(
        resolve_model(model), names, prompt, dtype, not no_prefix_cache, check_weights
    )
    settings = JobSettings(mode, batch_tokens, max_batch, not no_prefix_cache, max_tokens,
                           too_long, on_error)  # fmt: skip
    try:
        result = run_job(clf, rows, settings, output, resume, verify, input_path, fmt)
    except KeyboardInterrupt:
        if output:
            fail(f"interrupted; finished batches are saved in {output}.part. Run the same "
                 "command with --resume to continue.", 130)  # fmt: skip
        fail("interrupted", 130)
    click.echo(f"model: {clf.lm.describe()}", err=True)
    click.echo(result.summary(), err=True)
    if result.verify is not None:
        v = result.verify
        click.echo(
            f"verify: {v['agreement']:.2%} label agreement with the gold loop over {v['items']} items, "
            f"max |score diff| {v['max_abs_score_diff']:.2e}", err=True)  # fmt: skip
        for d in v["disagreements"][:20]:
            click.echo(f"  disagreement: {json.dumps(d)}", err=True)
        if not v["passed"]:
            sys.exit(1)


@cli.command()
@click.argument("hf_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option(
    "--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), help="Cast (default: keep)."
)
def convert(hf_dir, out_dir, dtype):
    """Convert a Hugging Face Qwen2/2.5 checkpoint (safetensors) to an mlxbatch directory."""
    from .convert import convert_hf

    m = convert_hf(hf_dir, out_dir, dtype)
    click.echo(
        f"wrote {out_dir}: {m['tensors']} tensors, {m['parameters']:,} parameters, {m['dtype']}"
    )


@cli.command("init-random")
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option(
    "--preset",
    type=click.Choice(["qwen2.5-0.5b", "tiny"]),
    default="qwen2.5-0.5b",
    show_default=True,
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16", "bfloat16"]),
    default="bfloat16",
    show_default=True,
)
def init_random_cmd(out_dir, preset, seed, dtype):
    """Write a SYNTHETIC model (random weights, real Qwen tokenizer) at a preset's shapes."""
    from .convert import init_random

    m = init_random(out_dir, preset, seed, dtype)
    click.echo(f"wrote {out_dir}: synthetic {preset}, {m['parameters']:,} parameters, {dtype}")


@cli.command()
@click.argument("hf_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--mlx",
    "mlx_dir",
    type=click.Path(path_type=Path),
    help="Converted directory (default: convert now).",
)
@click.option("--no-mlx-lm", is_flag=True, help="Skip the comparison with mlx-lm's Qwen2.")
def parity(hf_dir, mlx_dir, no_mlx_lm):
    """Compare logits with PyTorch transformers (fp32) and mlx-lm on the same weights."""
    import tempfile

    from .convert import convert_hf
    from .parity import run_parity

    with tempfile.TemporaryDirectory() as tmp:
        if mlx_dir is None:
            mlx_dir = Path(tmp) / "mlx"
            convert_hf(hf_dir, mlx_dir, "float32")
        reports = run_parity(hf_dir, mlx_dir, with_mlx_lm=not no_mlx_lm)
    for r in reports:
        click.echo(r.line())
    sys.exit(0 if all(r.passed for r in reports) else 1)


for command in (bench, demo, doctor, tickets):
    cli.add_command(command)


def main() -> None:
    blas.reexec_with_fast_blas()
    blas.restore_environment()
    cli()
