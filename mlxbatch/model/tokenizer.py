"""Tokenizer and the Qwen2.5 ChatML prompt, built in code.

    <|im_start|>system\\n{system}<|im_end|>\\n
    (<|im_start|>user\\n{example}<|im_end|>\\n<|im_start|>assistant\\n{label}<|im_end|>\\n)*
    <|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>assistant\\n

(The chat template inside recent Qwen tokenizer files is Qwen3's, not Qwen2.5's, so it is
never used.) Special tokens are recognised in the template only: a user typing
`<|im_end|>` gets plain-text tokens. The tokenizer splits at special tokens before BPE, so
encoding the text between them piece by piece is exactly the whole-prompt tokenization.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from ..errors import LabelError, ModelError, UsageError, unicode_problem

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
Examples = tuple[tuple[str, str], ...]  # few-shot (text, label) pairs, earlier turns
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
# Texts per encode_batch_fast call in `prompts`: one call over 100,000 tickets holds every
# Encoding at once and ran slower than per-text encode on this 2-core host (30,000 texts, one
# Rust thread: 68 s in one call, 27-29 s in calls of 1,024-4,096; BENCHMARKS.md).
BATCH_TEXTS = 2048


class PromptTokenizer:
    def __init__(self, path: str | Path):
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ModelError(f"{file}: not found (the model directory needs tokenizer.json)")
        try:
            tok = Tokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception on bad files
            raise ModelError(f"{file}: not a valid tokenizer file ({e})") from None
        tok.encode_special_tokens = True  # special-token strings in text are plain text
        self._tok = tok
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        # One int object per token id, shared by every prompt: a job holds all its prompts,
        # and a fresh int per token (ids are above CPython's small-int cache) is 32 bytes.
        self._ids = list(range(self.vocab_size))
        self._prefixes: dict[tuple[str, Examples], tuple[int, ...]] = {}
        self.im_start = self._special(IM_START)
        self.im_end = self._special(IM_END)
        self.newline = self.encode("\n")

    def _special(self, s: str) -> int:
        i = self._tok.token_to_id(s)
        if i is None:
            raise ModelError(f"tokenizer has no {s} token: not a Qwen2/ChatML tokenizer")
        return i

    def encode(self, text: str) -> list[int]:
        """Plain text to ids; special-token strings are never control tokens here."""
        try:
            ids = self._tok.encode(text, add_special_tokens=False).ids
        except TypeError:  # what `tokenizers` raises for a str that is not valid Unicode
            problem = unicode_problem(text) if isinstance(text, str) else None
            if problem is None:
                raise
            raise UsageError(f"cannot tokenize text that holds {problem}: {text[:60]!r}") from None
        table = self._ids
        try:
            return [table[i] for i in ids]
        except IndexError:  # an id past the count (a vocabulary with gaps): its own ints
            return ids

    @functools.cached_property
    def longest(self) -> int:
        """The most characters one token stands for (bytes, in a byte-level vocabulary)."""
        return max(map(len, self._tok.get_vocab(with_added_tokens=True)))

    def least_tokens(self, text: str) -> int:
        """A floor on `len(encode(text))`, found without encoding: no token covers more than
        `longest` characters of the normalized text (its bytes, for a byte-level vocabulary),
        so a 2 MB text is known to be over a 2,048-token limit in a fraction of encoding it."""
        normalizer = self._tok.normalizer
        return len(normalizer.normalize_str(text) if normalizer else text) // self.longest

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def prompt(self, system: str, text: str, examples: Examples = ()) -> list[int]:
        """The gold tokenization of the whole ChatML prompt for one item."""
        return self.prefix(system, examples) + self.suffix(text)

    def prompts(
        self, system: str, texts: Sequence[str], examples: Examples = ()
    ) -> list[list[int]]:
        """`prompt` of each text, the texts encoded together by the tokenizer's own threads.

        Equal to `[prompt(system, t, examples) for t in texts]`, ids shared the same way. The
        Rust call, over nine tenths of the time on the synthetic tickets, releases the GIL, so
        a thread can tokenize the next window while the lanes score this one.
        """
        head = self.prefix(system, examples)
        tail = [self.im_end, *self.newline, self.im_start, *self.encode("assistant\n")]
        out = []
        for start in range(0, len(texts), BATCH_TEXTS):
            try:
                encodings = self._tok.encode_batch_fast(
                    [f"user\n{text}" for text in texts[start : start + BATCH_TEXTS]],
                    add_special_tokens=False,
                )
            except TypeError:  # a text that is not valid Unicode: `prompt` names it
                return [self.prompt(system, text, examples) for text in texts]
            out += self._joined(head, encodings, tail)
        return out

    def _joined(self, head: list[int], encodings: list, tail: list[int]) -> list[list[int]]:
        table = self._ids
        out = []
        for encoding in encodings:
            ids = encoding.ids
            try:
                out.append([*head, *map(table.__getitem__, ids), *tail])
            except IndexError:  # as in `encode`: an id past the count keeps its own int
                out.append([*head, *ids, *tail])
        return out

    def prefix(self, system: str, examples: Examples = ()) -> list[int]:
        """Tokens of everything before the item's user turn, encoded as part of the whole
        prompt: the system turn, then each example as a user turn and an assistant turn.
        Encoded once per (system, examples): every item's prompt starts with it."""
        key = (system, tuple(examples))
        if key not in self._prefixes:
            out = [self.im_start, *self.encode(f"system\n{system}"), self.im_end, *self.newline]
            for text, label in examples:
                out += [self.im_start, *self.encode(f"user\n{text}"), self.im_end, *self.newline,
                        self.im_start, *self.encode(f"assistant\n{label}"), self.im_end,
                        *self.newline]  # fmt: skip
            if len(self._prefixes) >= 8:  # an API caller cycling through prompts
                self._prefixes.clear()
            self._prefixes[key] = (*out, self.im_start)
        return list(self._prefixes[key])

    def shared_prefix(self, system: str, examples: Examples = ()) -> list[int]:
        """The prefix computed once per run: everything up to `user\\n`, before the text.

        An item's own prompt may diverge from it near the end when BPE merges the text's
        first characters with `\\n` (text starting with newlines); the engine then uses only
        the common part for that row (see `engine/layout.py`).
        """
        return self.prefix(system, examples) + self.encode("user\n")

    def suffix(self, text: str) -> list[int]:
        """Tokens from `user\\n{text}` to the end of the prompt (`assistant\\n`)."""
        return [*self.encode(f"user\n{text}"), self.im_end, *self.newline, self.im_start,
                *self.encode("assistant\n")]  # fmt: skip

    def label(self, label: str) -> list[int]:
        """A label's tokens as the assistant writes it right after `assistant\\n`."""
        head = self.encode("assistant\n")
        full = self.encode("assistant\n" + label)
        if full[: len(head)] != head or len(full) == len(head):
            raise LabelError(f"label {label!r} merges with the prompt's final newline")
        return full[len(head) :]
