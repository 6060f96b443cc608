"""Tokenizer and the prompt: the checkpoint's chat template (chat.py), else ChatML in code.

Whatever the template, an item's prompt is one `Frame`: the tokens before the item's text
(`head`, up to the last special token), the plain text around the text (`lead`, `trail`, BPE'd
together with it, as the whole prompt would be), and the tokens after (`tail`). The shared
prefix is `head` plus `lead`'s tokens. A checkpoint without a template gets ChatML in code:

    <|im_start|>system\n{system}<|im_end|>\n
    (<|im_start|>user\n{example}<|im_end|>\n<|im_start|>assistant\n{label}<|im_end|>\n)*
    <|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n

Special tokens are recognised in the template only. The tokenizer splits at added tokens
before BPE, so encoding the text between them piece by piece equals the whole prompt's tokens.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from ..errors import LabelError, ModelError, TemplateNote, UsageError, unicode_problem
from .chat import ChatTemplate, Split, read_template

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
Examples = tuple[tuple[str, str], ...]  # few-shot (text, label) pairs, earlier turns
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
# Texts per encode_batch_fast call: one call over a whole job holds every Encoding at once.
BATCH_TEXTS = 2048
# ...and at most about this many characters: an Encoding holds ~100 bytes a character
BATCH_CHARS = 1 << 20
# What an added token's lstrip/rstrip takes: tokenizers' `char::is_whitespace`, not str.strip's
WHITESPACE = (
    "\t\n\v\f\r \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + ("\u2028\u2029\u202f\u205f\u3000")
)


@dataclass(frozen=True)
class Frame:
    """One (system prompt, examples)'s prompt around an item's text (see the module docstring)."""

    head: tuple[int, ...]
    lead: str
    trail: str
    tail: tuple[int, ...]
    trim: tuple[bool, bool] = (False, False)  # the item's text stripped (left, right)
    # the run's whitespace taken by the special token before it (rstrip) or after (lstrip)
    absorbed: tuple[bool, bool] = (False, False)

    def text(self, text: str) -> str:
        """The plain run holding the item's text, as the whole prompt has it."""
        text = text.lstrip() if self.trim[0] else text
        run = self.lead + (text.rstrip() if self.trim[1] else text) + self.trail
        run = run.lstrip(WHITESPACE) if self.absorbed[0] else run
        return run.rstrip(WHITESPACE) if self.absorbed[1] else run


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
        tok = after_special(tok)
        tok.encode_special_tokens = True  # special-token strings in text are plain text
        self._tok = tok
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        # One shared int object per token id: a job holds all its prompts, a fresh int is 32 bytes
        self._ids = list(range(self.vocab_size))
        self._frames: dict[tuple[str, Examples], Frame] = {}
        added = {t.content: (i, t) for i, t in tok.get_added_tokens_decoder().items()}
        self._added = added
        self._added_re = re.compile(
            "|".join(re.escape(c) for c in sorted(added, key=len, reverse=True) if c) or "(?!)"
        )
        source, variables, where = read_template(path) if path.is_dir() else (None, {}, "")
        self.template = ChatTemplate(source, variables, where) if source else None
        self._splits: dict[int, Split] = {}
        self.newline = self.encode("\n")
        if self.template is None:  # ChatML in code needs its control tokens
            self.im_start, self.im_end = self._special(IM_START), self._special(IM_END)
            self.answer = "assistant\n"
        else:  # the ids, where the tokenizer has them (None otherwise)
            self.im_start, self.im_end = tok.token_to_id(IM_START), tok.token_to_id(IM_END)
            self.answer = self._answer()
            self._check_piecewise(file)
            for note in self.template.notes(self._split(0)):
                warnings.warn(note, TemplateNote, stacklevel=2)

    def _special(self, s: str) -> int:
        i = self._tok.token_to_id(s)
        if i is None:
            raise ModelError(
                f"tokenizer has no {s} token and the checkpoint no chat template: "
                "mlxbatch cannot build a prompt for it"
            )
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
        """A floor on `len(encode(text))`: no token covers more than `longest` characters."""
        normalizer = self._tok.normalizer
        return len(normalizer.normalize_str(text) if normalizer else text) // self.longest

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def prompt(self, system: str, text: str, examples: Examples = ()) -> list[int]:
        """The gold tokenization of the whole prompt for one item."""
        f = self.frame(system, examples)
        return [*f.head, *self.encode(f.text(text)), *f.tail]

    def prompts(
        self, system: str, texts: Sequence[str], examples: Examples = ()
    ) -> list[list[int]]:
        """`[prompt(system, t, examples) for t in texts]` in the tokenizer's threads (no GIL)."""
        f = self.frame(system, examples)
        head, tail = list(f.head), list(f.tail)
        out = []
        for chunk in _chunks(texts):
            try:
                encodings = self._tok.encode_batch_fast(
                    [f.text(text) for text in chunk], add_special_tokens=False
                )
            except TypeError:  # a text that is not valid Unicode: `prompt` names it
                return [self.prompt(system, text, examples) for text in texts]
            out += self._joined(head, encodings, tail)
            del encodings  # before the next chunk's are made
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

    def frame(self, system: str, examples: Examples = ()) -> Frame:
        """The prompt around the item for (system, examples): made once, every item uses it."""
        key = (system, tuple(examples))
        if key not in self._frames:
            if len(self._frames) >= 8:  # an API caller cycling through prompts
                self._frames.clear()
            self._frames[key] = (
                self._chatml(system, examples)
                if self.template is None
                else self._templated(system, examples)
            )
        return self._frames[key]

    def _chatml(self, system: str, examples: Examples) -> Frame:
        out = [self.im_start, *self.encode(f"system\n{system}"), self.im_end, *self.newline]
        for text, label in examples:
            out += [
                self.im_start,
                *self.encode(f"user\n{text}"),
                self.im_end,
                *self.newline,
                self.im_start,
                *self.encode(f"assistant\n{label}"),
                self.im_end,
                *self.newline,
            ]
        tail = (self.im_end, *self.newline, self.im_start, *self.encode("assistant\n"))
        return Frame((*out, self.im_start), "user\n", "", tail)

    def _split(self, n_examples: int) -> Split:
        if n_examples not in self._splits:
            self._splits[n_examples] = self.template.split(n_examples)
        return self._splits[n_examples]

    def _templated(self, system: str, examples: Examples) -> Frame:
        split = self._split(len(examples))
        contents = [system, *(x for pair in examples for x in pair), ""]
        self.template.check(split, contents)
        pieces = split.fill(contents)
        at = split.parts.index(split.item)
        before, after = self._segments(pieces[:at]), self._segments(pieces[at + 1 :])
        if after and isinstance(after[-1], str):  # its spaces go to each label (see `label`)
            after[-1] = after[-1].rstrip(" ")
        lead = before.pop() if before and isinstance(before[-1], str) else ""
        trail = after.pop(0) if after and isinstance(after[0], str) else ""
        absorbed = (
            not lead and self._strips(before[-1:], "rstrip"),
            not trail and self._strips(after[:1], "lstrip"),
        )
        return Frame(
            tuple(self._ids_of(before)),
            lead,
            trail,
            tuple(self._ids_of(after)),
            split.trim[split.item],
            absorbed,
        )

    def _strips(self, segments: list[str | int], side: str) -> bool:
        """Whether `segments` is one added token that strips whitespace on `side`."""
        if not segments or not isinstance(segments[0], int):
            return False
        token = self._tok.id_to_token(segments[0])
        return bool(token in self._added and getattr(self._added[token][1], side))

    def _check_piecewise(self, file: Path) -> None:
        """Refuse a tokenizer whose pieces do not add up to the whole prompt's tokens (a
        SentencePiece dummy prefix on each piece would not)."""
        import jinja2

        whole = Tokenizer.from_file(str(file))  # special-token strings are control tokens
        ours = self.prompt("Be brief.", "Hello world")  # the template is checked first
        try:
            text = self.template.render(
                [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hello world"},
                ]
            )
        except jinja2.exceptions.TemplateError:  # no system role: folded (see chat.py)
            text = self.template.render([{"role": "user", "content": "Be brief.\n\nHello world"}])
        text = text.rstrip(" ")  # the final spaces go to each label (see `label`)
        if whole.encode(text, add_special_tokens=False).ids != ours:
            raise ModelError(
                f"{file}: this tokenizer encodes a prompt differently in pieces "
                "than whole (a per-piece prefix?); mlxbatch cannot split its "
                "prompts at the item's text"
            )

    def _answer(self) -> str:
        """The plain text a label follows: the generation prompt's, after its last special."""
        split = self._split(0)
        at = split.parts.index(split.item)
        after = self._segments(split.fill(["", ""])[at + 1 :])
        return after[-1] if after and isinstance(after[-1], str) else ""

    def _segments(self, pieces: list[tuple[str, bool]]) -> list[str | int]:
        """Plain-text runs (str) and added-token ids (int): template text split at the added
        tokens it holds (whitespace they strip taken away), contents kept plain."""
        out: list[str | int] = []
        strip_next = False
        for text, is_template in pieces:
            chunks = self._added_re.split(text) if is_template else [text]
            found = self._added_re.findall(text) if is_template else []
            for k, chunk in enumerate(chunks):
                if strip_next:
                    chunk, strip_next = chunk.lstrip(), not chunk.strip()
                if chunk:
                    if out and isinstance(out[-1], str):
                        out[-1] += chunk
                    else:
                        out.append(chunk)
                if k < len(found):
                    i, token = self._added[found[k]]
                    if token.lstrip and out and isinstance(out[-1], str):
                        out[-1] = out[-1].rstrip()
                        if not out[-1]:
                            out.pop()
                    out.append(i)
                    strip_next = token.rstrip
        return out

    def _ids_of(self, segments: list[str | int]) -> list[int]:
        out: list[int] = []
        for s in segments:
            if isinstance(s, int):
                out.append(s)
            else:
                out += self.encode(s)
        return out

    def prefix(self, system: str, examples: Examples = ()) -> list[int]:
        """Tokens before the plain run that holds the item's text."""
        return list(self.frame(system, examples).head)

    def shared_prefix(self, system: str, examples: Examples = ()) -> list[int]:
        """Everything before the item's text, computed once per run. BPE may merge an item's
        first characters into its end; the engine then shares only the common part."""
        f = self.frame(system, examples)
        return [*f.head, *self.encode(f.lead)]

    def suffix(self, text: str, system: str = "", examples: Examples = ()) -> list[int]:
        """Tokens from the plain run holding `text` to the end of the prompt."""
        f = self.frame(system, examples)
        return [*self.encode(f.text(text)), *f.tail]

    def label(self, label: str) -> list[int]:
        """A label's tokens right after the generation prompt. Trailing spaces of the prompt
        begin each label (" billing" after "Category:"), as lm-evaluation-harness scores it."""
        answer = self.answer.rstrip(" ")
        head = self.encode(answer)
        full = self.encode(self.answer + label)
        if full[: len(head)] != head or len(full) == len(head):
            raise LabelError(f"label {label!r} merges with the prompt's final text {answer!r}")
        return full[len(head) :]


def after_special(tok: Tokenizer) -> Tokenizer:
    """`tok` as it encodes text that follows a special token, as every run of text in a prompt
    here does: Llama's SentencePiece `Metaspace` puts its "▁" only where the whole input
    begins (`prepend_scheme: first`), so a run encoded alone must not get one."""
    pre = tok.pre_tokenizer
    if pre is None or not _never_prepend(json.loads(pre.__getstate__())):  # its JSON alone
        return tok
    spec = json.loads(tok.to_str())
    _never_prepend(spec["pre_tokenizer"])
    return Tokenizer.from_str(json.dumps(spec))


def _never_prepend(node) -> bool:
    """Set every `Metaspace` under `node` that prepends at the input's start to never prepend;
    whether there was one."""
    if not isinstance(node, dict):
        return False
    found = node.get("type") == "Metaspace" and node.get("prepend_scheme") == "first"
    if found:
        node["prepend_scheme"] = "never"
    return any([found, *(_never_prepend(n) for n in node.get("pretokenizers") or [])])


def _chunks(texts: Sequence[str]):
    """`texts` in runs of at most BATCH_TEXTS texts and about BATCH_CHARS characters."""
    run, chars = [], 0
    for text in texts:
        if run and (len(run) == BATCH_TEXTS or chars >= BATCH_CHARS):
            yield run
            run, chars = [], 0
        run.append(text)
        chars += len(text)
    if run:
        yield run
