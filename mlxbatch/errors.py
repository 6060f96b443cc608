"""The errors a user can cause, each a one-line message naming the file, row or setting; the
CLI prints `error: <message>` and exits 2."""

from __future__ import annotations

import re
from collections.abc import Callable

# A setting in a message, as the Python API's keyword in backticks: `prior`, `max_tokens=7`.
SETTING = re.compile(r"`([a-z][a-z_]*)(?:=([^`]*))?`")
Word = Callable[..., str]  # (setting, value=None) -> how a reader types it


def keyword(setting: str, value: str | None = None) -> str:
    """A setting as the Python API takes it: `max_tokens=512` (the API's `truncate=True` is the
    CLI's `--too-long truncate`)."""
    if setting == "too_long":
        return "truncate" if value is None else f"truncate={value == 'truncate'}"
    return setting if value is None else f"{setting}={value}"


def flag(setting: str, value: str | None = None) -> str:
    """A setting as the CLI takes it: `--max-tokens 512`."""
    name = "--" + setting.replace("_", "-")
    return name if value is None else f"{name} {value}"


def worded(text: str, word: Word, settings: tuple[str, ...]) -> str:
    """`text` with each of `settings` marked in it named by `word`."""

    def say(m: re.Match) -> str:
        return word(m[1], m[2]) if m[1] in settings else m[0]

    return SETTING.sub(say, text)


class UsageError(ValueError):
    """Bad input, settings, paths or checkpoints: the message says what and where.

    A message about a setting marks it in backticks (`settings` lists which): it reads as the
    Python API's keyword (`prior`) until the entry that catches it words it for its reader with
    `worded` (the CLI's `--prior`), one wording for every check below."""

    def __init__(self, message: str = "", settings: tuple[str, ...] = ()):
        self.template, self.settings = message, tuple(settings)
        super().__init__(worded(message, keyword, self.settings))

    def worded(self, word: Word) -> UsageError:
        """This error with its settings named by `word`; itself where it names none."""
        if not self.settings:
            return self
        return type(self)(worded(self.template, word, self.settings))


class ModelError(UsageError):
    """A model directory, config or checkpoint that cannot be used."""


class InputError(UsageError):
    """The input cannot be read at all (missing file, empty, wrong CSV header, ...)."""


class LabelError(UsageError):
    """A label set that cannot be scored unambiguously."""


class JobError(UsageError):
    """A job that must stop before (or instead of) computing."""


class ResumeError(UsageError):
    """A journal that belongs to another run or cannot be used."""


class OutputError(UsageError):
    """An output path that cannot be written safely."""


def one_line(error: BaseException, most: int) -> str:
    """An exception's message on one line of at most `most` characters, to quote in ours."""
    return " ".join(str(error).split())[:most]


def unicode_problem(text: str) -> str | None:
    """Why `text` is not valid Unicode (a lone surrogate, from JSON's "\\ud800" or non-UTF-8
    arguments, which no tokenizer or UTF-8 output can take), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"a lone surrogate {text[e.start]!r} at character {e.start + 1} (not valid Unicode)"
    return None


class TemplateNote(UserWarning):
    """A chat template that runs, but unlike a usual chat prompt: the CLI prints a `note:`."""


class SyntheticWeights(UserWarning):
    """A model of random weights was loaded: its labels are at chance level."""


class ItemTooLong(UsageError):
    """One item over the per-item token limit, where truncation was not asked for."""
