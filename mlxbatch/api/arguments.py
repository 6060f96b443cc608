"""The Python API's arguments checked by type before anything is loaded or scored: a
UsageError naming the argument, never a KeyError or AttributeError deep inside
(`Classifier.load` and `Classifier.classify` call these; the prompt's settings are checked
where they are built, engine/promptspec.py)."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path

from ..engine.promptspec import check_flag
from ..errors import UsageError, unicode_problem

__all__ = ["check_flag", "check_model_dir", "checked_texts"]


def check_model_dir(model_dir) -> None:
    if not isinstance(model_dir, (str, Path)):
        raise UsageError(f"model_dir: expected a path or hub id, got {type(model_dir).__name__}")


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
