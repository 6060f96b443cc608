"""A question's prior and few-shot examples (engine/questions.py): read from a questions
file's entry, or from example rows with a field per question, each mistake named by question
and by the example's row. `q` is a `Question`: its name, labels (or tags), and whether it is
multi-label."""

from __future__ import annotations

from ..errors import InputError, LabelError, unicode_problem
from .adjust import parse_prior

Shot = tuple[str, "str | tuple[str, ...]"]  # an example's text and its label, or its tags


def question_prior(entry: dict, q, where: str) -> tuple[float, ...] | None:
    """A single-label question's `prior`, as `--prior` reads one; a tag's yes/no is not a
    label set to weigh (its threshold, `--tag-threshold`, moves it instead)."""
    if "prior" not in entry:
        return None
    if q.multi:
        raise InputError(
            f"{where}: field 'prior': a multi_label question's tags are each yes or no; "
            "move them with --tag-threshold instead"
        )
    value = entry["prior"]
    if not isinstance(value, (dict, str)):
        raise InputError(f"{where}: field 'prior': expected a mapping of label to weight")
    try:
        return parse_prior(value, q.labels, f"{where}: field 'prior':")
    except LabelError as e:
        raise InputError(str(e)) from None


def own_examples(entry: dict, q, where: str) -> tuple[Shot, ...]:
    """A question's own `examples`: [{text, label}] (single-label) or [{text, tags}]."""
    value = entry.get("examples", [])
    key = "tags" if q.multi else "label"
    if not isinstance(value, list):
        raise InputError(f"{where}: field 'examples': expected a list of {{text, {key}}}")
    out = []
    for n, shot in enumerate(value, 1):
        at = f"{where}: field 'examples': example {n}"
        if not isinstance(shot, dict) or set(shot) != {"text", key}:
            raise InputError(f"{at}: expected a mapping with text and {key}")
        out.append((example_text(shot["text"], at), example_answer(q, shot[key], at)))
    return tuple(out)


def example_text(text, where: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"{where}: the text is not a non-empty string")
    if problem := unicode_problem(text):
        raise InputError(f"{where}: the text holds {problem}")
    return text


def example_answer(q, value, where: str) -> str | tuple[str, ...]:
    """An example's answer to `q`: one of its labels, or its tags (a list, or joined by `;`
    as a CSV cell holds them); refused naming `where` and the question."""
    if not q.multi:
        if not isinstance(value, str) or value not in q.labels:
            raise InputError(
                f"{where}: question {q.name!r}: {value!r} is not one of its labels "
                f"({', '.join(q.labels)})"
            )
        return value
    tags = [x.strip() for x in value.split(";") if x.strip()] if isinstance(value, str) else value
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise InputError(
            f"{where}: question {q.name!r}: expected a list of tags, or tags joined by ';'"
        )
    if bad := next((t for t in tags if t not in q.labels), None):
        raise InputError(
            f"{where}: question {q.name!r}: {bad!r} is not one of its tags ({', '.join(q.labels)})"
        )
    return tuple(tags)


def example_rows(questions, rows, source: str = "examples") -> tuple:
    """The Python API's example rows beside questions: mappings with "text" and a field per
    question they answer, as (text, {question: label or tags}) pairs."""
    try:
        rows = list(rows)
    except TypeError:
        raise InputError(
            f"{source}: expected a list of rows with text and question fields"
        ) from None
    by_name, out = {q.name: q for q in questions.questions}, []
    for n, row in enumerate(rows, 1):
        at = f"{source}[{n - 1}]"
        if not isinstance(row, dict) or "text" not in row:
            raise InputError(f"{at}: expected a mapping with text and a field per question")
        if extra := sorted(map(str, set(row) - {"text", *by_name})):
            raise InputError(f"{at}: {extra[0]!r} is no question's name ({', '.join(by_name)})")
        answers = {k: example_answer(by_name[k], v, at) for k, v in row.items() if k != "text"}
        out.append((example_text(row["text"], at), answers))
    return tuple(out)
