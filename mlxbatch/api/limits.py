"""The per-item token limit and truncation: keep the head and the tail of a text (cut between
characters) so that its fed tokens fit the limit exactly. Pure given the engine's tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.engine import Engine

MARK = " […] "


def truncate(engine: Engine, text: str, limit: int) -> tuple[str, int] | None:
    """The longest head + tail of `text` (cut between characters, never inside one) whose fed
    tokens fit `limit`: (text, tokens); None when not even the marker alone fits."""

    def cut(k: int) -> str:
        return text[: k - k // 2] + MARK + (text[len(text) - k // 2 :] if k // 2 else "")

    def size(k: int) -> int:
        return len(engine.fed(engine.prompt(cut(k))))

    if size(0) > limit:
        return None
    lo, hi = 0, len(text)  # size(lo) fits; find the largest k that fits (sizes grow with k)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if size(mid) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return cut(lo), size(lo)


@dataclass(frozen=True)
class Limit:
    tokens: int
    source: str  # the setting it comes from, for messages


def context_limit(engine: Engine) -> int:
    """The most tokens an item can feed: the model's context less the prefix and the label."""
    fp = engine.footprint
    return engine.lm.model.args.max_position_embeddings - fp.prefix - fp.label_len


def item_limit(engine: Engine, max_tokens: int | None, budget: int | None = None,
               budget_source: str = "") -> Limit:  # fmt: skip
    """The per-item limit on fed tokens and the setting that imposes it: the model's context,
    `max_tokens`, and (where given) a batch budget an item must fit."""
    options = [(context_limit(engine), "the model's context (max_position_embeddings)")]
    if max_tokens:
        options.append((max_tokens, f"--max-tokens {max_tokens}"))
    if budget:
        options.append((budget, budget_source))
    tokens, source = min(options, key=lambda x: x[0])
    return Limit(tokens, source)


@dataclass(frozen=True)
class Fitted:
    """An item's prompt within the limit: the tokens, what it feeds, and how it was cut."""

    prompt: list[int]
    tokens: int  # fed beyond the shared prefix
    truncated: dict | None = None  # {"from_tokens", "to_tokens"} when cut


def fit(
    engine: Engine, text: str, limit: Limit, truncating: bool, prompt: list[int] | None = None
) -> Fitted | str:
    """`text`'s prompt (`prompt`, when already tokenized) within `limit`, or why it cannot be
    (a message naming the limit)."""
    prompt = engine.prompt(text) if prompt is None else prompt
    n = len(engine.fed(prompt))
    if n <= limit.tokens:
        return Fitted(prompt, n)
    where = f"over the limit of {limit.tokens} set by {limit.source}"
    if not truncating:
        return f"{n} tokens, {where} (see --max-tokens, --too-long)"
    done = truncate(engine, text, limit.tokens)
    if done is None:
        return f"{n} tokens, {where}, and too few tokens remain to truncate into"
    cut, m = done
    return Fitted(engine.prompt(cut), m, {"from_tokens": n, "to_tokens": m})
