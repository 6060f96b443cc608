"""The one item type: what every entry (a file row, an API text, an HTTP input) becomes before
it is scored, made once by `api.limits.prepare`."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    key: Hashable  # the caller's: a file row's index, a call's position, (request, index)
    prompt: list[int]  # the whole prompt's tokens (cut to the limit when truncated)
    fed: int  # tokens it feeds itself, beyond the shared prefix (what batches are cut by)
    truncated: dict | None = None  # {"from_tokens", "to_tokens"} when cut to fit
    duplicate_of: Hashable | None = None  # the key of an item with the same tokens (scored once)

    @property
    def shared(self) -> int:
        """Prompt tokens it takes from the shared prefix instead of computing them."""
        return len(self.prompt) - self.fed
