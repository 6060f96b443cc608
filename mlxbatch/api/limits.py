"""From a text to the one item type: `prepare` tokenizes it once, holds it to the per-item
token limit, and truncates when asked (head and tail kept). Every entry prepares here."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from ..engine.engine import Engine
from ..engine.item import Item
from ..errors import ItemTooLong

MARK = " […] "


def truncate(engine: Engine, text: str, limit: int) -> tuple[str, int] | None:
    """The longest head + tail of `text` (cut between characters) whose fed tokens fit `limit`:
    (text, tokens); None when not one character fits beside the marker."""

    def cut(k: int) -> str:
        return text[: k - k // 2] + MARK + (text[len(text) - k // 2 :] if k // 2 else "")

    def size(k: int) -> int:
        piece = cut(k)
        if surely_over(engine, piece, limit):  # the search takes the same step, untokenized
            return limit + 1
        return len(engine.fed(tokenized(engine, piece)))

    if size(1) > limit:
        return None
    lo, hi = 0, len(text)  # size(lo) fits; find the largest k that fits (sizes grow with k)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if size(mid) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return cut(lo), size(lo)


def surely_over(engine: Engine, text: str, limit: int) -> bool:
    """True when `text` must feed over `limit` tokens, known without tokenizing it: the fed
    tokens cover all of the text (the shared prefix ends before it), so they are at least
    the tokenizer's floor for it."""
    return engine.tokenizer.least_tokens(text) > limit


def tokenized(engine: Engine, text: str) -> list[int]:
    """`engine.prompt(text)` through the batch call, which releases the GIL: a server's event
    loop goes on answering while a long text is tokenized in a worker thread."""
    return engine.prompts([text])[0]


# the settings the item limit and the memory check name (marked in their messages: `errors.worded`)
LIMIT_SETTINGS = ("max_tokens", "batch_tokens", "max_batch", "too_long")


@dataclass(frozen=True)
class Limit:
    tokens: int
    source: str  # what sets it, for messages; a setting marked as `errors.worded` reads it


def context_limit(engine: Engine) -> int:
    """The most tokens an item can feed: the model's context less the prefix and the label."""
    fp = engine.footprint
    return engine.lm.model.args.max_position_embeddings - fp.prefix - fp.label_len


def prepare(
    engine: Engine,
    text: str,
    limit: Limit,
    truncating: bool,
    key: Hashable = None,
    prompt: list[int] | None = None,
    hint: str = " (see `max_tokens`, `too_long`)",
) -> Item | str:
    """`text` as an item keyed `key`: its prompt (`prompt`, when already tokenized) within
    `limit`, or why it cannot be (a message naming the limit, then `hint`: how to get past it;
    its settings marked for the entry to word, `errors.worded`)."""
    where = f"over the limit of {limit.tokens} set by {limit.source}"
    if prompt is None and not truncating and surely_over(engine, text, limit.tokens):
        # refused without tokenizing (2 MB took seconds): the count is not needed to refuse
        return f"{len(text):,} characters: more than {limit.tokens} tokens, {where}{hint}"
    prompt = tokenized(engine, text) if prompt is None else prompt
    n = len(engine.fed(prompt))
    if n <= limit.tokens:
        return Item(key, prompt, n)
    if not truncating:
        return f"{n} tokens, {where}{hint}"
    done = truncate(engine, text, limit.tokens)
    if done is None:
        return f"{n} tokens, {where}, and too few tokens remain to truncate into"
    cut, m = done
    return Item(key, tokenized(engine, cut), m, {"from_tokens": n, "to_tokens": m})


def prepare_distinct(
    engine: Engine, texts: list[str], limit: Limit, truncating: bool
) -> tuple[list[Item], list[int]]:
    """The items of `texts`, one per distinct prompt (the same tokens give the same answer), keyed
    0, 1, ...; and the key whose answer each text takes. A text that cannot be an item is
    refused at its first place."""
    first: dict[str, int] = {}
    for i, text in enumerate(texts):
        first.setdefault(text, i)
    items, by_prompt, key_of = [], {}, {}
    for text, i in first.items():
        item = prepare(engine, text, limit, truncating, len(items))
        if isinstance(item, str):
            raise ItemTooLong(f"texts[{i}]: {item}", LIMIT_SETTINGS)
        key_of[text] = by_prompt.setdefault(tuple(item.prompt), item.key)
        if key_of[text] == item.key:
            items.append(item)
    return items, [key_of[text] for text in texts]
