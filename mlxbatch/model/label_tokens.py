"""A label set's tokens, as the tokenizer gives them, refused where the labels could not be
scored apart (`engine.labels.check_names` checks the names before)."""

from __future__ import annotations

from ..errors import LabelError


def label_tokens(names: tuple[str, ...], encode, vocab_size: int) -> tuple[tuple[int, ...], ...]:
    """Each label's tokens (`encode`: PromptTokenizer.label), refusing two labels tokenized
    alike, one a token prefix of another, or a token outside the vocabulary."""
    tokens = tuple(tuple(encode(n)) for n in names)
    for a in range(len(names)):
        for b in range(len(names)):
            if a == b:
                continue
            ta, tb = tokens[a], tokens[b]
            if ta == tb:
                raise LabelError(f"labels {names[a]!r} and {names[b]!r} tokenize identically")
            if tb[: len(ta)] == ta:
                raise LabelError(
                    f"label {names[a]!r} is a token prefix of {names[b]!r}, so it would always "
                    "score at least as high; rename one of them"
                )
    bad = [n for n, t in zip(names, tokens) if max(t) >= vocab_size]
    if bad:
        raise LabelError(f"label(s) {bad} tokenize outside the model's vocabulary")
    return tokens
