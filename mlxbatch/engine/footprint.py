"""A job's memory footprint, derived once: what a batch budget costs and the default budget."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from ..model.config import ModelArgs
from ..model.hostops import BLOCK, EDGE, TILE
from ..runtime.memory import available_bytes
from .labels import LOGIT_COPIES, continuation_rows

MAX_BUDGET = 16384  # the largest default budget memory can justify
# The default padded-token cap per batch, so peak memory does not grow with the job: on a CPU
# lane 2,048 tokens make the fixed cost small; a GPU runs a batch on the whole device.
PREFERRED_BUDGET = {"cpu": 2048, "gpu": 4096}


def preferred_budget() -> int:
    """The preferred budget of the device MLX runs on."""
    return PREFERRED_BUDGET["cpu" if mx.default_device() == mx.cpu else "gpu"]


@dataclass(frozen=True)
class BudgetCost:
    kv_cache: int
    activations: int

    @property
    def total(self) -> int:
        return self.kv_cache + self.activations


@dataclass(frozen=True)
class Footprint:
    args: ModelArgs
    dtype_bytes: int
    weight_bytes: int
    prefix: int  # shared prefix tokens
    n_labels: int
    label_len: int  # tokens of the longest label
    lanes: int = 1  # batches in flight at once (CPU lanes)
    # several questions: their multi-token labels' earlier tokens, as slots of the text's own
    # row (question_engine.py) rather than a copy of the row per label
    segment_slots: int = 0

    @property
    def labels_copied(self) -> bool:
        """Whether a row's cache is copied once per label for its labels' later tokens (one
        label set of multi-token labels; questions hold them as segments of the row)."""
        return self.label_len > 1 and not self.segment_slots

    def context(self, longest: int) -> int:
        """The longest key length a row can have (prefix + item + label tokens)."""
        return self.prefix + longest + self.label_len

    def cost_of(self, batch) -> BudgetCost:
        """The transient bytes of one planned batch (`planner.Batch`)."""
        return self.batch_cost(batch.padded_tokens, len(batch.indices), batch.width)

    def batch_cost(self, batch_tokens: int, max_batch: int, longest: int) -> BudgetCost:
        """Upper bound on the transient bytes (KV cache, largest per-layer working set, label
        pass) of `lanes` batches of at most `max_batch` rows of `longest` tokens."""
        a, context = self.args, self.context(longest) + self.segment_slots
        max_batch = min(max_batch, batch_tokens)
        copied = self.labels_copied
        rows = max_batch * (self.n_labels if copied else 1)
        # key slots of one copy of the batch's rows: each row's prefix, label and segment slots,
        # and its own tokens, which all rows together hold at most `batch_tokens` of
        keys = max_batch * (context - longest) + min(max_batch * longest, batch_tokens)
        keys *= self.n_labels + 1 if copied else 1  # the rows' own cache outlives their copies
        kv = 2 * a.num_hidden_layers * keys * a.num_key_value_heads * a.head_dim
        kv *= self.dtype_bytes
        if self.segment_slots:  # one forward over the rows, their segments included
            positions = self.segment_slots
            t = batch_tokens + max_batch * positions
        else:  # the forward over the batch's tokens, then the one over its labels' earlier tokens
            positions = self.n_labels * max(self.label_len - 1, 0)  # later label tokens a row
            t = max(batch_tokens, max_batch * positions)
        mlp = 3 * t * a.intermediate_size * self.dtype_bytes
        attn = 3 * t * a.num_attention_heads * context * 4 + 5 * t * context  # + the masks
        hidden = 8 * t * a.hidden_size * self.dtype_bytes
        chunk = min(max_batch, continuation_rows(positions, a.vocab_size))
        head = LOGIT_COPIES * chunk * positions * a.vocab_size * 4  # (labels.py)
        # the host path pads each row's queries to whole tiles (host_attention): label rows
        # are nearly all padding, and their scores live about four times over (measured)
        depth, copies = max(a.head_dim, BLOCK), 4 if copied else 2
        pad = a.num_key_value_heads * (TILE + 2 * EDGE)
        pad *= (copies * keys + rows * (2 * depth + 1)) * 4
        return BudgetCost(kv * self.lanes, (mlp + attn + hidden + head + pad) * self.lanes)

    def longest_item(self, available: int, cap: int, share: float = 0.5) -> int:
        """The most fed tokens (at most `cap`) one item can have in `share` of free memory."""
        room = (available - self.weight_bytes) * share
        lo, hi = 0, cap
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.batch_cost(mid, 1, mid).total <= room:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def memory_budget(
        self, max_batch: int, longest: int, available: int | None = None, share: float = 0.5
    ) -> int:
        """The largest power-of-two budget (at most MAX_BUDGET) within `share` of memory, as
        few tokens as that takes (a plan raises a budget below its longest item to fit it)."""
        avail = (available if available is not None else available_bytes()) * share
        fits = MAX_BUDGET
        while fits > 1 and self.batch_cost(fits, max_batch, longest).total > avail:
            fits //= 2
        return fits

    def most_rows(self, max_batch: int, available: int | None = None, share: float = 0.5) -> int:
        """The most rows a batch may have (1 to `max_batch`) within `share` of memory, each row
        one token behind the prefix: only rows heavy with multi-token labels lower it."""
        avail = (available if available is not None else available_bytes()) * share
        rows = max_batch
        while rows > 1 and self.batch_cost(rows, rows, 1).total > avail:
            rows //= 2
        return rows

    def default_budget(
        self,
        max_batch: int,
        longest: int,
        available: int | None = None,
        share: float = 0.5,
        preferred: int | None = None,
    ) -> int:
        """`preferred` (None: as memory allows), raised to fit the longest item, in `share`."""
        fits = self.memory_budget(max_batch, longest, available, share)
        want = fits if preferred is None else min(preferred, fits)
        return max(want, min(longest, fits))
