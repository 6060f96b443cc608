"""A job's tokenizing: the scan's check of each row against the item limit, and the windows
tokenized ahead of the scoring, each row once where the input is one window."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ..api.classifier import Classifier
from ..api.limits import LIMIT_SETTINGS, prepare
from ..api.spec import Settings
from ..errors import flag, worded
from ..io.inputs import Row
from ..io.windows import JobInput, Scan, window_full


class WindowTokenizer:
    """A job's tokenizing: each window's rows once, ahead. A scan that refuses too-long rows
    first keeps its prompts for the window pass when the input is one window; a longer input
    is tokenized twice rather than held whole."""

    def __init__(self, window: int, window_chars: int | None):
        self.window, self.window_chars = window, window_chars
        self.kept: list | None = []  # the scan's (text, prompt) pairs while within one window
        self.chars = 0  # their texts' characters

    def scanned(self, texts: list[str], prompts: list[list[int]]) -> None:
        """Keep them while they may be the first window (the window pass checks that they are)."""
        if self.kept is not None:
            if self.kept and window_full(
                len(self.kept), self.chars, self.window, self.window_chars
            ):
                self.kept = None  # several windows: each is tokenized as it is read
                return
            self.kept += zip(texts, prompts)
            self.chars += sum(map(len, texts))

    def windows(self, clf: Classifier, job_input: JobInput, scanned: Scan):
        """(start, rows, good rows' prompts) a window at a time, the next tokenized in a thread."""
        kept, self.kept = self.kept, None

        def read(windows):
            item = next(windows, None)
            if item is None:
                return None
            start, rows = item
            good = [r.text for r in rows if not r.error]
            if kept and start == 0 and [text for text, _ in kept] == good:
                return start, rows, [prompt for _, prompt in kept]
            return start, rows, clf.engine.prompts(good)

        windows = job_input.windows(self.window, scanned, self.window_chars)
        with ThreadPoolExecutor(1, thread_name_prefix="mlxbatch-read") as pool:
            ahead = pool.submit(read, windows)
            while (item := ahead.result()) is not None:
                ahead = pool.submit(read, windows)
                yield item


def too_long(clf: Classifier, settings: Settings, tokens: WindowTokenizer):
    """Under --on-error fail with --too-long error, the scan's check of each row; else None."""
    spec = settings.spec
    if spec.on_error != "fail" or spec.too_long != "error":
        tokens.kept = None
        return None

    def refused(block: list[Row]) -> list[str | None]:
        good = [r for r in block if not r.error]
        texts = [r.text for r in good]
        prompts = clf.engine.prompts(texts)
        tokens.scanned(texts, prompts)
        made = iter(
            prepare(clf.engine, r.text, settings.limit, False, prompt=p)
            for r, p in zip(good, prompts)
        )
        fits = [None if r.error else next(made) for r in block]
        return [worded(f, flag, LIMIT_SETTINGS) if isinstance(f, str) else None for f in fits]

    return refused
