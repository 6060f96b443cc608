"""The Python API's arguments checked by type before anything is loaded or scored: a
UsageError (or LabelError) naming the argument, never a KeyError or AttributeError deep inside
(`Classifier.load` and `Classifier.classify` call these)."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from numbers import Real
from pathlib import Path

from ..engine.prompt import description_problem
from ..errors import LabelError, UsageError, unicode_problem


def check_load_args(model_dir, labels, system_prompt, examples, min_confidence, descriptions):
    """The Python API's arguments, by type, before anything loads: a UsageError naming the
    argument instead of a KeyError or AttributeError deep inside (a str for `labels` would be
    split into characters)."""

    def strings(name: str, value) -> None:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise UsageError(
                f"{name}: expected a list of strings, got {type(value).__name__}"
                + (
                    f" {value!r} (write [{value!r}] or split it yourself)"
                    if isinstance(value, str)
                    else ""
                )
            )
        for i, v in enumerate(value):
            if not isinstance(v, str):
                raise UsageError(f"{name}[{i}]: expected a str, got {type(v).__name__}")

    if not isinstance(model_dir, (str, Path)):
        raise UsageError(f"model_dir: expected a path or hub id, got {type(model_dir).__name__}")
    strings("labels", labels)
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise UsageError(f"system_prompt: expected a str, got {type(system_prompt).__name__}")
    if system_prompt is not None and (problem := unicode_problem(system_prompt)):
        raise UsageError(f"system_prompt holds {problem}")  # as labels and texts are checked
    for i, pair in enumerate(examples):
        if not (
            isinstance(pair, (list, tuple))
            and len(pair) == 2
            and all(isinstance(x, str) for x in pair)
        ):
            raise UsageError(f"examples[{i}]: expected a (text, label) pair of strings")
        if not pair[0].strip():  # as --examples refuses an example row without text
            raise UsageError(f"examples[{i}]: the text is empty")
        if problem := unicode_problem(pair[0]):
            raise UsageError(f"examples[{i}]: the text holds {problem}")
    if min_confidence is not None and (
        isinstance(min_confidence, bool) or not isinstance(min_confidence, Real)
    ):
        raise UsageError(f"min_confidence: expected a number, got {type(min_confidence).__name__}")
    if min_confidence is not None and not 0 <= min_confidence <= 1:  # NaN included
        raise LabelError(f"min_confidence {str(min_confidence)[:40]} is not between 0 and 1")
    if descriptions is not None and not isinstance(descriptions, dict):
        raise UsageError(f"descriptions: expected a dict, got {type(descriptions).__name__}")
    for label, line in (descriptions or {}).items():  # as --labels-file checks its entries
        if label not in labels:  # a typo would drop the description without a word
            raise LabelError(
                f"descriptions[{label!r}]: not one of the labels ({', '.join(labels)})"
            )
        if problem := description_problem(line):
            raise UsageError(f"descriptions[{label!r}] {problem}")


def check_prior(prior) -> None:
    """`prior`: None, "a=0.5,b=0.5" or {label: weight} with numbers for weights (a list gave an
    AttributeError; "0.5" or True as a weight passed as 0.5 and 1)."""
    if prior is None or isinstance(prior, str):
        return
    if not isinstance(prior, dict):
        raise UsageError(
            f"prior: expected {{label: weight}} or 'a=0.5,b=0.5', got {type(prior).__name__}"
        )
    for label, weight in prior.items():
        if isinstance(weight, bool) or not isinstance(weight, Real):
            raise UsageError(f"prior[{label!r}]: expected a number, got {type(weight).__name__}")


def checked_texts(texts) -> list[str]:
    """`texts` as a list of valid strings, or a UsageError naming the first bad one."""
    if isinstance(texts, (str, bytes)):
        raise UsageError(
            f"texts: expected a list of strings, got one {type(texts).__name__} "
            "(wrap a single text in a list)"
        )
    if isinstance(texts, (Mapping, AbstractSet)):  # keys, or no order to match answers to
        raise UsageError(
            f"texts: expected a list of strings, got {type(texts).__name__} "
            "(an unordered collection: the predictions come in input order)"
        )
    try:
        texts = list(texts)
    except TypeError:
        raise UsageError(f"texts: expected a list of strings, got {type(texts).__name__}") from None
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise UsageError(f"texts[{i}]: expected a str, got {type(t).__name__}")
        if problem := unicode_problem(t):
            raise UsageError(f"texts[{i}] holds {problem}")
        if not t.strip():  # the service's words, as classify and the service both refuse it
            raise UsageError(f"texts[{i}] is empty (as classify refuses an empty row)")
    return texts


def check_flag(name: str, value) -> None:
    """A bool parameter, refused otherwise: a truthy string such as "no" would turn it on."""
    if not isinstance(value, bool):
        raise UsageError(
            f"{name}: expected True or False, got {type(value).__name__} {value!r}"[:200]
        )
