"""Several questions asked of every text (a questions file, or the Python API's `questions`).

Each question is asked as its own prompt: the user turn is the text, a blank line, and the
question's `ask`. A `multi_label` entry is one yes/no question per tag, each scored apart;
the tag is on where P(yes), normalised over yes and no, reaches the tag threshold. Every
mistake is refused here, naming the question and the field, before a model is loaded (but
labels that tokenize alike, which only its tokenizer can tell: api/questions.py).

A single-label question may carry a `prior` (as `--prior` weighs one label set). Few-shot
examples (a question's `examples`, or rows with a field per question) become each prompt's
earlier turns: the example's text and the question's `ask` as the user's, its answer as the
assistant's; a tag's yes/no prompt is answered "yes" where the example has the tag.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace

from ..errors import InputError, LabelError, unicode_problem
from .prompt import description_problem
from .question_examples import Shot, own_examples, question_prior

JOIN = "\n\n"  # between the text and the question, in the user turn
TAG_ASK = "Does this message concern {label}? Answer yes or no."
TAG_ASK_DESCRIBED = "Does this message concern {label} ({description})? Answer yes or no."
YES_NO = ("yes", "no")
DEFAULT_SYSTEM = (
    "You are a careful assistant. Read the message, then answer the question after it with "
    "exactly one of the answers it allows, and nothing else."
)
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}\Z")
RESERVED = {"id", "error", "line", "truncated", "answers", "label", "labels", "scores"}
KEYS = {"name", "ask", "labels", "multi_label", "prior", "examples"}


@dataclass(frozen=True)
class Asked:
    """One prompt a text is given: a question's `ask` and the labels it chooses among.
    `tag`: the tag a multi-label question's yes/no prompt is about (None: single-label)."""

    question: str
    ask: str
    labels: tuple[str, ...]
    tag: str | None = None
    prior: tuple[float, ...] | None = None  # weights in label order, normalised
    examples: tuple[tuple[str, str], ...] = ()  # earlier (user turn, answer) pairs

    def user_text(self, text: str) -> str:
        return text + JOIN + self.ask


@dataclass(frozen=True)
class Question:
    name: str
    ask: str  # a multi-label question's template, with {label} and {description}
    labels: tuple[str, ...]  # a single-label question's labels, or the tags
    descriptions: dict[str, str] | None = None
    multi: bool = False
    prior: tuple[float, ...] | None = None  # a single-label question's, in label order
    examples: tuple[Shot, ...] = ()

    def asked(self) -> tuple[Asked, ...]:
        """The prompts this question puts to each text: one, or one per tag."""
        if not self.multi:
            shots = tuple((t + JOIN + self.ask, label) for t, label in self.examples)
            return (Asked(self.name, self.ask, self.labels, None, self.prior, shots),)
        return tuple(self._tag_asked(t) for t in self.labels)

    def _tag_asked(self, tag: str) -> Asked:
        ask = self.tag_ask(tag)
        shots = tuple((t + JOIN + ask, YES_NO[tag not in tags]) for t, tags in self.examples)
        return Asked(self.name, ask, YES_NO, tag, None, shots)

    def examples_data(self) -> list:
        """The examples as JSON data: [text, label] or [text, [tags]] each."""
        return [[t, v if isinstance(v, str) else list(v)] for t, v in self.examples]

    def tag_ask(self, tag: str) -> str:
        description = (self.descriptions or {}).get(tag) or ""
        template = self.ask or (TAG_ASK_DESCRIBED if description else TAG_ASK)
        return template.replace("{label}", tag).replace("{description}", description)

    def columns(self) -> tuple[str, ...]:
        """The score names an answer of this question holds (its labels, or its tags)."""
        return self.labels


@dataclass(frozen=True)
class Questions:
    questions: tuple[Question, ...]
    system: str | None = None  # the file's `system`, if any
    source: str = "questions"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(q.name for q in self.questions)

    def asked(self) -> tuple[Asked, ...]:
        """Every prompt each text is given, in file order."""
        return tuple(a for q in self.questions for a in q.asked())

    def record(self) -> list:
        """The questions as data, for a fingerprint (what changes the answers); examples only
        where there are some, so a fingerprint without them is as it always was."""
        return [
            [q.name, q.ask, list(q.labels), q.descriptions, q.multi]
            + ([q.examples_data()] if q.examples else [])
            for q in self.questions
        ]

    def header(self, system: str) -> dict:
        """What a journal records of the questions, so a resume can say what changed: the
        file, the system prompt, each question's fields (its examples as a digest)."""
        return {
            "file": self.source,
            "system": system,
            "questions": [
                {
                    "name": q.name,
                    "ask": q.ask,
                    "labels": list(q.labels),
                    "multi_label": q.multi,
                    "descriptions": q.descriptions,
                    "prior": None if q.prior is None else list(q.prior),
                    "examples": _digest(q.examples_data()),
                }
                for q in self.questions
            ],
        }

    def with_examples(self, rows) -> Questions:
        """These questions with the example rows' answers added to each question's examples
        (`rows`: (text, {question: label or tags}) pairs, checked by `example_rows`)."""
        out = []
        for q in self.questions:
            shots = tuple((text, answers[q.name]) for text, answers in rows if q.name in answers)
            out.append(replace(q, examples=q.examples + shots))
        return replace(self, questions=tuple(out))


PLACEHOLDERS = {"{label}", "{description}"}


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


def questions_from(data, source: str = "questions") -> Questions:
    """Questions from parsed data (a file's, or the Python API's list or mapping)."""
    if isinstance(data, list):
        data = {"questions": data}
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping with a `questions` list")
    if extra := sorted(map(str, set(data) - {"system", "questions"})):
        raise InputError(
            f"{source}: unknown key(s) {', '.join(extra)} (a questions file has "
            "`system` and `questions`)"
        )
    system = data.get("system")
    if system is not None and (not isinstance(system, str) or not system.strip()):
        raise InputError(f"{source}: field 'system' must be a non-empty string")
    if system is not None and (problem := unicode_problem(system)):
        raise InputError(f"{source}: field 'system' holds {problem}")
    entries = data.get("questions")
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{source}: field 'questions' must be a non-empty list")
    out, seen = [], set()
    for n, entry in enumerate(entries, 1):
        q = _question(entry, n, source)
        if q.name in seen:
            raise InputError(f"{source}: question {q.name!r}: field 'name': given twice")
        seen.add(q.name)
        out.append(q)
    _check_columns(out, source)
    return Questions(tuple(out), system.strip("\n") if system else None, source)


def _check_columns(questions: list[Question], source: str) -> None:
    """Refuse questions whose CSV columns (`name`, `name_label`) would share a name: a table
    reader keeps one of the two."""
    owner: dict[str, str] = {}
    for q in questions:
        for column in (q.name, *(f"{q.name}_{x}" for x in q.columns())):
            if (other := owner.setdefault(column, q.name)) != q.name:
                raise InputError(
                    f"{source}: question {q.name!r}: field 'name': its CSV column {column!r} "
                    f"is also one of question {other!r}'s: rename one"
                )


def _question(entry, n: int, source: str) -> Question:
    if not isinstance(entry, dict):
        raise InputError(f"{source}: question {n}: expected a mapping with name, ask, labels")
    name = entry.get("name")
    where = f"{source}: question {name!r}" if isinstance(name, str) else f"{source}: question {n}"
    if extra := sorted(map(str, set(entry) - KEYS)):
        raise InputError(
            f"{where}: unknown field(s) {', '.join(extra)} (a question has "
            "name, ask, labels or multi_label, and may have prior and examples)"
        )
    if not isinstance(name, str) or not NAME.match(name):
        raise InputError(
            f"{where}: field 'name': {name!r} is not a name (a letter, then "
            "letters, digits, _ or -; at most 64)"
        )
    if name.lower() == "text":
        raise InputError(
            f"{where}: field 'name': 'text' is the input's text field (an examples row or a "
            "gold field would read the text as its answer)"
        )
    if name.lower() in RESERVED:
        raise InputError(f"{where}: field 'name': {name!r} is a name the output uses itself")
    multi = "multi_label" in entry
    if multi and "labels" in entry:
        raise InputError(f"{where}: fields 'labels' and 'multi_label': give one of them")
    field = "multi_label" if multi else "labels"
    if field not in entry:
        raise InputError(f"{where}: field 'labels': missing (or give multi_label)")
    labels, descriptions = _labels(entry[field], f"{where}: field {field!r}", multi)
    ask = entry.get("ask")
    if ask is None and multi:
        ask = ""
    if ask is not None and not isinstance(ask, str):
        raise InputError(f"{where}: field 'ask': expected a string, got {type(ask).__name__}")
    if ask is None or (not multi and not ask.strip()):
        raise InputError(
            f"{where}: field 'ask': {'empty' if ask is not None else 'missing'} "
            "(the question put to the model after each text)"
        )
    if multi and ask and "{label}" not in ask:
        raise InputError(
            f"{where}: field 'ask': the template does not name {{label}} (a multi_label "
            "template asks about each tag through it)"
        )
    if multi and (unknown := sorted(set(re.findall(r"{[^{}]*}", ask)) - PLACEHOLDERS)):
        raise InputError(
            f"{where}: field 'ask': {unknown[0]} is no placeholder (a multi_label template "
            "names {label} and may name {description})"
        )
    if multi and (joined := next((t for t in labels if ";" in t or "," in t), None)):
        raise InputError(
            f"{where}: field 'multi_label': tag {joined!r} holds ';' or ',', which join a "
            "text's tags in a CSV cell and a gold field"
        )
    if problem := unicode_problem(ask):
        raise InputError(f"{where}: field 'ask' holds {problem}")
    q = Question(name, ask.strip(), labels, descriptions, multi)
    return replace(q, prior=question_prior(entry, q, where), examples=own_examples(entry, q, where))


def _labels(value, where: str, multi: bool) -> tuple[tuple[str, ...], dict[str, str] | None]:
    from .labels import check_names  # not at import: labels.py imports MLX (runtime/blas.py)

    descriptions = None
    if isinstance(value, dict):
        descriptions = {}
        for label, line in value.items():
            if problem := description_problem(line):
                raise InputError(f"{where}: the description of {label!r} {problem}")
            descriptions[label] = (line or "").strip()
        names = list(value)
    elif isinstance(value, (list, tuple)):
        names = list(value)
    else:
        raise InputError(f"{where}: expected a list of labels or a mapping label -> description")
    bad = [x for x in names if not isinstance(x, str)]  # False, 0 and None are labels too
    if bad:
        raise InputError(
            f"{where}: label {bad[0]!r} is not a string (YAML reads yes, no, on, off "
            "unquoted as booleans: quote it)"
        )
    if not names:
        raise InputError(f"{where}: no labels")
    try:
        checked = check_names(names if not multi or len(names) > 1 else [*names, names[0] + "_"])
    except LabelError as e:
        raise InputError(f"{where}: {e}") from None
    return checked[: len(names)], descriptions


class AnswerColumns(tuple):
    """An output's score columns (`question_label`, `question_tag`), with the questions they
    come from: a CSV/TSV output writes a column per question beside them."""

    questions: tuple[tuple[str, tuple[str, ...]], ...]  # (name, labels or tags)
    multi: frozenset[str]  # the multi-label questions' names

    @classmethod
    def of(cls, questions: Questions) -> AnswerColumns:
        out = cls(f"{q.name}_{x}" for q in questions.questions for x in q.columns())
        out.questions = tuple((q.name, q.columns()) for q in questions.questions)
        out.multi = frozenset(q.name for q in questions.questions if q.multi)
        return out
