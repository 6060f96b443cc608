"""The errors a user can cause, each a one-line message naming the file, row or setting; the
CLI prints `error: <message>` and exits 2."""

from __future__ import annotations

from collections.abc import Callable


class UsageError(ValueError):
    """Bad input, settings, paths or checkpoints: the message says what and where.

    A message about a setting marks its name in backticks (`settings` lists which): it reads
    as the Python API's keyword (`prior`) until the entry that catches it words it for its
    reader with `worded` (the CLI's `--prior`), one wording for every check below."""

    def __init__(self, message: str = "", settings: tuple[str, ...] = ()):
        self.template, self.settings = message, tuple(settings)
        super().__init__(self._named(str))

    def _named(self, word: Callable[[str], str]) -> str:
        text = self.template
        for name in self.settings:
            text = text.replace(f"`{name}`", word(name))
        return text

    def worded(self, word: Callable[[str], str]) -> UsageError:
        """This error with its settings named by `word`; itself where it names none."""
        if not self.settings:
            return self
        return type(self)(self._named(word))


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
