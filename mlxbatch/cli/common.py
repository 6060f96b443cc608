"""What the command groups share: the failure exit, shared options, model and prompt lookup."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path

import click

from ..engine.planner import DEFAULT_MAX_BATCH, MODE_ALIASES, MODES

PLOT_DEFAULT = "__mlxbatch_default_plot__"  # `--plot` given without a path


def output_path(value: str | None, what: str) -> Path | None:
    """An `-o` value: None for standard output (none given, or `-`; refused where the caller
    closed it), else the file. A value ending in "/" names a folder: a Path would drop the "/"
    and write a file named like the folder. `what`: what it writes, for the folder's hint."""
    from ..io.outputs import check_stdout_open

    if value is None or value == "-":
        check_stdout_open("-o", None)
        return None
    if value.endswith(os.sep) and value != os.sep:
        raise click.UsageError(
            f"-o {value}: names a folder; give a file in it ({value}{what.split()[-1]}.jsonl, say)"
        )
    return Path(value)


def plot_target(plot_path: Path | None, output: Path | None, name: str) -> Path | None:
    """Where `--plot` writes: its path, or beside the output file (else, and beside a device
    or FIFO output, in the working directory)."""
    if plot_path is None or str(plot_path) != PLOT_DEFAULT:
        return plot_path
    from ..io.streams import is_stream

    beside = output is not None and str(output) != "-"
    if beside and (is_stream(Path(output)) or Path(output).exists() and not Path(output).is_file()):
        beside = False  # /dev/stdout (even into a redirect), a FIFO: not a directory to draw into
    if beside:
        return Path(output).with_name(Path(output).stem + f".{name}.png")
    return Path(f"{name}.png")


def report_options(what: str, default_name: str):
    """`--json PATH` and `--plot [PATH]`, shared by classify, eval and bench."""

    def apply(f):
        f = click.option(
            "--plot",
            "plot_path",
            type=click.Path(path_type=Path),
            is_flag=False,
            flag_value=PLOT_DEFAULT,
            help=f"Draw a PNG (needs matplotlib); without a path: beside the output, else "
            f"./{default_name}.png.",
        )(f)
        return click.option(
            "--json",
            "json_path",
            type=click.Path(path_type=Path),
            callback=_dash_is_stdout,
            help=f"Write {what} as JSON (- for standard output).",
        )(f)

    return apply


def _dash_is_stdout(ctx, param, value: Path | None) -> Path | None:
    """`--json -`: standard output, as `-o -` is (it wrote a file named "-")."""
    return Path("/dev/stdout") if value is not None and str(value) == "-" else value


LABELS_HELP = "Comma-separated labels (default: billing,technical,account)."


class FiniteRange(click.FloatRange):
    """click's FloatRange, refusing nan and inf: both pass its comparisons (nan < 0 is false),
    then reach a timer, a JSON reply or an int() as a traceback or a hang."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class ModeChoice(click.Choice):
    """A mode of the table (engine/planner.py); its other words are read as it."""

    def __init__(self, modes=tuple(MODES)):
        super().__init__(list(modes))

    def convert(self, value, param, ctx):
        return super().convert(MODE_ALIASES.get(value, value), param, ctx)


def fail(message: str, code: int = 2) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def echo(message: str) -> None:
    click.echo(message, err=True)


model_option = click.option(
    "--model",
    help="A model directory (mlxbatch, Hugging Face or mlx-lm, quantized or not) or a hub id "
    "such as Qwen/Qwen2.5-0.5B-Instruct (default: see README).",
)
max_batch_option = click.option(
    "--max-batch",
    type=click.IntRange(1),
    default=DEFAULT_MAX_BATCH,
    show_default=True,
    help="Most rows per batch.",
)


def label_options(f):
    """The labels and the system prompt, shared by `classify`, `serve` and `bench`."""
    options = [
        click.option("--labels", help=LABELS_HELP),
        click.option("--system-prompt", help="System prompt text (default names the labels)."),
        click.option(
            "--system-prompt-file",
            type=click.Path(path_type=Path),
            help="Read the system prompt from a file.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def prompt_options(f):
    """The prompt and post-processing options shared by `classify` and `bench`."""
    options = [
        click.option(
            "--labels-file",
            type=click.Path(path_type=Path),
            help="JSON/YAML mapping label -> one-line description (feeds the default prompt).",
        ),
        click.option(
            "--examples",
            type=click.Path(path_type=Path),
            help="Few-shot examples (JSONL/CSV with text and label), as earlier turns.",
        ),
        click.option(
            "--calibrate",
            is_flag=True,
            help="Contextual calibration: divide by the content-free probabilities.",
        ),
        click.option(
            "--prior", help="Explicit priors, e.g. billing=0.5,technical=0.3,account=0.2."
        ),
        click.option(
            "--min-confidence",
            type=FiniteRange(0, 1),
            help="Abstain (label null) below this top probability.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def check_gold_field(rows, gold_field: str, source) -> None:
    """A gold field that no row has is a typo, not an evaluation of nothing: refuse it."""
    if not any(gold_field in r.fields for r in rows):
        fail(f"{source}: no row has the gold field {gold_field!r} (--gold-field)")


# the prompt's files, by option name and flag (kept safe from the writes; stdin read once)
PROMPT_FILES = {
    "system_prompt_file": "--system-prompt-file",
    "labels_file": "--labels-file",
    "examples": "--examples",
    "questions": "--questions",
}
PROMPT_SETTINGS = ("calibrate", "prior", "min_confidence", "tag_threshold")


def prompt_files(options: dict, questions: bool = True) -> dict[str, Path]:
    """The files the prompt options name, by flag (`questions`: whether --questions is the
    prompt's; bench's is a run of its own)."""
    return {
        flag: Path(options[name])
        for name, flag in PROMPT_FILES.items()
        if options.get(name) is not None and (questions or name != "questions")
    }


def read_prompt(options: dict, text_field: str = "text", questions: bool = True):
    """The prompt options taken out of `options`, read and checked once: a `PromptSpec`."""
    from ..io.promptspec import prompt_spec

    take = options.pop
    return prompt_spec(
        take("labels", None),
        take("labels_file", None),
        take("system_prompt", None),
        take("system_prompt_file", None),
        take("examples", None),
        text_field,
        take("questions", None) if questions else None,
        **{k: take(k) for k in PROMPT_SETTINGS if k in options},
    )


def by_name(kind: type, options: dict, **resolved):
    """A `kind` dataclass from the options named as its fields, `resolved` replacing those the
    command worked out; a field neither gives is a renamed option, not a silent default."""
    names = {f.name for f in dataclasses.fields(kind)}
    given = {k: v for k, v in options.items() if k in names} | resolved
    if missing := sorted(names - given.keys()):
        raise TypeError(f"{kind.__name__}: no option gives {', '.join(missing)}")
    return kind(**given)
