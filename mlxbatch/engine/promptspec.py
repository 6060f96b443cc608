"""The prompt settings of a run as one frozen value (`PromptSpec`): labels, system prompt,
examples, descriptions, calibration, prior, abstention, questions. Everything that needs no
model is checked once, when it is built; the CLI, the Python API, the service and bench all
take it, so each setting is refused in one place and with the same words."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Real

from ..errors import LabelError, UsageError, unicode_problem
from .adjust import parse_prior
from .prompt import DEFAULT_LABELS, description_problem
from .questions import Questions

DEFAULT_TAG_THRESHOLD = 0.5  # multi-label questions: a tag is on at P(yes) >= it


@dataclass(frozen=True)
class PromptSpec:
    """What a run asks of each text. Errors name the field as the Python API's keyword
    (`prior`); the CLI words it as its flag (`--prior`, see `UsageError.worded`)."""

    labels: tuple[str, ...] | None = None  # None: the default labels (none with questions)
    system_prompt: str | None = None  # None: the default, built from the labels
    examples: tuple[tuple[str, str], ...] = ()  # few-shot (text, label) pairs
    descriptions: dict[str, str] | None = None  # label -> one line, for the default prompt
    calibrate: bool = False  # contextual calibration
    prior: str | dict | None = None  # "a=0.5,b=0.5" or {label: weight}, as given
    min_confidence: float | None = None  # abstain below this top probability
    questions: Questions | None = None  # several questions a text, instead of labels
    tag_threshold: float | None = None  # multi-label questions (None: DEFAULT_TAG_THRESHOLD)
    weights: tuple[float, ...] | None = field(default=None, init=False, compare=False)

    def __post_init__(self) -> None:
        if self.questions is not None:
            self._check_questions()
        else:
            self._check_labels()
        _check_system_prompt(self.system_prompt)
        check_flag("calibrate", self.calibrate)
        self._set("min_confidence", _confidence(self.min_confidence))

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)

    def _check_labels(self) -> None:
        """Labels, examples, descriptions and the prior, against one another."""
        from .labels import check_names  # not at import: labels.py imports MLX

        labels = DEFAULT_LABELS if self.labels is None else self.labels
        _strings("labels", labels)
        examples = _examples(self.examples)
        _check_descriptions(self.descriptions, labels)
        self._set("labels", check_names(labels))
        self._set("examples", examples)
        if self.tag_threshold is not None:
            raise UsageError(
                "`tag_threshold` applies to multi-label questions: give `questions`",
                ("tag_threshold", "questions"),
            )
        bad = sorted({lab for _, lab in examples if lab not in self.labels})
        if bad:
            raise LabelError(f"example label(s) {bad} are not in the label set")
        self._set("weights", _prior(self.prior, self.labels))

    def _check_questions(self) -> None:
        """What a questions run refuses beside its questions, which give their own labels."""
        if not isinstance(self.questions, Questions):
            raise UsageError(
                f"`questions`: expected Questions, got {type(self.questions).__name__}",
                ("questions",),
            )
        if self.prior is not None:
            raise UsageError(
                "`prior` and `questions`: a prior weighs one label set; give each question "
                "its own with a `prior:` key in its entry of the questions file",
                ("prior", "questions"),
            )
        for name in ("labels", "examples", "descriptions"):
            if getattr(self, name):
                raise UsageError(
                    f"`{name}` and `questions`: each question gives its own labels",
                    (name, "questions"),
                )
        self._set("labels", ())
        self._set("examples", ())
        given, asked = self.system_prompt, self.questions.system
        if asked is not None and given not in (None, asked):
            raise UsageError(
                "`system_prompt` and the questions' `system`: give one of them",
                ("system_prompt",),
            )
        self._set("tag_threshold", _tag_threshold(self.tag_threshold))

    @property
    def system(self) -> str | None:
        """The system prompt as given; with questions, theirs where none is given."""
        if self.questions is not None:
            return self.system_prompt or self.questions.system
        return self.system_prompt


def check_flag(name: str, value) -> None:
    """A bool setting, refused otherwise: a truthy string such as "no" would turn it on."""
    if not isinstance(value, bool):
        raise UsageError(
            f"`{name}`: expected True or False, got {type(value).__name__} {value!r}"[:200],
            (name,),
        )


def _strings(name: str, value) -> None:
    """A list of strings (a str would be split into characters)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        hint = (
            f" {value!r} (write [{value!r}] or split it yourself)" if isinstance(value, str) else ""
        )
        raise UsageError(
            f"`{name}`: expected a list of strings, got {type(value).__name__}{hint}", (name,)
        )
    for i, v in enumerate(value):
        if not isinstance(v, str):
            raise UsageError(f"`{name}`[{i}]: expected a str, got {type(v).__name__}", (name,))


def _check_system_prompt(text) -> None:
    if text is not None and not isinstance(text, str):
        raise UsageError(
            f"`system_prompt`: expected a str, got {type(text).__name__}", ("system_prompt",)
        )
    if text is not None and (problem := unicode_problem(text)):
        raise UsageError(f"`system_prompt` holds {problem}", ("system_prompt",))


def _examples(examples) -> tuple[tuple[str, str], ...]:
    """(text, label) pairs of strings, each text not empty; read once (a generator would reach
    the prompt empty)."""
    try:
        examples = tuple(examples)
    except TypeError:
        raise UsageError(
            f"`examples`: expected (text, label) pairs, got {type(examples).__name__}",
            ("examples",),
        ) from None
    for i, pair in enumerate(examples):
        if not (
            isinstance(pair, (list, tuple))
            and len(pair) == 2
            and all(isinstance(x, str) for x in pair)
        ):
            raise UsageError(
                f"`examples`[{i}]: expected a (text, label) pair of strings", ("examples",)
            )
        if not pair[0].strip():  # as --examples refuses an example row without text
            raise UsageError(f"`examples`[{i}]: the text is empty", ("examples",))
        if problem := unicode_problem(pair[0]):
            raise UsageError(f"`examples`[{i}]: the text holds {problem}", ("examples",))
    return tuple((text, label) for text, label in examples)


def _check_descriptions(descriptions, labels) -> None:
    """{label: one line} for labels of the set (a typo would drop one without a word)."""
    if descriptions is not None and not isinstance(descriptions, dict):
        raise UsageError(
            f"`descriptions`: expected a dict, got {type(descriptions).__name__}",
            ("descriptions",),
        )
    for label, line in (descriptions or {}).items():
        if label not in labels:
            raise LabelError(
                f"`descriptions`[{label!r}]: not one of the labels ({', '.join(labels)})",
                ("descriptions",),
            )
        if problem := description_problem(line):
            raise UsageError(f"`descriptions`[{label!r}] {problem}", ("descriptions",))


def _confidence(value) -> float | None:
    """min_confidence as a float in [0, 1] (NumPy's and Fraction's too: a journal records it)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise UsageError(
            f"`min_confidence`: expected a number, got {type(value).__name__}",
            ("min_confidence",),
        )
    if not 0 <= value <= 1:  # NaN included
        raise LabelError(
            f"`min_confidence` {str(value)[:40]} is not between 0 and 1", ("min_confidence",)
        )
    return value if type(value) in (int, float) else float(value)


def _prior(prior, labels: tuple[str, ...]) -> tuple[float, ...] | None:
    """The prior in label order, parsed once; None is no prior, an empty one is refused."""
    if prior is None:
        return None
    if not isinstance(prior, (str, Mapping)):
        raise UsageError(
            f"`prior`: expected {{label: weight}} or 'a=0.5,b=0.5', got {type(prior).__name__}",
            ("prior",),
        )
    if isinstance(prior, Mapping):
        for label, weight in prior.items():  # "0.5" or True passed as 0.5 and 1
            if isinstance(weight, bool) or not isinstance(weight, Real):
                raise UsageError(
                    f"`prior`[{label!r}]: expected a number, got {type(weight).__name__}",
                    ("prior",),
                )
        prior = dict(prior)
    try:
        return parse_prior(prior, labels, "`prior`")
    except LabelError as e:
        raise LabelError(e.template, ("prior",)) from None


def _tag_threshold(value) -> float:
    if value is None:
        return DEFAULT_TAG_THRESHOLD
    try:
        ok = not isinstance(value, bool) and 0.0 <= float(value) <= 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise UsageError(
            f"`tag_threshold`: expected a number in [0, 1], got {value!r}", ("tag_threshold",)
        )
    return float(value)
