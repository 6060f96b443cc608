"""A questions file (`--questions`, YAML or JSON): read, then checked as the Python API's
questions are (engine/questions.py), each mistake named by question and field."""

from __future__ import annotations

import json
from pathlib import Path

from ..engine.question_examples import example_answer
from ..engine.questions import Questions, questions_from
from ..errors import InputError, UsageError
from .caps import LABELS_FILE_BYTES, read_capped

__all__ = ["Questions", "check_question_options", "read_question_examples", "read_questions"]


def read_questions(path: str | Path) -> Questions:
    """The questions file at `path` (YAML by its .yaml/.yml suffix, else JSON), checked."""
    path = Path(path)
    try:
        text = read_capped(path, LABELS_FILE_BYTES, "--questions").decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read the questions file ({e})") from None
    yaml_file = path.suffix.lower() in (".yaml", ".yml")
    try:
        from .prompts import _pairs, _yaml

        # a key given twice is refused, in JSON as in YAML (either parser would keep the last)
        if yaml_file:
            data = _yaml(text, "key")
        else:
            data = json.loads(text, object_pairs_hook=lambda pairs: _pairs(pairs, "key"))
    except Exception as e:  # json and yaml raise several types; all mean "not parseable"
        kind = "YAML" if yaml_file else "JSON (.yaml/.yml: YAML)"
        first = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise InputError(f"{path}: not a valid questions file in {kind} ({first})") from None
    return questions_from(data, str(path))


def read_question_examples(path: str | Path, questions: Questions, text_field: str = "text"):
    """`--examples` beside questions: rows with the text and a field per question they answer
    (a label; tags as a list, or joined by `;` in a CSV/TSV cell; an empty cell answers
    nothing), as (text, {question: label or tags}) pairs; a bad row named by file and row."""
    from .inputs import describe_errors
    from .prompts import capped_examples

    try:
        rows, fmt = capped_examples(str(path), text_field, questions.names)
    except InputError as e:
        raise InputError(f"--examples {e}") from None
    if bad := [r for r in rows if r.error]:
        raise InputError("examples: " + describe_errors(bad, str(path), fmt))
    unit = "row" if fmt in ("csv", "tsv", "parquet") else "line"
    return tuple(_example_row(r, questions, f"--examples {path}: {unit} {r.number}") for r in rows)


def _example_row(row, questions: Questions, where: str) -> tuple[str, dict]:
    if row.others:  # a misspelt question's column would otherwise lose its answers silently
        name = row.others[0]
        what = f"field {name!r}" if name else "a column with no name (a table's index?)"
        raise InputError(
            f"{where}: {what} is no question's name (an examples file holds the text, an id "
            f"and a field per question: {', '.join(questions.names)})"
        )
    given = {k: v for k, v in row.fields.items() if v is not None and v != ""}
    if not given:
        raise InputError(f"{where}: answers none of the questions ({', '.join(questions.names)})")
    by_name = {q.name: q for q in questions.questions}
    return row.text, {k: example_answer(by_name[k], v, where) for k, v in given.items()}


def check_question_options(
    questions: Questions | None, labels, labels_file, text_field: str = "text"
) -> None:
    """Options that a questions file replaces are refused beside it, and a question named as
    the input's text field (its rows would answer it with their texts)."""
    if questions is None:
        return
    if text_field in questions.names:
        raise UsageError(
            f"{questions.source}: question {text_field!r}: field 'name': it is the input's "
            "text field (--text-field); rename one"
        )
    for flag, value in (
        ("--labels", labels),
        ("--labels-file", labels_file),
    ):
        if value:
            raise UsageError(
                f"{flag} and --questions: the questions file gives each "
                "question's labels; give one of them"
            )


FIELDS = ("ask", "labels", "multi_label", "descriptions", "prior", "examples")


def questions_change(old: dict, new: dict) -> list[str]:
    """What differs between two journal records of questions (`Questions.header`), in words:
    "question 'tags' added", "question 'intent': labels changed"."""
    if not isinstance(old.get("questions"), list) or not all(
        isinstance(q, dict) for q in old["questions"]
    ):
        return ["the journal's record of them is not one mlxbatch wrote"]
    was = {q.get("name"): q for q in old["questions"]}
    now = {q["name"]: q for q in new["questions"]}
    said = [f"question {n!r} removed" for n in was if n not in now]
    said += [f"question {n!r} added" for n in now if n not in was]
    for name in (n for n in now if n in was):
        fields = [f for f in FIELDS if was[name].get(f) != now[name].get(f)]
        if fields:
            said.append(f"question {name!r}: {', '.join(fields)} changed")
    if not said and [n for n in was if n in now] != [n for n in now if n in was]:
        said.append("the questions' order changed")
    if old.get("system") != new.get("system"):
        said.append("the system prompt changed")
    return said
