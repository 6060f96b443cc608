"""A questions file (`--questions`, YAML or JSON): read, then checked as the Python API's
questions are (engine/questions.py), each mistake named by question and field."""

from __future__ import annotations

import json
from pathlib import Path

from ..engine.questions import Questions, questions_from
from ..errors import InputError, UsageError
from .caps import LABELS_FILE_BYTES, read_capped

__all__ = ["Questions", "check_question_options", "read_questions"]


def read_questions(path: str | Path) -> Questions:
    """The questions file at `path` (YAML by its .yaml/.yml suffix, else JSON), checked."""
    path = Path(path)
    try:
        text = read_capped(path, LABELS_FILE_BYTES, "--questions").decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read the questions file ({e})") from None
    yaml_file = path.suffix.lower() in (".yaml", ".yml")
    try:
        if yaml_file:
            from .prompts import _yaml

            data = _yaml(text)
        else:
            data = json.loads(text)
    except Exception as e:  # json and yaml raise several types; all mean "not parseable"
        kind = "YAML" if yaml_file else "JSON (.yaml/.yml: YAML)"
        first = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise InputError(f"{path}: not a valid questions file in {kind} ({first})") from None
    return questions_from(data, str(path))


def check_question_options(questions: Questions | None, labels, labels_file, examples) -> None:
    """Options that a questions file replaces are refused beside it."""
    if questions is None:
        return
    for flag, value in (
        ("--labels", labels),
        ("--labels-file", labels_file),
        ("--examples", examples),
    ):
        if value:
            raise UsageError(
                f"{flag} and --questions: the questions file gives each "
                "question's labels; give one of them"
            )
