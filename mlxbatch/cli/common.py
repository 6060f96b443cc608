"""What the command groups share: the failure exit, shared options, model and prompt lookup."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..engine.planner import DEFAULT_MAX_BATCH

LABELS_HELP = "Comma-separated labels (default: billing,technical,account)."


def fail(message: str, code: int = 2) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def echo(message: str) -> None:
    click.echo(message, err=True)


model_option = click.option(
    "--model", type=click.Path(path_type=Path), help="Model directory (default: see README)."
)
max_batch_option = click.option(
    "--max-batch",
    type=click.IntRange(1),
    default=DEFAULT_MAX_BATCH,
    show_default=True,
    help="Most rows per batch.",
)


def resolve_model(model: Path | None) -> Path:
    from ..jobs.defaults import default_model_dir

    return model or default_model_dir(announce=echo)


def parse_labels(labels: str | None) -> tuple[str, ...]:
    from ..engine.prompt import DEFAULT_LABELS

    if labels is None:
        return DEFAULT_LABELS
    return tuple(x.strip() for x in labels.split(","))


def system_prompt_from(text: str | None, file: Path | None, labels) -> str:
    from ..engine.prompt import default_system_prompt

    if text is not None and file is not None:
        fail("give --system-prompt or --system-prompt-file, not both")
    if file is not None:
        try:
            return file.read_text(encoding="utf-8").strip("\n")
        except (OSError, UnicodeDecodeError) as e:
            fail(f"{file}: cannot read the system prompt ({e})")
    return text if text is not None else default_system_prompt(labels)
