"""The engine: a prompt, a label set and a model behind both scorers."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

import numpy as np
from mlx.utils import tree_flatten

from ..errors import JobError
from ..model.load import LoadedModel
from ..model.tokenizer import Examples
from ..runtime import executor as executors
from ..runtime import memory
from .adjust import CONTENT_FREE
from .footprint import Footprint, preferred_budget
from .labels import LabelSet
from .layout import split
from .planner import Batch
from .scorers import GoldScorer, PrefixScorer


class Engine:
    def __init__(
        self,
        lm: LoadedModel,
        labels: LabelSet,
        system_prompt: str,
        prefix_cache: bool = True,
        executor: executors.Executor | None = None,
        examples: Examples = (),
    ):
        self.lm, self.model, self.tokenizer = lm, lm.model, lm.tokenizer
        self.labels, self.system_prompt, self.examples = labels, system_prompt, tuple(examples)
        shared = self.tokenizer.shared_prefix(system_prompt, self.examples)
        context = lm.model.args.max_position_embeddings
        if len(shared) + labels.max_len >= context:  # before anything is computed with it
            what = (
                f"the system prompt and {len(self.examples)} examples"
                if examples
                else ("the system prompt")
            )
            raise JobError(
                f"the prompt before each item ({what}) is {len(shared):,} tokens: no "
                f"room left in the model's context of {context:,} tokens; use fewer "
                "or shorter examples, or a shorter system prompt"
            )
        self.prefix_cache = prefix_cache
        self.prefix = shared if prefix_cache else []
        executor = executor or executors.for_device()
        self.footprint = Footprint(
            lm.model.args,
            lm.dtype.size,
            sum(v.nbytes for _, v in tree_flatten(lm.model.parameters())),
            len(self.prefix),
            len(labels.names),
            labels.max_len,
            executor.lanes,
        )
        self._gold_lock = threading.Lock()  # the gold loop runs on the default stream
        self.scorers = self._scorers(labels, executor)

    def _scorers(self, labels: LabelSet, executor: executors.Executor) -> dict:
        return {
            "gold": GoldScorer(self.model, labels),
            "fast": PrefixScorer(self.model, labels, self.prefix, self.lm.dtype, executor),
        }

    def prompt(self, text: str) -> list[int]:
        """The gold tokenization of one item's whole prompt."""
        return self.tokenizer.prompt(self.system_prompt, text, self.examples)

    def prompts(self, texts: list[str]) -> list[list[int]]:
        """`prompt` of each text, encoded in one batch by the tokenizer's threads (no GIL)."""
        return self.tokenizer.prompts(self.system_prompt, texts, self.examples)

    def fed(self, prompt: list[int]) -> list[int]:
        """The tokens an item feeds through the model itself (its prompt minus the prefix)."""
        return split(prompt, self.prefix)[1]

    def fed_lengths(self, prompts: list[list[int]]) -> list[int]:
        return [len(self.fed(p)) for p in prompts]

    def content_free(self) -> tuple[float, ...]:
        """Average gold-loop label probabilities of the content-free inputs (see adjust.py)."""
        probs = np.stack([self.score_gold(self.prompt(t)) for t in CONTENT_FREE])
        return tuple(float(x) for x in probs.mean(axis=0))

    def score_batches(self, batches: list[list[list[int]]]) -> list[np.ndarray]:
        """Probabilities of several batches on the fast path, run as a job runs them."""
        self._keep_buffers([self._whole(p) for p in batches])
        return list(self.scorers["fast"].score_batches(batches))

    def _whole(self, prompts: list[list[int]]) -> Batch:
        """`prompts` as one planned batch (for its memory footprint)."""
        return Batch(tuple(range(len(prompts))), max(self.fed_lengths(prompts)))

    def _keep_buffers(self, batches: list[Batch]) -> None:
        """Keep the freed intermediates of the largest batch (one per lane) for the next ones,
        within what the batches leave of the available memory (kept buffers are not in the
        bound)."""
        if batches:
            costs = [self.footprint.cost_of(b) for b in batches]
            bound = self.footprint.weight_bytes + max(c.total for c in costs)
            room = max(0, memory.available_bytes() - bound)
            memory.keep_freed_buffers(min(max(c.activations for c in costs), room), room)

    def release_buffers(self) -> None:
        """Free the batch caches the fast path keeps between jobs (its weights stay)."""
        self.scorers["fast"].release_buffers()

    @property
    def lanes(self) -> int:
        """How many batches run at once on this device (CPU lanes; 1 on a GPU)."""
        return self.scorers["fast"].executor.lanes

    def score_gold(self, prompt: list[int]) -> np.ndarray:
        """(J,) probabilities of one prompt on the gold loop (one caller at a time)."""
        with self._gold_lock:
            return self.scorers["gold"].score_one(prompt)

    def default_budget(self, max_batch: int, longest: int) -> int:
        """The budget cap of either planner: the device's preferred budget (a CPU core's or a
        whole GPU's), raised to fit the longest item, within memory. The cost planner cuts by
        predicted time below it; greedy fills it."""
        return self.footprint.default_budget(max_batch, longest, preferred=preferred_budget())

    def cost_terms(self) -> tuple[int, int, int]:
        """What the cost model counts besides each batch's rows and width: the shared prefix
        tokens, and the multi-token label pass (rows per item, tokens per row; none when every
        label is one token)."""
        rows = len(self.labels.names) if self.labels.max_len > 1 else 0
        return len(self.prefix), rows, self.labels.max_len - 1

    def run(
        self, prompts: Mapping | list[list[int]], batches: list[Batch], scorer: str = "fast"
    ) -> Iterator[tuple[Batch, np.ndarray]]:
        """Score `batches` of `prompts` (indexed by the batches' indices), yielding (batch,
        probabilities) in order as each completes (the scheduler's `step` runs its batches
        here)."""
        self._keep_buffers(batches)
        results = self.scorers[scorer].score_batches(
            [prompts[i] for i in b.indices] for b in batches
        )
        try:
            yield from zip(batches, results)
        finally:
            results.close()  # stopped early: the lanes stop too
