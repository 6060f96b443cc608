"""The per-item token limit and the too-long policy: refuse the row, or keep the head and the
tail of its text (cut between characters) so that it fits the limit exactly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..api.classifier import Classifier
from ..io.inputs import Row

if TYPE_CHECKING:
    from .jobplan import JobSettings

MARK = " […] "


def truncate(clf: Classifier, text: str, limit: int) -> tuple[str, int] | None:
    """The longest head + tail of `text` (cut between characters, never inside one) whose fed
    tokens fit `limit`: (text, tokens); None when not even the marker alone fits."""
    engine = clf.engine

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


def item_limit(clf: Classifier, s: JobSettings, batch_tokens: int, ctx_limit: int) -> Limit:
    """The per-item limit on fed tokens and the setting that imposes it."""
    options = [(ctx_limit, "the model's context (max_position_embeddings)")]
    if s.max_tokens:
        options.append((s.max_tokens, f"--max-tokens {s.max_tokens}"))
    src = (f"--batch-tokens {batch_tokens}" if s.batch_tokens else
           f"the batch budget {batch_tokens} (what fits in memory with --max-batch {s.max_batch})")  # fmt: skip
    options.append((batch_tokens, src))
    tokens, source = min(options, key=lambda x: x[0])
    return Limit(tokens, source)


def apply_too_long(
    clf: Classifier, rows: list[Row], prompts: dict[int, list[int]], s: JobSettings, limit: Limit
) -> dict[int, dict]:
    """Apply the too-long policy to the tokenized rows, in place. Returns extras by index."""
    extras = {}
    for i, prompt in list(prompts.items()):
        n = len(clf.engine.fed(prompt))
        if n <= limit.tokens:
            continue
        where = f"over the limit of {limit.tokens} set by {limit.source}"
        if s.too_long == "error":
            rows[i].error = f"{n} tokens, {where} (see --max-tokens, --too-long)"
            del prompts[i]
            continue
        done = truncate(clf, rows[i].text, limit.tokens)
        if done is None:
            rows[i].error = f"{n} tokens, {where}, and too few tokens remain to truncate into"
            del prompts[i]
            continue
        text, m = done
        prompts[i] = clf.engine.prompt(text)
        extras[i] = {"truncated": {"from_tokens": n, "to_tokens": m}}
    return extras
